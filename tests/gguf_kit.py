"""Test-only GGUF files, written by the ``gguf`` package's own writer (real files, small).

``random_blocks(qtype, rows, cols, seed)``: valid raw blocks of any GGML type (random bytes, rows
redrawn until gguf's dequantiser gives finite values), for the types gguf cannot quantise.
``write_table_gguf``: one table tensor. ``write_engram_gguf``: a whole Engram checkpoint of a config
(tables quantised from seeded float rows, wkv/q/k F32, the constants in the metadata), with knobs to
spoil it (a wrong constant, a tensor left out, a wrong shape, a short table, other names).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, GGUFWriter, quants

from engram_viz.config import load_config
from engram_viz.core.schema import GGUF_NAMES, GGUF_TENSOR_ROLES, wkv_shape
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.weights.gguf_constants import expected_constants
from engram_viz.weights.gguf_export import CONSTANT_TYPES, GGUF_ARCH, SCALAR_ROLES

T = GGMLQuantizationType


def random_blocks(qtype: GGMLQuantizationType, rows: int, cols: int, seed: int = 0) -> np.ndarray:
    """uint8 ``[rows, cols / block * type_size]`` of random bytes whose rows all dequantise finite."""
    size, nbytes = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(rows, cols // size * nbytes), dtype=np.uint8)
    for _ in range(200):
        with np.errstate(invalid="ignore", over="ignore"):
            bad = ~np.isfinite(quants.dequantize(raw, qtype).reshape(rows, cols)).all(axis=1)
        if not bad.any():
            return raw
        raw[bad] = rng.integers(0, 256, size=(int(bad.sum()), raw.shape[1]), dtype=np.uint8)
    raise AssertionError(f"no finite random {qtype.name} blocks")


def _write(writer: GGUFWriter, path: Path) -> Path:
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def write_table_gguf(path: Path, name: str, blocks: np.ndarray, qtype: GGMLQuantizationType) -> Path:
    """A GGUF file holding one table tensor of raw ``blocks`` (uint8 ``[rows, row_bytes]``)."""
    writer = GGUFWriter(None, GGUF_ARCH)
    writer.add_tensor(name, blocks, raw_dtype=qtype)
    return _write(writer, path)


def _add_constants(writer: GGUFWriter, cfg, token_map: bool, wrong: dict) -> None:
    values = expected_constants(cfg, get_tokenizer(cfg).token_map if token_map else None)
    for role, value in values.items():
        v = np.array(value)
        if role in wrong:
            v[wrong[role][0]] = wrong[role][1]
        key = GGUF_NAMES[role].format(arch=GGUF_ARCH)
        if role in SCALAR_ROLES:
            writer.add_uint32(key, int(v[0]))
        else:
            writer.add_key_value(key, v.tolist(), GGUFValueType.ARRAY, sub_type=CONSTANT_TYPES[role])


def write_engram_gguf(
    path: Path,
    config: str = "tiny",
    qtype: GGMLQuantizationType = T.Q8_0,
    *,
    token_map: bool = False,
    wrong: dict | None = None,
    drop: tuple[str, ...] = (),
    shapes: dict | None = None,
    short_rows: int = 0,
    names: dict | None = None,
    seed: int = 0,
) -> Path:
    """An Engram checkpoint of ``config`` as GGUF. ``wrong`` {role: (index, value)} spoils a
    constant; ``drop`` leaves out tensors by name; ``shapes`` {name: shape} writes zeros of another
    shape; ``short_rows`` drops that many rows off each table; ``names`` {role: template} renames."""
    cfg = load_config(config)
    tmpl = GGUF_NAMES | (names or {})
    writer = GGUFWriter(None, GGUF_ARCH)
    writer.add_string(GGUF_NAMES["config"], json.dumps({k: v for k, v in cfg.to_dict().items() if k != "name"}))
    _add_constants(writer, cfg, token_map, wrong or {})
    rng = np.random.default_rng(seed)
    n, k = wkv_shape(cfg)
    for layer, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        t = {role: tmpl[role].format(layer=layer) for role in GGUF_TENSOR_ROLES}
        table = (rng.standard_normal((rows - short_rows, cfg.engram_head_dim)) * 0.05).astype(np.float32)
        arrays = {
            t["table_weight"]: (quants.quantize(table, qtype), qtype),
            t["wkv_weight"]: ((rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32), None),
            t["q_weight"]: (rng.standard_normal((cfg.hc_mult, cfg.dim)).astype(np.float32), None),
            t["k_weight"]: (np.ones((cfg.hc_mult, cfg.dim), np.float32), None),
        }
        for name, (arr, raw) in arrays.items():
            if name in drop:
                continue
            if name in (shapes or {}):
                arr, raw = np.zeros(shapes[name], np.float32), None
            writer.add_tensor(name, arr, raw_dtype=raw)
    if "token_embd.weight" not in drop:
        writer.add_tensor(
            "token_embd.weight",
            quants.quantize(rng.standard_normal((cfg.vocab_size, cfg.dim)).astype(np.float32) * 0.02, T.Q8_0),
            raw_dtype=T.Q8_0,
        )
    return _write(writer, path)
