"""A memory-mapped row engine, measured against ``LazyRows``' pread engine by ``row_gather.py``.

An experiment kept so the comparison can be rerun, not part of the library: it did not win (see
``benchmarks/results/row_gather.txt``), so ``engram_viz.weights.rows.LazyRows`` keeps pread.

``TensorMap`` maps the bytes of one tensor on first use (``mmap``, read-only; a 100 GB sparse
file maps fine on 64-bit) and copies rows out with one vectorised ``np.take`` over a
``uint8 [rows, row_bytes]`` view: no system call per row, and a page already in the page cache
costs one minor fault the first time it is touched. ``MappedRows`` is a ``LazyRows`` stand-in
(one tensor part) for ``LazyTable``.

Mapped file pages count in the process's resident memory (RSS), so touching is budgeted. Before a
gather touches a map it is charged an upper bound of what it can map: ``REGION_CHARGE`` for each
distinct ``MAP_REGION_BYTES``-aligned region of the file its rows lie in (one fault maps at most
the page-cache folio it hits, at most 2 MiB on x86-64 and arm64 with 4 KiB pages and naturally
aligned in the file, plus fault-around, 64 KiB by default, which may reach into a neighbouring
region). When the charges since the last reset would pass ``MAP_BUDGET_BYTES`` (one budget for
every map of the process), the pages of every live map are dropped with ``madvise(MADV_DONTNEED)``
(the mappings stay; the pages stay in the page cache, warm) and the count restarts; a gather whose
rows span more than the budget is taken in chunks of at most it.

Maps keep the default advice: with ``MADV_RANDOM`` (no readahead on a fault) cold gathers were
~175x the in-memory gather instead of 8-30x. A file shorter than its tensor raises a
``CheckpointError`` before any page is touched (checked on every gather: touching a page past the
end of a mapped file would kill the process with SIGBUS).
"""

from __future__ import annotations

import mmap
import os
import threading
import weakref

import numpy as np
import torch

from engram_viz.errors import CheckpointError
from engram_viz.weights.nonfinite import nonfinite_error, nonfinite_rows
from engram_viz.weights.safetensors import TensorInfo

MAP_BUDGET_BYTES = 128 * 2**20  # mapped (resident) table pages allowed before they are all dropped
MAP_REGION_BYTES = 2 * 2**20  # the largest page-cache folio one fault can map (a PMD)
FAULT_AROUND_BYTES = 64 * 2**10  # the kernel's default fault-around window
REGION_CHARGE = MAP_REGION_BYTES + FAULT_AROUND_BYTES


class _Budget:
    """The bytes charged to every live ``TensorMap`` of the process since the last reset."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.charged = 0
        self.resets = 0  # times every map's pages were dropped (read by tests and the benchmark)
        self.maps: weakref.WeakSet[TensorMap] = weakref.WeakSet()

    def room(self) -> int:
        return max(0, MAP_BUDGET_BYTES - self.charged)

    def charge(self, nbytes: int) -> None:
        """Count ``nbytes`` about to be touched; first drop every map's pages if they would not fit."""
        with self.lock:
            if self.charged + nbytes > MAP_BUDGET_BYTES and self.charged:
                self._reset()
            self.charged += nbytes

    def reset(self) -> None:
        """Drop the pages of every live map now (they stay in the page cache) and restart the count."""
        with self.lock:
            self._reset()

    def _reset(self) -> None:
        for m in list(self.maps):
            m.drop_pages()
        self.charged = 0
        self.resets += 1


BUDGET = _Budget()


