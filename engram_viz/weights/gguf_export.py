"""Write a checkpoint's Engram as a GGUF file with the ``gguf`` package's own writer.

``export_gguf(source, out, table_type)`` writes what a V4.1 converter writes for the Engram path:
per layer the table ``blk.{L}.engram_embd.weight`` quantised to ``table_type`` by gguf's quantiser
(Q8_0, Q4_0/1, Q5_0/1, MXFP4, TQ1_0/2_0, BF16, F16, F32; gguf has none for the K- and IQ-types),
wkv, q and k as F32 (the fp8 values exactly), and the Engram constants in the metadata (names in
``core/schema.GGUF_NAMES``), plus the suite's ``config.json``. A tiny Engram LM folder also
gets its own tensors (``tiny.*``, F32 from bf16 exactly; ``tiny.embed.raw_ids`` I64), so the file
alone runs the whole tiny LM. The file is written atomically (``_files.atomic_path``).

Quantising a table reads it whole: meant for the tiny LM (a few MB), never for the 98 GB tables.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from engram_viz._files import atomic_path
from engram_viz.config import EngramConfig
from engram_viz.core import fp8
from engram_viz.core.schema import GGUF_NAMES, GGUF_TENSOR_ROLES
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError
from engram_viz.weights.checkpoint import Checkpoint, open_checkpoint
from engram_viz.weights.gguf_constants import expected_constants
from engram_viz.weights.gguf_file import check_quantiser, encode_blocks
from engram_viz.weights.rows import COMPILED_MIN_ROWS
from engram_viz.weights.tables import EngramTable
from engram_viz.weights.tiny_folder import checkpoint_label, is_tiny_lm_folder, read_lm_tensors, read_tiny_config

GGUF_ARCH = "deepseek41"
# table rows quantised per step: contiguous rows are one read, below the size that starts the compiled kernel
EXPORT_CHUNK_ROWS = COMPILED_MIN_ROWS - 1
CONSTANT_TYPES = {  # role -> GGUF array element type, as the converters write them
    "layer_ids": GGUFValueType.INT32,
    "multipliers": GGUFValueType.INT64,
    "primes": GGUFValueType.UINT64,
    "offsets": GGUFValueType.INT64,
    "token_map": GGUFValueType.INT32,
}
SCALAR_ROLES = ("head_count", "key_length", "max_ngram_size", "pad_id")


def qtype_of(name: str | GGMLQuantizationType) -> GGMLQuantizationType:
    """A GGML type by name (``"Q8_0"``), case-insensitive; ``CheckpointError`` naming the known ones."""
    if isinstance(name, GGMLQuantizationType):
        return name
    try:
        return GGMLQuantizationType[str(name).upper()]
    except KeyError:
        known = ", ".join(t.name for t in GGMLQuantizationType)
        raise CheckpointError(f"unknown GGML type {name!r}; expected one of {known}") from None


def table_blocks(table: EngramTable, qtype: GGMLQuantizationType) -> np.ndarray:
    """Every row of ``table`` (decoded to float32) quantised to ``qtype``: uint8 ``[rows, row_bytes]``."""
    parts = []
    for a in range(0, table.num_rows, EXPORT_CHUNK_ROWS):
        ids = torch.arange(a, min(a + EXPORT_CHUNK_ROWS, table.num_rows))
        parts.append(encode_blocks(table(ids).float().numpy(), qtype, table.label))
    return np.concatenate(parts)


def _add_constants(writer: GGUFWriter, cfg: EngramConfig) -> None:
    values = expected_constants(cfg, get_tokenizer(cfg).token_map)
    for role, vtype in CONSTANT_TYPES.items():
        writer.add_key_value(
            GGUF_NAMES[role].format(arch=GGUF_ARCH), values[role].tolist(), GGUFValueType.ARRAY, sub_type=vtype
        )
    for role in SCALAR_ROLES:
        writer.add_uint32(GGUF_NAMES[role].format(arch=GGUF_ARCH), int(values[role][0]))


def _add_engram(writer: GGUFWriter, ckpt: Checkpoint, qtype: GGMLQuantizationType) -> None:
    for layer_id, w in ckpt.layers.items():
        names = {role: GGUF_NAMES[role].format(layer=layer_id) for role in GGUF_TENSOR_ROLES}
        blocks = table_blocks(w.table, qtype)
        writer.add_tensor(names["table_weight"], blocks, raw_dtype=qtype)
        wkv = w.wkv_weight.float() if w.wkv_scale is None else fp8.dequantize_blocks(w.wkv_weight, w.wkv_scale)
        writer.add_tensor(names["wkv_weight"], wkv.numpy().astype(np.float32))
        writer.add_tensor(names["q_weight"], w.q_weight.float().numpy())
        writer.add_tensor(names["k_weight"], w.k_weight.float().numpy())


def export_gguf(source: str | Path | Checkpoint, out: str | Path, table_type: str = "Q8_0") -> Path:
    """Write ``source`` (a checkpoint folder or an opened one; a tiny LM folder runs whole from the
    file) as the GGUF file ``out`` with its tables in ``table_type``. Returns ``out``."""
    qtype = qtype_of(table_type)
    check_quantiser(qtype, f"GGUF export to {out}")
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source)
    folder = ckpt.path if ckpt.path is not None and is_tiny_lm_folder(ckpt.path) else None
    raw = read_tiny_config(folder) if folder is not None else dict(ckpt.config.to_dict())
    raw.pop("name", None)
    raw["label"] = f"{checkpoint_label(folder) if folder is not None else ckpt.label}, tables as GGUF {qtype.name}"
    writer = GGUFWriter(None, GGUF_ARCH)
    writer.add_string(GGUF_NAMES["config"], json.dumps(raw))
    _add_constants(writer, ckpt.config)
    _add_engram(writer, ckpt, qtype)
    if folder is not None:
        for name, t in read_lm_tensors(folder).items():
            arr = t.numpy() if t.dtype == torch.int64 else t.float().numpy()
            writer.add_tensor(name, arr)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as tmp:
        writer.write_header_to_file(tmp)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
    return out
