"""The checkpoint's tensor names, dtypes and shapes (reference section 4; no ``model.`` prefix).

Per Engram layer N:

=================================  ===========  ================================================
name                               dtype        shape
=================================  ===========  ================================================
``layers.N.engram.embed.weight``   F8_E4M3      ``[engram_num_embeddings[i], head_dim]``
``layers.N.engram.embed.scale``    F8_E8M0      ``[engram_num_embeddings[i], head_dim / 32]``
``layers.N.engram.wkv.weight``     F8_E4M3      ``[dim * (hc_mult + 1), n_hash_cols * head_dim]``
``layers.N.engram.wkv.scale``      F8_E8M0      ``[ceil(rows / 32), ceil(cols / 32)]``
``layers.N.engram.q_weight``       BF16         ``[hc_mult, dim]``
``layers.N.engram.k_weight``       BF16         ``[hc_mult, dim]``
``embed.weight``                   BF16         ``[vocab_size, dim]``
=================================  ===========  ================================================

The vision path's names (``vision.*``, ``aligner.*``, ``image_start`` / ``image_end`` /
``image_newline``) and shapes are in :func:`vision_tensors`.

Pure naming: no file is read here. ``SAFETENSORS_DTYPES`` maps the safetensors dtype strings to
the names of their torch dtypes and their sizes (names: this module imports no torch, so the
header readers and the corpus path do not either; ``safetensors.torch_dtype_of`` gives the dtype).
``GGUF_NAMES`` holds the names of the same tensors and of the Engram
constants in a GGUF file (llama.cpp's V4.1 converters), which a fork that names them otherwise
overrides through ``gguf_names``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from engram_viz.config import FP8_BLOCK_SIZE, EngramConfig
from engram_viz.core.vision_config import VisionConfig
from engram_viz.errors import InputError

# safetensors dtype string -> (torch dtype name, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "F8_E8M0": ("float8_e8m0fnu", 1),
}

EMBED_NAME = "embed.weight"
ENGRAM_RE = re.compile(r"^layers\.(\d+)\.engram\.")


def engram_names(layer_id: int) -> dict[str, str]:
    """The checkpoint names of one Engram layer's tensors, keyed by role."""
    p = f"layers.{layer_id}.engram."
    return {
        "table_weight": p + "embed.weight",
        "table_scale": p + "embed.scale",
        "wkv_weight": p + "wkv.weight",
        "wkv_scale": p + "wkv.scale",
        "q_weight": p + "q_weight",
        "k_weight": p + "k_weight",
    }


def wkv_shape(config: EngramConfig) -> tuple[int, int]:
    """``wkv`` is Linear(n_hash_cols * head_dim -> dim * (hc_mult + 1)): weight ``[N, K]``."""
    return config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim


