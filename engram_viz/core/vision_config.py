"""The config fields of the vision path (reference ``ModelArgs`` names; V4.1-Flash's ``config.json``).

A picture becomes ViT patches (``vision_patch_size`` pixels a side), runs through
``vision_n_layers`` ViT blocks of width ``vision_dim`` (``vision_n_heads`` heads, a SwiGLU MLP of
``vision_inter_dim``, 2-D RoPE at ``vision_rope_theta``), and the aligner merges
``vision_downsample_ratio`` x ``vision_downsample_ratio`` patches into one feature of the model
width ``dim``. ``vision_n_layers == 0`` is a model without a vision tower, as in the reference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from engram_viz.errors import ConfigError


@dataclass(frozen=True)
class VisionConfig:
    """The vision tower's fields; the defaults are V4.1-Flash's."""

    dim: int = 5120  # the model width the aligner projects into
    vision_n_layers: int = 32
    vision_dim: int = 1024
    vision_n_heads: int = 16
    vision_inter_dim: int = 2816
    vision_patch_size: int = 14
    vision_rope_theta: float = 10000.0
    vision_downsample_ratio: int = 3

    def __post_init__(self) -> None:
        for name in ("dim", "vision_dim", "vision_n_heads", "vision_inter_dim", "vision_patch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}={getattr(self, name)} must be at least 1")
        if self.vision_n_layers < 0 or self.vision_downsample_ratio < 1:
            raise ConfigError(
                f"vision_n_layers={self.vision_n_layers} must be at least 0 and "
                f"vision_downsample_ratio={self.vision_downsample_ratio} at least 1"
            )
        if self.vision_dim % self.vision_n_heads or self.head_dim % 4:
            raise ConfigError(
                f"vision_dim={self.vision_dim} must split into vision_n_heads={self.vision_n_heads} heads "
                "whose width is a multiple of 4 (2-D RoPE turns a height half and a width half)"
            )

    @property
    def enabled(self) -> bool:
        """The reference's ``vision_enabled``: a tower with at least one block."""
        return self.vision_n_layers > 0

    @property
    def head_dim(self) -> int:
        return self.vision_dim // self.vision_n_heads

    @property
    def patch_pixels(self) -> int:
        """Inputs of the patch embedding: 3 colours x patch x patch."""
        return 3 * self.vision_patch_size**2

    @classmethod
    def from_dict(cls, raw: dict, name: str = "config") -> VisionConfig:
        """The vision fields of a reference ``config.json`` (others ignored; absent ones keep the
        V4.1-Flash default)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{name} must be a JSON object, got {type(raw).__name__}")
        known = {f.name for f in fields(cls)}
        try:
            return cls(**{k: v for k, v in raw.items() if k in known})
        except TypeError as err:
            raise ConfigError(f"{name}: {err}") from None

    def to_dict(self) -> dict:
        return asdict(self)


V41_FLASH_VISION = VisionConfig()
