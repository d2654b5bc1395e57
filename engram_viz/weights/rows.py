"""Rows of a 2D tensor read by id: id checks, the in-memory gather and the ``pread`` engine.

``RowSource`` is the interface (rows of a ``[num_rows, cols]`` tensor by sorted unique ids);
``LazyRows`` reads them on demand from one or more safetensors files with ``pread`` (adjacent
rows coalesced into one read, issued from a compiled loop with the GIL released, ``pread_kernel``,
or from Python without numba; large gathers spread over threads), so a 98 GB table is never
materialised and resident memory grows only by the rows asked for. A tensor row-split over several
files (the inference-converted ``model{i}-mp{n}`` layout, part ``i`` holding rows
``[i * part, (i + 1) * part)``) reads as one.

Every gather validates ids (``RowIdError`` names the id and the range), takes the sorted unique
ids, reads each unique row once and expands with the inverse index. ``LazyRows`` checks the rows it
read for NaN/Inf (``finite.py``; one pass over bytes read anyway) and names the file, the tensor
and the row ids.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import repeat
from pathlib import Path

import numpy as np
import torch

from engram_viz.errors import CheckpointError, InputError, InputTypeError, RowIdError
from engram_viz.weights.nonfinite import nonfinite_error, nonfinite_rows
from engram_viz.weights.pread_kernel import GatherReads, compiled_gather, scratch_bytes
from engram_viz.weights.safetensors import TensorInfo, pread_into

# rows closer than this many bytes share one read. The compiled loop copies a read's gap rows once, into a
# scratch buffer that stays in the CPU cache, so merging pays only within about a page; from Python each read
# costs more than copying ~16 KB from the page cache (benchmarks/results/row_gather.txt)
COALESCE_GAP_BYTES = {"compiled": 4096, "python": 16384}
MAX_READ_BYTES = 2**18  # one pread never asks for more than this (a scratch buffer of this size stays in cache)
BATCH_BYTES = 8 * 2**20  # from Python: bytes read per batch before its rows are picked out (bounds temporaries)
THREADED_MIN_READS = 4096  # below this many reads (and THREADED_MIN_BYTES) a gather stays on the calling thread
THREADED_MIN_BYTES = 16 * 2**20
COMPILED_MIN_ROWS = 1024  # from this many rows a gather uses the compiled read loop (compiled once a process: ~2 s)


def check_row_ids(row_ids, num_rows: int, what: str) -> torch.Tensor:
    """Validate row ids (a tensor of any shape, or anything ``torch.as_tensor`` takes) -> int64.

    Raises ``TypeError`` for non-integer ids and ``RowIdError`` naming a bad id (the smallest
    negative or the largest too large), the table and the valid range.
    """
    ids = row_ids if isinstance(row_ids, torch.Tensor) else torch.as_tensor(np.asarray(row_ids))
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise InputTypeError(f"row ids for {what} must be integers, got {ids.dtype}")
    ids = ids.long()
    if ids.numel():
        if ids.device.type == "cpu":  # numpy: no intra-op thread start-up on a busy machine
            flat = ids.detach().numpy()
            lo, hi = int(flat.min()), int(flat.max())
        else:
            lo, hi = (int(v) for v in torch.aminmax(ids))
        if lo < 0 or hi >= num_rows:
            bad = lo if lo < 0 else hi
            raise RowIdError(f"row id {bad} out of range for {what}: expected 0..{num_rows - 1} ({num_rows:,} rows)")
    return ids


def unique_ids(ids: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Sorted unique ids (numpy int64) of an id tensor of any shape and the flat inverse index (CPU)."""
    flat = ids.detach().reshape(-1).cpu().numpy()
    uniq, inv = np.unique(flat, return_inverse=True)
    return uniq.astype(np.int64, copy=False), torch.from_numpy(inv.reshape(-1).astype(np.int64, copy=False))


_WIDE = (torch.int64, torch.int32, torch.int16)


