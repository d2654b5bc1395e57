"""A tiny Engram LM folder as the weights layer sees it: its files, its label, its compact embedding.

The folder (written by ``engram_viz.tiny.files.save_tiny_model``; ``data/tiny-engram`` is the
committed one) holds ``config.json`` with a ``tiny_lm`` section, an HF-style index and two shards:
``LM_SHARD`` (the LM's own bf16 tensors under ``tiny.``, among them the small embedding
``tiny.embed.weight`` ``[V, dim]`` and ``tiny.embed.raw_ids`` ``[V]``) and ``ENGRAM_SHARD`` (the
Engram tensors under the real checkpoint's names and dtypes). It opens as a suite ``Checkpoint``
whose token embedding is :func:`compact_token_embedding`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open

from engram_viz.config import DATA_DIR, load_config
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.rows import RowSource

DEFAULT_DIR = DATA_DIR / "tiny-engram"
LM_SHARD = "model-00001-of-00002.safetensors"  # tiny LM: small embedding, blocks, final norm (bf16)
ENGRAM_SHARD = "model-00002-of-00002.safetensors"  # Engram tensors, real checkpoint names and dtypes
TRAINED_ON = "the King James Bible + Debian Reference (zh-CN)"


def is_tiny_lm_folder(path: str | Path | None) -> bool:
    """True when ``path`` is a folder whose ``config.json`` has a ``tiny_lm`` section."""
    if path is None:
        return False
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and "tiny_lm" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def checkpoint_label(path: str | Path) -> str:
    """The label a tiny-LM folder carries into every output: ``label`` in its ``config.json`` if set,
    else e.g. ``tiny Engram LM trained on ... (engram-viz, data/tiny-engram)``."""
    path = Path(path).resolve()
    raw = json.loads((path / "config.json").read_text())
    if raw.get("label"):
        return str(raw["label"])
    try:
        where = str(path.relative_to(DEFAULT_DIR.parent.parent))
    except ValueError:
        where = str(path)
    seed = raw.get("training", {}).get("seed")
    extra = "" if seed in (None, 0) else f", seed {seed}"
    return f"tiny Engram LM trained on {TRAINED_ON} (engram-viz, {where}{extra})"


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
    with safe_open(str(path / LM_SHARD), framework="pt") as f:
        weight, raw_ids = f.get_tensor("tiny.embed.weight"), f.get_tensor("tiny.embed.raw_ids")
    vocab = load_config(path).vocab_size
    remap = np.zeros(vocab, dtype=np.int64)
    remap[raw_ids[1:].numpy()] = np.arange(1, len(raw_ids))
    return TokenEmbedding(
        _CompactRows(weight, remap, label), label=f"token embedding of the {label} (unknown ids -> row 0)"
    )
