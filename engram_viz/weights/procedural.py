"""Procedural weights: rows that are a fixed function of ``(seed, row)``, so the real dimensions
(384M table rows) run without 98 GB of storage.

``procedural_values`` is the definition (splitmix64 of a counter, bytes summed into near-normal
exact floats); ``ProceduralTable`` quantises it to fp8 rows, ``ProceduralEmbedding`` rounds it to bf16.
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.config import FP8_BLOCK_SIZE
from engram_viz.core import fp8
from engram_viz.errors import InputError
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.rows import RowSource
from engram_viz.weights.tables import EngramTable

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15
STREAM_TABLE = 0x7461626C65  # "table"
STREAM_EMBED = 0x656D626564  # "embed"
PROCEDURAL_CHUNK_ROWS = 4096


def mix64(z):
    """The splitmix64 finaliser on uint64 (numpy arrays wrap modulo 2**64; Python ints are masked)."""
    if isinstance(z, int):
        z &= MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def procedural_key(seed: int, stream: int) -> int:
    """The 64-bit key of a procedural tensor: ``mix64((seed * GOLDEN) ^ stream)``."""
    return mix64(((int(seed) * GOLDEN) & MASK64) ^ stream)


def procedural_values(ids: np.ndarray, cols: int, key: int) -> torch.Tensor:
    """Float32 ``[n, cols]``: the procedural values of rows ``ids`` (any order).

    Definition (what ``ProceduralTable`` and ``ProceduralEmbedding`` promise): with
    ``W = cols / 2`` words per row, word j of row r is ``mix64(key + (r * W + j) * GOLDEN)``
    (mod 2**64); feature ``2j + h`` (h = 0, 1) takes bytes ``4h .. 4h + 3`` of that word in
    little-endian order and equals ``(sum of those 4 bytes - 510) / 128``: an exact float with
    an Irwin-Hall (near-normal) distribution, mean 0 and standard deviation about 1.15.
    """
    if cols % 2:
        raise InputError(f"procedural rows need an even column count, got {cols}")
    words = cols // 2
    ids = np.asarray(ids, dtype=np.int64)
    out = torch.empty(len(ids), cols, dtype=torch.float32)
    col = np.arange(words, dtype=np.uint64)
    for a in range(0, len(ids), PROCEDURAL_CHUNK_ROWS):
        r = ids[a : a + PROCEDURAL_CHUNK_ROWS].astype(np.uint64)
        counter = r[:, None] * np.uint64(words) + col[None, :]
        w = mix64(np.uint64(key) + counter * np.uint64(GOLDEN))
        sums = w.view(np.uint8).reshape(len(r), words, 2, 4).sum(-1, dtype=np.int16) - 510
        out[a : a + len(r)] = torch.from_numpy(sums.reshape(len(r), cols).astype(np.float32) / 128.0)
    return out


class ProceduralTable(EngramTable):
    """A synthetic table: row r is ``fp8.quantize_rows(procedural_values([r], head_dim, key))`` with
    ``key = procedural_key(seed, STREAM_TABLE)`` (see ``procedural_values``), so it needs no storage
    and any row of a 384M-row table costs the same. Values are near-normal (std ~1.15) before
    quantisation; scales are the power-of-two scales ``quantize_rows`` picks per 32 features.
    """

    synthetic = True

    def __init__(self, num_rows: int, head_dim: int, seed: int = 0, label: str | None = None):
        if num_rows <= 0 or head_dim <= 0 or head_dim % FP8_BLOCK_SIZE:
            raise InputError(
                f"procedural table needs num_rows > 0 and head_dim a multiple of {FP8_BLOCK_SIZE}, got {num_rows}, {head_dim}"
            )
        self.num_rows, self.head_dim, self.seed = int(num_rows), int(head_dim), int(seed)
        self.key = procedural_key(self.seed, STREAM_TABLE)
        self.label = label or f"synthetic procedural table ({self.num_rows:,} x {self.head_dim}, seed {self.seed})"
        self.device = torch.device("cpu")

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w = torch.empty(len(ids), self.head_dim, dtype=torch.float8_e4m3fn)
        s = torch.empty(len(ids), self.head_dim // FP8_BLOCK_SIZE, dtype=torch.float8_e8m0fnu)
        for a in range(0, len(ids), PROCEDURAL_CHUNK_ROWS):  # row by row arithmetic: chunks only bound memory
            w[a : a + PROCEDURAL_CHUNK_ROWS], s[a : a + PROCEDURAL_CHUNK_ROWS] = fp8.quantize_rows(
                procedural_values(ids[a : a + PROCEDURAL_CHUNK_ROWS], self.head_dim, self.key)
            )
        return w, s


class _ProceduralSource(RowSource):
    def __init__(self, num_rows: int, cols: int, key: int, label: str):
        self.num_rows, self.cols, self.key, self.label = num_rows, cols, key, label
        self.dtype = torch.bfloat16

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        return procedural_values(ids, self.cols, self.key).to(torch.bfloat16)


class ProceduralEmbedding(TokenEmbedding):
    """Synthetic token embedding: row r is ``procedural_values([r], dim, procedural_key(seed,
    STREAM_EMBED))`` rounded to bf16 (values k/128, ``|k| <= 510``, std ~1.15)."""

    def __init__(self, num_rows: int, dim: int, seed: int = 0, label: str | None = None):
        label = label or f"synthetic procedural token embedding ({num_rows:,} x {dim}, seed {seed})"
        super().__init__(
            _ProceduralSource(num_rows, dim, procedural_key(seed, STREAM_EMBED), label), label, synthetic=True
        )
        self.seed = seed