def expected_tensors(config: EngramConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor the Engram path needs: name -> (safetensors dtype, shape)."""
    d, b = config.engram_head_dim, FP8_BLOCK_SIZE
    n, k = wkv_shape(config)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for layer_id, rows in zip(config.engram_layer_ids, config.engram_num_embeddings):
        names = engram_names(layer_id)
        out[names["table_weight"]] = ("F8_E4M3", (rows, d))
        out[names["table_scale"]] = ("F8_E8M0", (rows, d // b))
        out[names["wkv_weight"]] = ("F8_E4M3", (n, k))
        out[names["wkv_scale"]] = ("F8_E8M0", (-(-n // b), -(-k // b)))
        out[names["q_weight"]] = ("BF16", (config.hc_mult, config.dim))
        out[names["k_weight"]] = ("BF16", (config.hc_mult, config.dim))
    out[EMBED_NAME] = ("BF16", (config.vocab_size, config.dim))
    return out


def is_table_name(name: str) -> bool:
    """True for an Engram table tensor (``layers.N.engram.embed.weight`` / ``.scale``)."""
    return bool(ENGRAM_RE.match(name)) and name.endswith((".engram.embed.weight", ".engram.embed.scale"))


def is_engram_path_name(name: str) -> bool:
    """True for a tensor the Engram path reads: ``embed.weight`` or any ``layers.N.engram.*``."""
    return name == EMBED_NAME or bool(ENGRAM_RE.match(name))


def vision_tensors(cfg: VisionConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The vision tower, aligner and span delimiters (reference ``vision.py`` / ``Transformer``):
    name -> (safetensors dtype, shape). V4.1-Flash: 32 blocks of width vd = 1024, 16 heads, MLP 2816,
    patch 14 (588 = 3 x 14 x 14 inputs), downsample 3 (9 x 1024 aligner inputs), model width 5120.
    Linear weights and biases are bf16 as the reference holds them; RMSNorm weights are float32 there,
    stored here as F32 (a reader may also take BF16 and widen it).

    Verified against the reference (``inference/vision.py`` and ``model.py`` at DeepSeek-V4.1-Flash
    revision dba1be0a, as vendored in tenstorrent/tt-metal ``models/demos/deepseek_v3_d_p/reference/
    deepseek_v41``): every name is a parameter of ``Transformer`` with the vision path on
    (``self.vision = ViT``: ``patch_embed.proj``, ``blocks.{i}.norm1/attn.wqkv/attn.wo/norm2/mlp.w1/mlp.w2``,
    ``norm``; ``self.aligner = Aligner``: ``w1``, ``w2``; ``image_start`` / ``image_end`` / ``image_newline``);
    the shapes follow from those constructors and the released config.json; ``nn.Linear`` gives every
    projection a bias except the MLP's (``bias=False``); the module dtypes are bf16 (built under bf16
    default dtype, as generate.py does) with float32 RMSNorm weights. Checked once (2026-12-04) by building
    the reference's module tree at V4.1-Flash sizes on the meta device: the same 266 names, shapes and
    module dtypes as this function gives.
    Inferred, not verified (no released index or shard was read): that the checkpoint stores these tensors
    under exactly these names (as it stores the Engram tensors under their parameter names, reference
    section 4), and their dtypes in the file (a loader copies into the modules' dtypes, so BF16 or F32 both
    load)."""
    vd, d = cfg.vision_dim, cfg.dim
    out: dict[str, tuple[str, tuple[int, ...]]] = {
        "vision.patch_embed.proj.weight": ("BF16", (vd, cfg.patch_pixels)),
        "vision.patch_embed.proj.bias": ("BF16", (vd,)),
    }
    for i in range(cfg.vision_n_layers):
        p = f"vision.blocks.{i}."
        out[p + "norm1.weight"] = ("F32", (vd,))
        out[p + "attn.wqkv.weight"] = ("BF16", (3 * vd, vd))
        out[p + "attn.wqkv.bias"] = ("BF16", (3 * vd,))
        out[p + "attn.wo.weight"] = ("BF16", (vd, vd))
        out[p + "attn.wo.bias"] = ("BF16", (vd,))
        out[p + "norm2.weight"] = ("F32", (vd,))
        out[p + "mlp.w1.weight"] = ("BF16", (2 * cfg.vision_inter_dim, vd))
        out[p + "mlp.w2.weight"] = ("BF16", (vd, cfg.vision_inter_dim))
    out["vision.norm.weight"] = ("F32", (vd,))
    cells = vd * cfg.vision_downsample_ratio**2
    out["aligner.w1.weight"] = ("BF16", (d, cells))
    out["aligner.w1.bias"] = ("BF16", (d,))
    out["aligner.w2.weight"] = ("BF16", (d, d))
    out["aligner.w2.bias"] = ("BF16", (d,))
    for name in ("image_start", "image_end", "image_newline"):
        out[name] = ("BF16", (d,))
    return out


def is_vision_name(name: str) -> bool:
    """True for a tensor of the vision path (tower, aligner, span delimiters)."""
    return name.startswith(("vision.", "aligner.")) or name in ("image_start", "image_end", "image_newline")


# GGUF (llama.cpp's V4.1 converters): role -> name template; tensors take ``{layer}``, metadata keys
# ``{arch}`` (the file's ``general.architecture``). Shapes below are numpy order (GGUF lists dims
# reversed): the table ``[rows, head_dim]`` is GGUF ``[256, rows]``, wkv ``[N, K]``, q/k ``[hc, dim]``.
GGUF_NAMES: dict[str, str] = {
    "table_weight": "blk.{layer}.engram_embd.weight",  # [rows, head_dim], any GGUF type
    "wkv_weight": "blk.{layer}.engram_wkv.weight",  # [dim * (hc + 1), n_hash_cols * head_dim]
    "q_weight": "blk.{layer}.engram_q.weight",  # [hc, dim]
    "k_weight": "blk.{layer}.engram_k.weight",  # [hc, dim]
    "token_embedding": "token_embd.weight",  # [vocab_size, dim]
    "layer_ids": "{arch}.engram.layer_ids",
    "head_count": "{arch}.engram.head_count",
    "key_length": "{arch}.engram.key_length",
    "max_ngram_size": "{arch}.engram.max_ngram_size",
    "multipliers": "{arch}.engram.multipliers",  # [n_layers * max_ngram] flat
    "primes": "{arch}.engram.primes",  # [n_layers * (max_ngram - 1) * n_heads] flat
    "offsets": "{arch}.engram.offsets",  # [n_layers * n_hash_cols] flat
    "token_map": "{arch}.engram.token_map",  # [vocab_size] raw id -> compressed id
    "pad_id": "{arch}.engram.pad_id",  # a raw id
    "config": "engram_viz.config",  # the suite's config.json, in files the suite writes
}
GGUF_TENSOR_ROLES = ("table_weight", "wkv_weight", "q_weight", "k_weight")


def gguf_names(overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """``GGUF_NAMES`` with a fork's own templates put over it (the same roles, e.g.
    ``{"table_weight": "blk.{layer}.engram.table"}``); an unknown role raises ``InputError``."""
    names = dict(GGUF_NAMES)
    for role, template in (overrides or {}).items():
        if role not in GGUF_NAMES:
            raise InputError(f"GGUF name map: unknown role {role!r}; expected one of {sorted(GGUF_NAMES)}")
        if not isinstance(template, str) or not template:
            raise InputError(f"GGUF name map: role {role!r} needs a non-empty name template, got {template!r}")
        names[role] = template
    return names
