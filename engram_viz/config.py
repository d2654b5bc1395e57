"""EngramConfig: the fields of a model's ``config.json`` that the Engram path needs.

Two presets ship in ``data/configs``: ``v41-flash`` (DeepSeek-V4.1-Flash's own config) and
``tiny`` (small dims and a small table, same layout rules, so collisions show on small corpora).
Any other ``config.json`` (for example the one inside a checkpoint folder) loads by path.
"""

from __future__ import annotations

import json
from dataclasses import MISSING, asdict, dataclass
from pathlib import Path

from engram_viz.errors import ConfigError

DATA_DIR = Path(__file__).resolve().parent.parent / "data"
CONFIG_DIR = DATA_DIR / "configs"
PRESETS = ("v41-flash", "tiny")

# TEXT = -1 in `token_types`; 0..3 mark the parts of an image span (reference section 6).
TEXT, IMAGE_START, IMAGE, IMAGE_NEWLINE, IMAGE_END = -1, 0, 1, 2, 3
FP8_BLOCK_SIZE = 32  # one e8m0 scale per 32 features (tables) or per 32 x 32 block (wkv)


# fields that count something: at least 1
_POSITIVE = (
    "vocab_size",
    "dim",
    "hc_mult",
    "n_layers",
    "engram_vocab_size",
    "engram_compressed_vocab_size",
    "engram_n_heads",
    "engram_head_dim",
    "vision_patch_size",
    "vision_downsample_ratio",
)


# fields that size something: at most this (value, why). The layout keeps row ids, offsets and the
# hash in int64 (reference section 2), draws one prime per (engram layer, order, head) and the forward
# holds n_hash_cols x head_dim features a position; the bounds leave room far past V4.1-Flash
# (16,000,000 buckets, 8 heads, 4-grams, head_dim 256) while every layout builds in about a second.
_AT_MOST = {
    "vocab_size": (2**31 - 1, "token ids are int32 in the tokenizer"),
    "dim": (2**16, "the model width"),
    "hc_mult": (64, "the residual streams"),
    "n_layers": (4096, "the model depth"),
    "engram_vocab_size": (2**40, "buckets a column: the rows of all columns must stay far inside int64"),
    "engram_compressed_vocab_size": (2**31 - 1, "compressed ids x odd multipliers must fit int64"),
    "engram_max_ngram_size": (16, "n-gram orders 2..16, the reference uses 4"),
    "engram_n_heads": (64, "hash heads per order, the reference uses 8"),
    "engram_head_dim": (4096, "features a table row, the reference uses 256"),
    "vision_patch_size": (1024, "pixels a patch side"),
    "vision_downsample_ratio": (64, "patches merged a side"),
    "vision_max_n_token": (2**20, "tokens an image span"),
    "vision_min_pixels": (2**40, "pixels an image"),
}
MAX_ENGRAM_LAYERS = 64  # engram_layer_ids entries: one table (and one set of primes) each
MAX_HASH_COLS = 256  # (max_ngram_size - 1) x n_heads: row ids a position and layer (the reference: 24)
MAX_ROWS = 2**62  # rows a table (engram_num_embeddings): row ids and offsets are int64


def _require(config: EngramConfig, field: str, ok: bool, expected: str) -> None:
    if not ok:
        raise ConfigError(f"config {config.name!r}: {field}={getattr(config, field)!r} {expected}")


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
    vision_max_wh_ratio: float | None = None  # null for V4.1-Flash: no cap on width / height

    def __post_init__(self) -> None:
        """Every field in range and consistent with the others (the primes' check needs the layout:
        ``core.layout.EngramLayout.check_against_config``, run by every hasher)."""
        for field in _POSITIVE:
            _require(self, field, getattr(self, field) >= 1, "must be at least 1")
        for field, (bound, why) in _AT_MOST.items():
            _require(self, field, getattr(self, field) <= bound, f"must be at most {bound:,}: {why}")
        _require(self, "vision_max_n_token", self.vision_max_n_token >= 4, "must be at least 4 (a 1x1 image span)")
        _require(self, "vision_min_pixels", self.vision_min_pixels >= 0, "must be at least 0")
        _require(self, "norm_eps", 0 < self.norm_eps < float("inf"), "must be a positive finite number")
        _require(
            self,
            "vision_max_wh_ratio",
            self.vision_max_wh_ratio is None or self.vision_max_wh_ratio > 0,
            "must be null or a positive number",
        )
        for field in ("engram_pad_id", "image_token_id"):
            value = getattr(self, field)
            _require(self, field, 0 <= value < self.vocab_size, f"must be a raw token id in 0..{self.vocab_size - 1}")
        _require(
            self,
            "engram_compressed_vocab_size",
            self.engram_compressed_vocab_size <= self.vocab_size,
            f"must be at most vocab_size={self.vocab_size} (raw ids merge, never split)",
        )
        ids = self.engram_layer_ids
        _require(self, "engram_layer_ids", len(ids) >= 1 and len(set(ids)) == len(ids), "must list distinct layers")
        _require(
            self,
            "engram_layer_ids",
            len(ids) <= MAX_ENGRAM_LAYERS,
            f"must list at most {MAX_ENGRAM_LAYERS} layers (got {len(ids)})",
        )
        _require(
            self,
            "engram_layer_ids",
            all(0 <= n < self.n_layers for n in ids),
            f"must be layer ids in 0..n_layers-1 = 0..{self.n_layers - 1}",
        )
        if len(self.engram_num_embeddings) != len(ids):
            raise ConfigError(
                f"config {self.name!r}: engram_num_embeddings has {len(self.engram_num_embeddings)} "
                f"entries, expected one per engram layer ({len(ids)})"
            )
        _require(
            self,
            "engram_num_embeddings",
            all(1 <= n <= MAX_ROWS for n in self.engram_num_embeddings),
            f"must be positive row counts of at most {MAX_ROWS:,} (row ids are int64)",
        )
        if self.engram_head_dim % FP8_BLOCK_SIZE:
            raise ConfigError(
                f"config {self.name!r}: engram_head_dim={self.engram_head_dim} must be a multiple "
                f"of the fp8 block size {FP8_BLOCK_SIZE}"
            )
        if self.engram_max_ngram_size < 2:
            raise ConfigError(f"config {self.name!r}: engram_max_ngram_size must be >= 2")
        if self.n_hash_cols > MAX_HASH_COLS:
            raise ConfigError(
                f"config {self.name!r}: (engram_max_ngram_size - 1) x engram_n_heads = {self.n_hash_cols:,} hash "
                f"columns must be at most {MAX_HASH_COLS} (row ids a position and layer; the reference has 24)"
            )

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
        """The fields as a dict; ``vision_max_wh_ratio`` only when set, so a config without it has
        the dict (and the digests made from it, e.g. cache folder names) it had before the field."""
        out = asdict(self)
        if out["vision_max_wh_ratio"] is None:
            del out["vision_max_wh_ratio"]
        return out

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
            raw = json.loads(path.read_bytes().decode("utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config file {path} does not exist") from None
        except OSError as err:
            raise ConfigError(f"config file {path} cannot be read: {err.strerror or err}") from None
        except UnicodeDecodeError as err:
            raise ConfigError(f"config file {path} is not UTF-8 text (byte offset {err.start})") from None
        except (ValueError, RecursionError) as err:  # JSONDecodeError, or an integer of over 4,300 digits
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
    elif kind in ("float", "float | None"):
        if value is None and kind == "float | None":
            return None
        if _is_int(value) or isinstance(value, float):
            return float(value)
        expected = "a number" if kind == "float" else "a number or null"
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