class TensorMap:
    """The rows ``[shape[0], row_bytes]`` of one safetensors tensor, mapped read-only on first use
    (the mapping is released with the object)."""

    def __init__(self, info: TensorInfo, row_bytes: int):
        self.info = info
        self.row_bytes = int(row_bytes)
        self.what = f"{info.path}: tensor {info.name!r}"
        self._mm: mmap.mmap | None = None
        self._rows: np.ndarray | None = None
        self._lock = threading.Lock()

    def _check_size(self, size: int) -> None:
        if size < self.info.end:
            raise CheckpointError(
                f"{self.what}: truncated file: the tensor's bytes end at byte {self.info.end:,} but the file "
                f"now holds {size:,} bytes"
            )

    def _map(self) -> np.ndarray:
        """The ``uint8 [rows, row_bytes]`` view of the tensor, mapping the file the first time."""
        with self._lock:
            if self._mm is None:
                info = self.info
                offset = info.start - info.start % mmap.ALLOCATIONGRANULARITY
                try:
                    fd = os.open(info.path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CheckpointError(f"safetensors file {info.path} disappeared after it was opened") from None
                try:
                    self._check_size(os.fstat(fd).st_size)
                    mm = mmap.mmap(fd, info.end - offset, prot=mmap.PROT_READ, offset=offset)
                finally:
                    os.close(fd)  # the map keeps its own descriptor
                n = self.info.nbytes // self.row_bytes
                rows = np.frombuffer(mm, dtype=np.uint8, count=info.nbytes, offset=info.start - offset)
                self._mm, self._rows = mm, rows.reshape(n, self.row_bytes)
                BUDGET.maps.add(self)
            else:
                self._check_size(self._mm.size())  # the size of the file now (fstat), not of the map
            return self._rows

    def drop_pages(self) -> None:
        """Unmap every page of the map (they stay in the page cache); the next touch faults them back."""
        if self._mm is not None:
            self._mm.madvise(mmap.MADV_DONTNEED)

    def _region_charges(self, local: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted row ids: the cumulative charge ``[n]`` of rows ``0..i`` and whether row i's first
        region is the region the row before it ended in ``[n]``."""
        start = self.info.start + local * self.row_bytes
        first = start // MAP_REGION_BYTES
        last = (start + self.row_bytes - 1) // MAP_REGION_BYTES
        shared = np.zeros(len(local), dtype=bool)
        shared[1:] = first[1:] == last[:-1]
        return np.cumsum(last - first + 1 - shared) * REGION_CHARGE, shared

    def take(self, local: np.ndarray, out: np.ndarray) -> None:
        """Rows of sorted unique local row ids ``[n]`` (checked by the caller) into ``out`` uint8
        ``[n, row_bytes]``, in chunks charged to the budget."""
        if not len(local):
            return
        rows = self._map()
        cum, shared = self._region_charges(local)
        a = 0
        while a < len(local):
            base = int(cum[a - 1]) - int(shared[a]) * REGION_CHARGE if a else 0
            b = int(np.searchsorted(cum, base + BUDGET.room(), side="right"))
            if b <= a:  # not even the next row fits what is left: it starts a fresh budget
                b = max(a + 1, int(np.searchsorted(cum, base + MAP_BUDGET_BYTES, side="right")))
            BUDGET.charge(int(cum[b - 1]) - base)
            np.take(rows, local[a:b], axis=0, out=out[a:b], mode="clip")
            a = b


class MappedRows:
    """``LazyRows``' interface over one tensor through a ``TensorMap`` (for ``LazyTable``)."""

    def __init__(self, info: TensorInfo):
        self.dtype, self.cols = info.torch_dtype, info.shape[1]
        self.num_rows, self.row_bytes = info.shape[0], info.shape[1] * info.itemsize
        self.label = f"{info.name} in {info.path}"
        self.map = TensorMap(info, self.row_bytes)

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        """Rows of sorted unique int64 ids ``[n]`` -> ``[n, cols]``, checked for NaN/Inf as LazyRows checks."""
        out = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
        self.map.take(np.ascontiguousarray(ids, dtype=np.int64), out)
        bad = nonfinite_rows(out, self.dtype)
        if len(bad):
            raise nonfinite_error(self.map.what, self.dtype, ids[bad])
        return torch.from_numpy(out).view(self.dtype)