def take_rows(rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
    """``rows[idx]`` -> ``[len(idx), cols]`` for a 2D tensor of any dtype, by ``index_select`` on the
    widest integer view of each row (fp8 rows indexed byte by byte are an order of magnitude slower)."""
    idx = idx.reshape(-1).to(rows.device)
    rows = rows.contiguous()
    row_bytes = rows.shape[1] * rows.element_size()
    as_bytes = rows.view(torch.uint8)
    for wide in _WIDE:
        if row_bytes and row_bytes % wide.itemsize == 0:
            try:
                picked = torch.index_select(as_bytes.view(wide), 0, idx).view(torch.uint8)
                break
            except RuntimeError:  # storage offset not aligned for the wide view
                continue
    else:
        picked = torch.index_select(as_bytes, 0, idx)
    return picked.view(rows.dtype)


class RowSource:
    """Rows of a 2D tensor ``[num_rows, cols]`` of one dtype, read by sorted unique ids."""

    num_rows: int
    cols: int
    row_bytes: int
    dtype: torch.dtype
    label: str

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        """Rows of sorted unique, already validated int64 ids ``[n]`` -> CPU ``[n, cols]``."""
        raise NotImplementedError

    def gather(self, row_ids, what: str | None = None) -> torch.Tensor:
        """Rows of ids of any shape ``[...]`` -> ``[..., cols]`` on the ids' device; a bad id raises
        ``RowIdError`` naming ``what`` (default: the source's label)."""
        ids = check_row_ids(row_ids, self.num_rows, what or self.label)
        uniq, inv = unique_ids(ids)
        rows = self.read_unique(uniq)
        out = take_rows(rows, inv).reshape(*ids.shape, self.cols)
        return out.to(ids.device)


_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="engram-viz-pread")
        return _POOL


def _forget_pool_after_fork() -> None:
    """A forked child (e.g. a DataLoader worker) has none of the parent's threads: start afresh."""
    global _POOL, _POOL_LOCK
    _POOL, _POOL_LOCK = None, threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_after_fork)


