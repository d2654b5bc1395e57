"""Helpers of the weights-layer tests: byte views, folder listings, a small table file, and the
small conveniences only tests need (an in-memory row source, opening a table by tensor names,
a checkpoint's plain-JSON description)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from engram_viz.core import fp8
from engram_viz.core.schema import SAFETENSORS_DTYPES, engram_names
from engram_viz.weights.checkpoint import Checkpoint
from engram_viz.weights.rows import RowSource, take_rows
from engram_viz.weights.scan import scan_checkpoint
from engram_viz.weights.tables import EngramTable

SHARD = "model-{:05d}-of-00003.safetensors"  # the synthetic hf layout's shards
V41_ROWS = 384_016_682  # layer 14's table, the larger one
TORCH_TO_SAFETENSORS = {getattr(torch, dt): name for name, (dt, _) in SAFETENSORS_DTYPES.items()}


def raw(t: torch.Tensor) -> torch.Tensor:
    """The bytes of a tensor (fp8 compares bit for bit this way)."""
    return t.contiguous().view(torch.uint8)


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def listing(folder: Path) -> dict:
    """Every file under the folder's parent with size and mtime: detects partial files and changes."""
    return {
        str(p.relative_to(folder.parent)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.parent.rglob("*")
    }


def all_tensors(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Every Engram-path tensor of an opened checkpoint, read back through its public interfaces."""
    out = {}
    for layer_id, w in ckpt.layers.items():
        names = engram_names(layer_id)
        out[names["table_weight"]], out[names["table_scale"]] = w.table.gather_fp8(torch.arange(w.table.num_rows))
        out[names["wkv_weight"]], out[names["wkv_scale"]] = w.wkv_weight, w.wkv_scale
        out[names["q_weight"]], out[names["k_weight"]] = w.q_weight, w.k_weight
    out["embed.weight"] = ckpt.embed.rows(torch.arange(ckpt.embed.num_rows))
    return out


def write_tiny_table(folder: Path) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A 5,000 x 64 table written by the safetensors library (an independent writer)."""
    g = torch.Generator().manual_seed(0)
    w, s = fp8.quantize_rows(torch.randn(5000, 64, generator=g) * 3)
    path = folder / "table.safetensors"
    extra = torch.randn(7, 5, generator=g).to(torch.bfloat16)
    save_file(
        {"other": extra, "t.weight": w, "t.scale": s, "emb": torch.randn(300, 48, generator=g).bfloat16()}, str(path)
    )
    return path, w, s


class TensorRows(RowSource):
    """Rows of an in-memory 2D tensor."""

    def __init__(self, tensor: torch.Tensor, label: str = "in-memory tensor"):
        if tensor.dim() != 2:
            raise ValueError(f"{label}: expected a 2D tensor, got shape {list(tensor.shape)}")
        self.tensor = tensor
        self.num_rows, self.cols = tensor.shape
        self.dtype = tensor.dtype
        self.label = label

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        idx = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.tensor.device)
        return take_rows(self.tensor, idx).cpu()


def _table_desc(t: EngramTable) -> dict:
    return {
        "rows": t.num_rows,
        "head_dim": t.head_dim,
        "kind": type(t).__name__,
        "label": t.label,
        "synthetic": t.synthetic,
    }


def describe_checkpoint(ckpt: Checkpoint) -> dict:
    """Plain-JSON provenance and shapes of an opened checkpoint."""
    return {
        "label": ckpt.label,
        "synthetic": ckpt.synthetic,
        "path": str(ckpt.path) if ckpt.path else None,
        "layout": ckpt.layout,
        "config": ckpt.config.name,
        "tokenizer": str(ckpt.tokenizer_path) if ckpt.tokenizer_path else None,
        "layers": {
            str(lid): {
                "table": _table_desc(w.table),
                "wkv_weight": list(w.wkv_weight.shape),
                "wkv_scale": list(w.wkv_scale.shape),
                "q_weight": list(w.q_weight.shape),
                "k_weight": list(w.k_weight.shape),
            }
            for lid, w in ckpt.layers.items()
        },
        "embed": {"rows": ckpt.embed.num_rows, "dim": ckpt.embed.dim, "label": ckpt.embed.label},
    }


def tensor_info(folder: Path, name: str, part: int = 0):
    """Where tensor ``name`` (part ``part`` in the mp layout) of a checkpoint folder lies: file and
    absolute byte offsets."""
    return scan_checkpoint(folder).tensors[name].parts[part]


def poke(folder: Path, name: str, row: int, values: bytes, col_byte: int = 0, part: int = 0) -> Path:
    """Overwrite bytes of row ``row`` of tensor ``name`` in place (from byte ``col_byte`` of the row);
    returns the file written. A test's way to plant NaN bytes in a real checkpoint file."""
    info = tensor_info(folder, name, part)
    row_bytes = info.nbytes // info.shape[0]
    fd = os.open(info.path, os.O_WRONLY)
    try:
        os.pwrite(fd, values, info.start + row * row_bytes + col_byte)
    finally:
        os.close(fd)
    return info.path
