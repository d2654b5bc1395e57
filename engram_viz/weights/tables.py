"""The Engram table: fp8 e4m3 rows with one e8m0 scale per 32 features (reference section 4).

One interface (``EngramTable``), several backings:

- ``InMemoryTable(weight, scale)``: the tensors in memory (any device); gathered rows are checked
  for NaN bytes (``finite.py``), as ``LazyRows`` checks the rows it reads.
- ``LazyTable``: rows read on demand (two ``RowSource``: ``LazyRows`` from safetensors files, or
  ``RemoteRows`` by byte ranges from the Hub), the
  rows read lately optionally kept in a small ``RowCache`` (``cache_mb``; off by default: measured
  in ``benchmarks/row_gather.py``, its hits on real text did not pay for its copies).
- ``ProceduralTable`` (``procedural.py``): row r a fixed function of ``(seed, r)``.
- ``GGUFTable`` (``gguf_table.py``): rows of any GGML block type read lazily from a GGUF file.

``table(row_ids)`` is the reference lookup ``fp8.dequantize_rows(*table.gather_fp8(row_ids))``
-> bf16 ``[..., head_dim]``. A table stores each row as a pair of parts (fp8: e4m3 weight and e8m0
scale); ``_decode``, ``_encode`` and ``_zero_parts`` turn parts into rows and back, so a backing
that stores rows otherwise (GGUF blocks) only overrides those three and its ``_gather_unique``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from engram_viz.config import FP8_BLOCK_SIZE
from engram_viz.core import fp8
from engram_viz.errors import CheckpointError
from engram_viz.weights.nonfinite import nonfinite_error, tensor_nonfinite_rows
from engram_viz.weights.row_cache import RowCache
from engram_viz.weights.rows import LazyRows, RowSource, check_row_ids, take_rows, unique_ids
from engram_viz.weights.safetensors import read_safetensors_header

DEQUANT_CHUNK_ROWS = 4096  # bounds the float32 temporaries of dequantisation (4 MB each at head_dim 256)
E8M0_ONE = 127  # the e8m0 byte of the scale 1.0 (2**(127 - 127))
DEFAULT_CACHE_MB = 0  # hot-row cache of a LazyTable, off (64 MB ~ 245k rows at head_dim 256: no faster, see above)


class EngramTable:
    """An Engram table: e4m3 rows ``[num_rows, head_dim]`` with e8m0 scales ``[num_rows, head_dim / 32]``.

    Subclasses implement ``_gather_unique(ids)`` for sorted unique validated ids.
    """

    num_rows: int
    head_dim: int
    label: str
    synthetic: bool = False
    stored_format = "fp8"  # what gather_stored returns: e4m3 weight and e8m0 scale per row

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _check(self, row_ids) -> torch.Tensor:
        return check_row_ids(row_ids, self.num_rows, self.label)

    def _decode(self, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        """Stored parts of ``n`` rows -> bf16 ``[n, head_dim]`` (fp8: the reference lookup)."""
        return fp8.dequantize_rows(w, s)

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """float32 rows ``[n, head_dim]`` -> stored parts, as the checkpoint stores rows."""
        return fp8.quantize_rows(x)

    def _zero_parts(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored parts of ``n`` rows that decode to zeros (fp8: weight 0, scale 1)."""
        w = torch.zeros(n, self.head_dim, dtype=torch.uint8).view(torch.float8_e4m3fn)
        s = torch.full((n, self.head_dim // FP8_BLOCK_SIZE), E8M0_ONE, dtype=torch.uint8)
        return w, s.view(torch.float8_e8m0fnu)

    def gather_stored(self, row_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ids ``[...]`` as stored, both parts ``[..., cols]``, on the ids' device, bit for bit."""
        ids = self._check(row_ids)
        uniq, inv = unique_ids(ids)
        w, s = self._gather_unique(uniq)
        w = take_rows(w, inv).reshape(*ids.shape, w.shape[-1])
        s = take_rows(s, inv).reshape(*ids.shape, s.shape[-1])
        return w.to(ids.device), s.to(ids.device)

    def gather_fp8(self, row_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ids ``[...]``: weight float8_e4m3fn ``[..., head_dim]`` and scale
        float8_e8m0fnu ``[..., head_dim / 32]``, on the ids' device, bit for bit as stored."""
        return self.gather_stored(row_ids)

    def __call__(self, row_ids) -> torch.Tensor:
        """The reference lookup: bf16 ``[..., head_dim]`` = ``_decode(*gather_stored(row_ids))``.

        Each unique row is read once; dequantisation runs in chunks of positions (the same
        per-element arithmetic), so float32 temporaries stay small. The result is on the ids' device.
        """
        ids = self._check(row_ids)
        uniq, inv = unique_ids(ids)
        w, s = self._gather_unique(uniq)
        w, s, inv = w.to(ids.device), s.to(ids.device), inv.to(ids.device)
        out = torch.empty(inv.numel(), self.head_dim, dtype=torch.bfloat16, device=ids.device)
        for a in range(0, inv.numel(), DEQUANT_CHUNK_ROWS):
            idx = inv[a : a + DEQUANT_CHUNK_ROWS]
            out[a : a + DEQUANT_CHUNK_ROWS] = self._decode(take_rows(w, idx), take_rows(s, idx))
        return out.reshape(*ids.shape, self.head_dim)

    def _check_pair(self, weight_dtype, scale_dtype, weight_cols: int, scale_cols: int, where: str) -> None:
        if weight_dtype != torch.float8_e4m3fn:
            raise CheckpointError(f"{where}: table weight must be float8_e4m3fn (F8_E4M3), got {weight_dtype}")
        if scale_dtype != torch.float8_e8m0fnu:
            raise CheckpointError(f"{where}: table scale must be float8_e8m0fnu (F8_E8M0), got {scale_dtype}")
        if weight_cols % FP8_BLOCK_SIZE or scale_cols * FP8_BLOCK_SIZE != weight_cols:
            raise CheckpointError(
                f"{where}: table weight has {weight_cols} features but scale has {scale_cols} columns; "
                f"expected one scale per {FP8_BLOCK_SIZE} features"
            )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_rows:,} x {self.head_dim}, {self.label})"


class InMemoryTable(EngramTable):
    """A table held as tensors: ``weight`` e4m3 ``[rows, D]``, ``scale`` e8m0 ``[rows, D/32]`` (any device)."""

    def __init__(
        self, weight: torch.Tensor, scale: torch.Tensor, label: str = "in-memory table", synthetic: bool = False
    ):
        if weight.dim() != 2 or scale.dim() != 2 or weight.shape[0] != scale.shape[0]:
            raise CheckpointError(
                f"{label}: weight {list(weight.shape)} and scale {list(scale.shape)} must be 2D with equal rows"
            )
        self._check_pair(weight.dtype, scale.dtype, weight.shape[1], scale.shape[1], label)
        self.weight, self.scale = weight, scale
        self.num_rows, self.head_dim = weight.shape
        self.label, self.synthetic = label, synthetic

    @property
    def device(self) -> torch.device:
        return self.weight.device

    def to(self, device: str | torch.device) -> InMemoryTable:
        return InMemoryTable(self.weight.to(device), self.scale.to(device), self.label, self.synthetic)

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        idx = torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.weight.device)
        w, s = take_rows(self.weight, idx), take_rows(self.scale, idx)
        for rows, what in ((w, "weight"), (s, "scale")):  # only the rows read: NaN bytes named by row id
            bad = tensor_nonfinite_rows(rows)
            if len(bad):
                raise nonfinite_error(f"{self.label}: {what}", rows.dtype, np.asarray(ids)[bad])
        return w, s


class LazyTable(EngramTable):
    """A table whose rows are read on demand from safetensors files (see ``LazyRows``); the rows
    read lately stay in ``self.cache`` when ``cache_mb`` > 0 (a ``RowCache``, hit counters included)."""

    def __init__(
        self,
        weight: RowSource,
        scale: RowSource,
        num_rows: int | None = None,
        label: str | None = None,
        synthetic: bool = False,
        cache_mb: float = DEFAULT_CACHE_MB,
    ):
        where = label or weight.label
        self._check_pair(weight.dtype, scale.dtype, weight.cols, scale.cols, where)
        if weight.num_rows != scale.num_rows:
            raise CheckpointError(f"{where}: weight has {weight.num_rows:,} rows but scale has {scale.num_rows:,}")
        if num_rows is None:
            num_rows = weight.num_rows
        if num_rows > weight.num_rows:
            raise CheckpointError(f"{where}: {num_rows:,} rows wanted but the files hold {weight.num_rows:,}")
        self.weight, self.scale = weight, scale
        self.num_rows, self.head_dim = int(num_rows), weight.cols
        self.label = label or weight.label
        self.synthetic = synthetic
        self.device = torch.device("cpu")
        self.cache = RowCache(cache_mb, weight.row_bytes, scale.row_bytes)

    @classmethod
    def open(
        cls,
        paths: str | Path | Sequence[str | Path],
        weight_name: str,
        scale_name: str,
        num_rows: int | None = None,
        label: str | None = None,
        synthetic: bool = False,
        cache_mb: float = DEFAULT_CACHE_MB,
    ) -> LazyTable:
        """The table ``weight_name`` / ``scale_name`` of one file, or row-split over several files in order."""
        paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
        headers = [read_safetensors_header(p) for p in paths]
        parts = {}
        for name in (weight_name, scale_name):
            for h in headers:
                if name not in h.tensors:
                    raise CheckpointError(f"{h.path}: tensor {name!r} not found")
            parts[name] = [h.tensors[name] for h in headers]
        w, s = LazyRows(parts[weight_name]), LazyRows(parts[scale_name])
        return cls(w, s, num_rows=num_rows, label=label or w.label, synthetic=synthetic, cache_mb=cache_mb)

    def _read(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w, s = self.weight.read_unique(ids), self.scale.read_unique(ids)
        return w.view(torch.uint8).numpy(), s.view(torch.uint8).numpy()

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w, s = self.cache.gather(ids, self._read)
        return torch.from_numpy(w).view(self.weight.dtype), torch.from_numpy(s).view(self.scale.dtype)

    def materialize(self) -> InMemoryTable:
        """Read the whole table into memory (only sensible for small tables)."""
        ids = np.arange(self.num_rows, dtype=np.int64)
        w, s = self._gather_unique(ids)
        return InMemoryTable(w, s, label=f"{self.label} (in memory)", synthetic=self.synthetic)
