"""Rows of a tensor in a shard left on the Hub, read by coalesced byte ranges through a row cache on disk.

``RemoteRows(part, reads)`` is a ``RowSource`` like ``rows.LazyRows``: ``read_unique(ids)`` takes the
rows the row store holds (``row_store.RowStore``), plans the others into ranges (rows fewer than
``COALESCE_GAP_BYTES`` apart share one, no range longer than ``MAX_RANGE_BYTES``), reads them
concurrently at the pinned commit and ETag (``hub_ranges.read_ranges``, retried on transient
failures), keeps every row the ranges brought in the store (the gap rows too), checks the rows it
hands out for NaN/Inf (``nonfinite.py``) and counts everything in ``reads``. A checkpoint opened
from the Hub shares one :class:`RemoteReads` among its tensors (``Checkpoint.remote_reads``): per
tensor, the rows taken from the Hub and from the row cache, the bytes and the requests; the report
writes it into its provenance. Offline, rows the row cache lacks are refused in one line.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from engram_viz import settings
from engram_viz.errors import HubError
from engram_viz.weights.hub_ranges import read_ranges
from engram_viz.weights.hub_shards import is_remote_shard, remote_file
from engram_viz.weights.nonfinite import check_finite, nonfinite_error, nonfinite_rows, read_checked
from engram_viz.weights.row_store import RowStore, store_folder, store_root
from engram_viz.weights.rows import LazyRows, RowSource
from engram_viz.weights.safetensors import TensorInfo

# a request to the Hub costs a round trip (tens of ms, ~1 MB at its bandwidth), a gap row its bytes:
# rows closer than this share one range, which keeps the bytes read within a few times the rows wanted
COALESCE_GAP_BYTES = 32 * 1024
MAX_RANGE_BYTES = 4 * 2**20  # one range never asks for more (ranges run concurrently)
_COUNTS = ("rows_remote", "rows_cached", "bytes_remote", "requests")


class RemoteReads:
    """What the remote tensors of one checkpoint read, per tensor (thread-safe counters)."""

    def __init__(self) -> None:
        self._by: dict[str, dict[str, Any]] = {}  # tensor -> its Hub file and counts
        self._lock = threading.Lock()

    def add(self, tensor: str, file: str, **counts: int) -> None:
        with self._lock:
            mine = self._by.setdefault(tensor, {"file": file, **dict.fromkeys(_COUNTS, 0)})
            for key, value in counts.items():
                mine[key] += int(value)

    def summary(self) -> dict:
        """``{"tensors": {name: counts}, "total": counts, "row_cache": folder}``: per tensor its Hub
        ``file`` and the counts ``rows_remote`` (rows read from the Hub), ``rows_cached`` (from the row
        cache on disk), ``bytes_remote`` (gap rows of coalesced ranges included) and ``requests``."""
        with self._lock:
            tensors = {name: dict(c) for name, c in sorted(self._by.items())}
        total = {key: sum(c[key] for c in tensors.values()) for key in _COUNTS}
        return {"tensors": tensors, "total": total, "row_cache": str(store_root())}


class RemoteRows(RowSource):
    """Rows of the 2D tensor ``part`` (its shard left on the Hub), read as the module docstring says."""

    def __init__(self, part: TensorInfo, reads: RemoteReads, num_rows: int | None = None):
        if len(part.shape) != 2:
            raise HubError(f"{part.path}: tensor {part.name!r} has shape {list(part.shape)}; expected 2D to read rows")
        self.part, self.reads = part, reads
        self.file = remote_file(part.path)
        self.dtype, self.cols = part.torch_dtype, part.shape[1]
        self.row_bytes = self.cols * part.itemsize
        self.num_rows = part.shape[0] if num_rows is None else int(num_rows)
        self.label = f"{part.name} in {self.file.label}"
        key = (self.file.repo_id, self.file.commit, self.file.filename, self.file.etag, part.name)
        self.store = RowStore(store_folder(*key), self.row_bytes)

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        hit, cached = self.store.lookup(ids)
        missed = ids[~hit]
        out = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
        out[hit] = cached
        spans, nbytes = self._fetch(missed, out, np.nonzero(~hit)[0])
        counts = {"rows_remote": len(missed), "rows_cached": len(cached), "bytes_remote": nbytes, "requests": spans}
        self.reads.add(self.part.name, self.file.label, **counts)
        bad = nonfinite_rows(out, self.dtype)  # every row handed out, from the Hub or the row cache
        if len(bad):
            raise nonfinite_error(self.label, self.dtype, ids[bad])
        rows = torch.from_numpy(out)
        return rows.view(torch.bool) if self.dtype == torch.bool else rows.view(self.dtype)

    def read_all(self) -> torch.Tensor:
        """The whole tensor ``[rows, cols]`` (the small tensors: ``wkv``, ``q_weight``, ``k_weight``)."""
        return self.read_unique(np.arange(self.num_rows, dtype=np.int64))

    def plan(self, ids: np.ndarray) -> list[tuple[int, int]]:
        """The byte ranges ``[start, end)`` that read the rows of sorted unique ``ids``, coalesced."""
        if not len(ids):
            return []
        rb = self.row_bytes
        block = ids // max(1, MAX_RANGE_BYTES // rb)
        cut = (np.diff(ids) - 1 > COALESCE_GAP_BYTES // rb) | (np.diff(block) != 0)
        breaks = np.nonzero(cut)[0] + 1
        firsts, lasts = ids[np.concatenate([[0], breaks])], ids[np.concatenate([breaks, [len(ids)]]) - 1]
        return [(self.part.start + int(a) * rb, self.part.start + (int(b) + 1) * rb) for a, b in zip(firsts, lasts)]

    def _fetch(self, ids: np.ndarray, out: np.ndarray, slots: np.ndarray) -> tuple[int, int]:
        """Rows of ``ids`` from the Hub into ``out[slots]``; every row the ranges brought (the gap rows
        of coalesced ranges too: they are paid for) goes into the row cache. -> (requests, bytes)."""
        if not len(ids):
            return 0, 0
        if settings.offline():
            raise HubError(
                f"{self.label}: {len(ids):,} rows (ids {ids[0]}...) are not in the row cache, and --offline "
                "(or ENGRAM_VIZ_OFFLINE / HF_HUB_OFFLINE) forbids the network; run these prompts once online"
            )
        spans = self.plan(ids)
        bodies = read_ranges(self.file, spans)
        rb = self.row_bytes
        firsts = np.array([(start - self.part.start) // rb for start, _ in spans], dtype=np.int64)
        counts = np.array([len(body) // rb for body in bodies], dtype=np.int64)
        every = np.concatenate([np.arange(f, f + n) for f, n in zip(firsts, counts)])
        read = np.frombuffer(b"".join(bodies), dtype=np.uint8).reshape(-1, rb)
        out[slots] = read[np.searchsorted(every, ids)]
        self.store.add(every, read)
        return len(spans), len(read) * rb


def tensor_rows(parts: list[TensorInfo], num_rows: int, reads: RemoteReads) -> RowSource:
    """Rows of a tensor: from its files with ``pread`` (``LazyRows``), or by byte ranges when its
    shard stayed on the Hub."""
    if is_remote_shard(parts[0].path):
        return RemoteRows(parts[0], reads, num_rows=num_rows)
    return LazyRows(parts, num_rows=num_rows)


def read_small(part: TensorInfo, reads: RemoteReads | None = None) -> torch.Tensor:
    """A small tensor (``wkv``, ``q_weight``...) whole, checked to be finite: from its file, or by
    rows from the Hub when its shard stayed there (counted in ``reads``)."""
    if is_remote_shard(part.path):
        return check_finite(RemoteRows(part, reads or RemoteReads()).read_all(), f"{part.path}: tensor {part.name!r}")
    return read_checked(part)
