"""EngramConfig: the fields of a model's ``config.json`` that the Engram path needs.

Two presets ship in ``data/configs``: ``v41-flash`` (DeepSeek-V4.1-Flash's own config) and
``tiny`` (small dims and a small table, same layout rules, so collisions show on small corpora).
Any other ``config.json`` (for example the one inside a checkpoint folder) loads by path.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

from engram_viz.errors import EngramVizError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CONFIG_DIR = DATA_DIR / "configs"
PRESETS = ("v41-flash", "tiny")

# TEXT = -1 in `token_types`; 0..3 mark the parts of an image span (reference section 6).
TEXT, IMAGE_START, IMAGE, IMAGE_NEWLINE, IMAGE_END = -1, 0, 1, 2, 3
FP8_BLOCK_SIZE = 32  # one e8m0 scale per 32 features (tables) or per 32 x 32 block (wkv)


class ConfigError(EngramVizError, ValueError):
    """A config file is missing, unreadable or inconsistent."""


@dataclass(frozen=True)
class EngramConfig:
    """The Engram-relevant part of a model config (names follow ``config.json``)."""

    name: str
    vocab_size: int
    dim: int
    hc_mult: int
    norm_eps: float
    engram_layer_ids: tuple[int, ...]
    engram_vocab_size: int
    engram_num_embeddings: tuple[int, ...]
    engram_max_ngram_size: int
    engram_pad_id: int
    engram_compressed_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    image_token_id: int
    n_layers: int
    vision_patch_size: int = 14
    vision_downsample_ratio: int = 3
    vision_max_n_token: int = 1024
    vision_min_pixels: int = 295936

    def __post_init__(self) -> None:
        if len(self.engram_num_embeddings) != len(self.engram_layer_ids):
            raise ConfigError(
                f"config {self.name!r}: engram_num_embeddings has {len(self.engram_num_embeddings)} "
                f"entries, expected one per engram layer ({len(self.engram_layer_ids)})"
            )
        if self.engram_head_dim % FP8_BLOCK_SIZE:
            raise ConfigError(
                f"config {self.name!r}: engram_head_dim={self.engram_head_dim} must be a multiple "
                f"of the fp8 block size {FP8_BLOCK_SIZE}"
            )
        if self.engram_max_ngram_size < 2:
            raise ConfigError(f"config {self.name!r}: engram_max_ngram_size must be >= 2")

    @property
    def n_engram_layers(self) -> int:
        return len(self.engram_layer_ids)

    @property
    def n_hash_cols(self) -> int:
        """Row ids per position and layer: (max_ngram_size - 1) n-gram orders x n_heads."""
        return (self.engram_max_ngram_size - 1) * self.engram_n_heads

    @property
    def ngram_orders(self) -> tuple[int, ...]:
        return tuple(range(2, self.engram_max_ngram_size + 1))

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict, name: str) -> EngramConfig:
        if not isinstance(raw, dict):
            raise ConfigError(f"config {name!r} must be a JSON object of fields, got {type(raw).__name__}")
        fields = cls.__dataclass_fields__
        required = [f for f, spec in fields.items() if f != "name" and spec.default is MISSING]
        missing = [f for f in required if f not in raw]
        if missing:
            raise ConfigError(f"config {name!r} lacks the Engram fields {missing}")
        kept = {k: _checked(name, k, fields[k].type, raw[k]) for k in fields if k in raw and k != "name"}
        return cls(name=name, **kept)

    @classmethod
    def from_json(cls, path: str | Path, name: str | None = None) -> EngramConfig:
        path = Path(path)
        if path.is_dir():
            path = path / "config.json"
        try:
            raw = json.loads(path.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except json.JSONDecodeError as err:
            raise ConfigError(f"config file {path} is not valid JSON: {err}") from None
        return cls.from_dict(raw, name or str(path))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _checked(name: str, field: str, kind: str, value: object) -> object:
    """``value`` of ``field`` as its annotated type (int, float or tuple of ints), or a ConfigError."""
    if kind == "tuple[int, ...]":
        if isinstance(value, (list, tuple)) and all(_is_int(v) for v in value):
            return tuple(value)
        expected = "a list of integers"
    elif kind == "int":
        if _is_int(value):
            return value
        expected = "an integer"
    elif kind == "float":
        if _is_int(value) or isinstance(value, float):
            return float(value)
        expected = "a number"
    else:
        return value
    raise ConfigError(f"config {name!r}: {field}={value!r} must be {expected}")


def match_preset(config: EngramConfig) -> EngramConfig:
    """A config equal to a preset in every field but its name becomes that preset (so a folder's
    ``config.json`` copied from ``tiny`` reads as ``tiny``, not as a path)."""
    mine = {k: v for k, v in config.to_dict().items() if k != "name"}
    for name in PRESETS:
        preset = load_config(name)
        if {k: v for k, v in preset.to_dict().items() if k != "name"} == mine:
            return preset
    return config


def load_config(name_or_path: str | Path | EngramConfig = "tiny") -> EngramConfig:
    """A preset name (``v41-flash``, ``tiny``), a ``config.json`` path or a checkpoint folder."""
    if isinstance(name_or_path, EngramConfig):
        return name_or_path
    if str(name_or_path) in PRESETS:
        return EngramConfig.from_json(CONFIG_DIR / f"{name_or_path}.json", name=str(name_or_path))
    path = Path(name_or_path)
    if not path.exists():
        raise ConfigError(f"unknown config {str(name_or_path)!r}: expected one of {PRESETS} or a path to a config.json")
    return EngramConfig.from_json(path)