class LazyRows(RowSource):
    """Rows of a 2D tensor stored in safetensors files, read with ``pread`` on demand.

    ``parts`` are the pieces of one logical tensor split by rows, in order (one piece for a plain
    file; ``n`` pieces for the ``model{i}-mp{n}`` layout): piece k holds the rows after those of
    pieces 0..k-1. All pieces share dtype and column count. ``num_rows`` (default: all rows) may be
    smaller than the pieces' total, as when the last piece is padded to the part size.
    ``workers`` threads issue the reads of large gathers (useful on real disks, where many reads
    in flight beat one at a time).
    """

    def __init__(self, parts: Sequence[TensorInfo] | TensorInfo, num_rows: int | None = None, workers: int = 4):
        parts = [parts] if isinstance(parts, TensorInfo) else list(parts)
        if not parts:
            raise InputError("LazyRows needs at least one tensor part")
        first = parts[0]
        for p in parts:
            where = f"{p.path}: tensor {p.name!r}"
            p.torch_dtype  # noqa: B018 - raises for unreadable dtypes
            if len(p.shape) != 2 or p.shape[1] == 0:
                raise CheckpointError(
                    f"{where}: expected a 2D tensor with columns to read by rows, got shape {list(p.shape)}"
                )
            if p.dtype != first.dtype or p.shape[1] != first.shape[1]:
                raise CheckpointError(
                    f"{where}: {p.dtype} {list(p.shape)} does not match the first part "
                    f"{first.path}: {first.dtype} {list(first.shape)}"
                )
        self.parts = parts
        self.dtype = first.torch_dtype
        self.cols = first.shape[1]
        self.row_bytes = self.cols * first.itemsize
        self.part_rows = np.array([p.shape[0] for p in parts], dtype=np.int64)
        self.part_start = np.concatenate([[0], np.cumsum(self.part_rows)])
        total = int(self.part_start[-1])
        if num_rows is None:
            num_rows = total
        if not 0 <= num_rows <= total:
            raise CheckpointError(
                f"{first.path}: tensor {first.name!r}: {num_rows:,} rows wanted but the parts hold {total:,}"
            )
        self.num_rows = int(num_rows)
        self.workers = max(1, int(workers))
        files = [str(p.path) for p in parts]
        self.label = files[0] if len(files) == 1 else f"{files[0]} (+{len(files) - 1} parts)"
        self.label = f"{first.name} in {self.label}"
        self._fds: dict[Path, int] = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_fds, self._fds)

    def _fd(self, path: Path) -> int:
        with self._lock:
            fd = self._fds.get(path)
            if fd is None:
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    raise CheckpointError(f"safetensors file {path} disappeared after it was opened") from None
                self._fds[path] = fd
            return fd

    def __getstate__(self) -> dict:  # picklable (spawned workers): file descriptors reopen lazily
        state = self.__dict__.copy()
        for key in ("_fds", "_lock", "_finalizer"):
            state.pop(key)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._fds = {}
        self._lock = threading.Lock()
        self._finalizer = weakref.finalize(self, _close_fds, self._fds)

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        ids = np.ascontiguousarray(ids, dtype=np.int64)
        out = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
        gather = compiled_gather() if len(ids) >= COMPILED_MIN_ROWS else None
        gap = COALESCE_GAP_BYTES["python" if gather is None else "compiled"]
        plans = []
        bounds = np.searchsorted(ids, self.part_start)
        for k, part in enumerate(self.parts):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if a < b:
                plans.append(self._plan(part, ids[a:b] - self.part_start[k], a, gap))
        n_reads = sum(len(p.starts) for p in plans)
        n_bytes = sum(p.nbytes() for p in plans)
        if (n_reads >= THREADED_MIN_READS or n_bytes >= THREADED_MIN_BYTES) and self.workers > 1:
            pieces = [piece for p in plans for piece in p.split(self.workers)]
            for f in [_pool().submit(piece.run, out, gather) for piece in pieces]:
                f.result()
        else:
            for p in plans:
                p.run(out, gather)
        bad = nonfinite_rows(out, self.dtype)
        if len(bad):
            raise self._nonfinite(ids[bad])
        rows = torch.from_numpy(out)
        return rows.view(self.dtype) if self.dtype != torch.bool else rows.view(torch.bool)

    def _nonfinite(self, row_ids: np.ndarray) -> CheckpointError:
        """The error for non-finite rows (global ids), naming the file that holds the first one."""
        k = int(np.searchsorted(self.part_start, row_ids[0], side="right")) - 1
        part = self.parts[k]
        where = f"{part.path}: tensor {part.name!r}"
        if len(self.parts) > 1:
            where += f" (part {k} of {len(self.parts)}; row ids count over all parts)"
        return nonfinite_error(where, self.dtype, row_ids)

    def _plan(self, part: TensorInfo, local: np.ndarray, out_start: int, gap_bytes: int) -> _ReadPlan:
        """Coalesce sorted local row ids into reads: rows fewer than ``gap_bytes`` apart share one
        read, and no read crosses a MAX_READ_BYTES-aligned block of the tensor."""
        rb = self.row_bytes
        gap_rows = max(0, gap_bytes // rb)
        block = local // max(1, MAX_READ_BYTES // rb)
        cut = (np.diff(local) - 1 > gap_rows) | (np.diff(block) != 0)
        breaks = np.nonzero(cut)[0] + 1
        starts = np.concatenate([[0], breaks])
        ends = np.concatenate([breaks, [len(local)]])
        firsts = local[starts]
        spans = local[ends - 1] - firsts + 1
        return _ReadPlan(
            self._fd(part.path),
            part.start,
            rb,
            local,
            out_start,
            starts,
            ends,
            firsts,
            spans,
            f"{part.path}: tensor {part.name!r}",
        )


@dataclass
class _ReadPlan:
    """The preads of one tensor part: read r covers local rows ``local[starts[r]:ends[r]]``,
    which span ``spans[r]`` rows from row ``firsts[r]``; they land at ``out[out_start + starts[r]:]``."""

    fd: int
    base: int
    row_bytes: int
    local: np.ndarray
    out_start: int
    starts: np.ndarray
    ends: np.ndarray
    firsts: np.ndarray
    spans: np.ndarray
    what: str

    def split(self, n: int) -> list[_ReadPlan]:
        """The reads in up to ``n`` pieces of consecutive reads."""
        return [self._reads(c) for c in np.array_split(np.arange(len(self.starts)), n) if len(c)]

    def _reads(self, which) -> _ReadPlan:
        """The plan of the reads ``which`` (an index or slice of the reads)."""
        pick = {k: getattr(self, k)[which] for k in ("starts", "ends", "firsts", "spans")}
        return replace(self, **pick)

    def nbytes(self) -> int:
        return int(self.spans.sum()) * self.row_bytes

    def run(self, out: np.ndarray, gather: GatherReads | None) -> None:
        """The reads into ``out`` by ``gather``, the compiled read loop (``pread_kernel``), or when
        None (or from a read it found short: the file may end early) from Python."""
        if gather is not None:
            scratch = np.empty(scratch_bytes(self.row_bytes, self.starts, self.ends, self.spans), dtype=np.uint8)
            rows = out[self.out_start : self.out_start + len(self.local)].reshape(-1)
            args = (self.local, self.starts, self.ends, self.firsts, self.spans, rows, scratch)
            done = gather(self.fd, self.base, self.row_bytes, *args)
            if done == len(self.starts):
                return
            self._reads(slice(done, None)).run(out, None)
            return
        self._run_python(out)

    def _run_python(self, out: np.ndarray) -> None:
        """The reads in batches of at most BATCH_BYTES, each batch read into one scratch buffer
        (reused: its pages are touched once) by ``os.preadv`` calls issued from C (``map``, no
        bytecode per read), then the wanted rows picked out with one vectorised index into ``out``."""
        ends = np.cumsum(self.spans * self.row_bytes)
        scratch = np.empty(min(int(ends[-1]), BATCH_BYTES) if len(ends) else 0, dtype=np.uint8)
        first = 0
        while first < len(ends):
            base = int(ends[first - 1]) if first else 0
            last = max(first + 1, int(np.searchsorted(ends, base + BATCH_BYTES, side="right")))
            size = int(ends[last - 1]) - base
            if size > len(scratch):  # one read larger than a batch
                scratch = np.empty(size, dtype=np.uint8)
            self._run_batch(out, first, last, scratch[:size])
            first = last

    def _run_batch(self, out: np.ndarray, a: int, b: int, buf: np.ndarray) -> None:
        rb = self.row_bytes
        firsts, spans = self.firsts[a:b], self.spans[a:b]
        stops = np.cumsum(spans) * rb
        offsets = self.base + firsts * rb
        mv = memoryview(buf)
        views = [[mv[i:j]] for i, j in zip([0, *stops[:-1].tolist()], stops.tolist())]
        got = sum(map(os.preadv, repeat(self.fd, len(views)), views, offsets.tolist()))
        if got != len(buf):  # a short read: the file ends early (or a rare partial read): redo exactly
            begins = np.concatenate([[0], stops[:-1]])
            for r in range(len(firsts)):
                pread_into(self.fd, mv[begins[r] : stops[r]], int(offsets[r]), self.what)
        rows = buf.reshape(-1, rb)
        lo, hi = int(self.starts[a]), int(self.ends[b - 1])
        o = self.out_start
        if len(rows) == hi - lo:  # every row read was wanted: no gap rows to drop
            out[o + lo : o + hi] = rows
        else:
            counts = self.ends[a:b] - self.starts[a:b]
            pos = np.repeat(stops // rb - spans - firsts, counts) + self.local[lo:hi]
            np.take(rows, pos, axis=0, out=out[o + lo : o + hi])


def _close_fds(fds: dict) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()
