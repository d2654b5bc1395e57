"""A tiny Engram LM folder as the weights layer sees it: its files, its label, its compact embedding.

The folder (written by ``engram_viz.tiny.files.save_tiny_model``; ``data/tiny-engram`` is the
committed one) holds ``config.json`` with a ``tiny_lm`` section, an HF-style index and two shards:
``LM_SHARD`` (the LM's own bf16 tensors under ``tiny.``, among them the small embedding
``tiny.embed.weight`` ``[V, dim]`` and ``tiny.embed.raw_ids`` ``[V]``) and ``ENGRAM_SHARD`` (the
Engram tensors under the real checkpoint's names and dtypes). It opens as a suite ``Checkpoint``
whose token embedding is :func:`compact_token_embedding`. Its files are read by the same validated
reader as any checkpoint (``index.py``, ``safetensors.py``, ``finite.py``): a damaged file raises a
``CheckpointError`` naming it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from engram_viz.config import load_config
from engram_viz.errors import CheckpointError
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.index import INDEX_FILE, read_weight_map
from engram_viz.weights.nonfinite import read_checked
from engram_viz.weights.rows import RowSource
from engram_viz.weights.safetensors import read_safetensors_header
from engram_viz.weights.tiny_folder_files import (
    DEFAULT_DIR,
    ENGRAM_SHARD,
    LM_PREFIX,
    LM_SHARD,
    checkpoint_label,
    is_tiny_lm_folder,
    read_tiny_config,
)

# the folder's names live in tiny_folder_files (no torch); they are read from here too
__all__ = [
    "DEFAULT_DIR",
    "ENGRAM_SHARD",
    "LM_PREFIX",
    "LM_SHARD",
    "check_raw_ids",
    "checkpoint_label",
    "compact_embedding",
    "compact_token_embedding",
    "is_tiny_lm_folder",
    "read_lm_tensors",
    "read_tiny_config",
]


def read_lm_tensors(path: str | Path, names: tuple[str, ...] | None = None) -> dict[str, torch.Tensor]:
    """The LM's own tensors (``tiny.*``, or only ``names``) listed in the folder's index, each read by
    the validated reader and checked finite (the whole LM is a few MB)."""
    path = Path(path)
    index = path / INDEX_FILE
    weight_map = {n: p for n, p in read_weight_map(path, index).items() if n.startswith(LM_PREFIX)}
    if names is not None:
        missing = [n for n in names if n not in weight_map]
        if missing:
            raise CheckpointError(f"{index}: tensor {missing[0]!r} not listed (a tiny LM folder needs it)")
        weight_map = {n: weight_map[n] for n in names}
    headers = {p: read_safetensors_header(p) for p in sorted(set(weight_map.values()))}
    out = {}
    for name, shard in weight_map.items():
        info = headers[shard].tensors.get(name)
        if info is None:
            raise CheckpointError(f"{shard}: tensor {name!r} not found, although {index.name} places it in this shard")
        out[name] = read_checked(info)
    return out


def check_raw_ids(raw_ids: torch.Tensor, rows: int, vocab: int, where: str) -> np.ndarray:
    """``tiny.embed.raw_ids`` as numpy: int64 ``[rows]``, entry 0 the unknown row, the rest raw ids in
    ``0..vocab-1``; a ``CheckpointError`` naming ``where`` otherwise."""
    ids = raw_ids.numpy() if raw_ids.dtype == torch.int64 and raw_ids.dim() == 1 else None
    if ids is None or len(ids) != rows or (rows > 1 and not 0 <= ids[1:].min() <= ids[1:].max() < vocab):
        raise CheckpointError(
            f"{where}: tensor 'tiny.embed.raw_ids' must be int64 [{rows}] (one raw id per embedding row, "
            f"each in 0..{vocab - 1}), got {raw_ids.dtype} {list(raw_ids.shape)}"
        )
    return ids


class _CompactRows(RowSource):
    """Rows ``[vocab, dim]`` over all raw ids from the small embedding ``weight [V, dim]``: raw id
    r reads row ``remap[r]`` (0, the unknown row, for ids outside the small vocabulary)."""

    def __init__(self, weight: torch.Tensor, remap: np.ndarray, label: str):
        self.weight, self.remap = weight, remap
        self.num_rows, self.cols, self.dtype, self.label = len(remap), weight.shape[1], weight.dtype, label

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        return self.weight[torch.from_numpy(self.remap[ids])]


def compact_token_embedding(path: str | Path, label: str) -> TokenEmbedding:
    """The tiny LM's token embedding as a suite ``TokenEmbedding`` over all raw ids
    (``[vocab_size, dim]`` bf16): ids outside its small vocabulary read the unknown row 0."""
    path = Path(path)
    lm = read_lm_tensors(path, ("tiny.embed.weight", "tiny.embed.raw_ids"))
    vocab = load_config(path).vocab_size
    return compact_embedding(lm["tiny.embed.weight"], lm["tiny.embed.raw_ids"], vocab, str(path), label)


def compact_embedding(
    weight: torch.Tensor, raw_ids: torch.Tensor, vocab: int, where: str, label: str
) -> TokenEmbedding:
    """:func:`compact_token_embedding` from the two tensors (bf16 ``[V, dim]``, int64 ``[V]``) read from
    ``where`` (a folder, or a GGUF file of the tiny LM)."""
    if weight.dim() != 2:
        raise CheckpointError(f"{where}: tensor 'tiny.embed.weight' must be 2-D [rows, dim], got {list(weight.shape)}")
    raw_ids = check_raw_ids(raw_ids, weight.shape[0], vocab, where)
    remap = np.zeros(vocab, dtype=np.int64)
    remap[raw_ids[1:]] = np.arange(1, len(raw_ids))
    return TokenEmbedding(
        _CompactRows(weight, remap, label), label=f"token embedding of the {label} (unknown ids -> row 0)"
    )
