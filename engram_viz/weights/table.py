"""The Engram table: fp8 e4m3 rows with one e8m0 scale per 32 features (reference section 4).

One interface, three backings:

- ``InMemoryTable(weight, scale)``: the tensors in memory (any device).
- ``LazyTable``: rows read on demand from one or more safetensors files. The header is parsed
  here (8-byte little-endian length + JSON) and validated against the file size; a gather reads
  only the byte ranges of the requested rows with ``os.pread`` (adjacent rows coalesced into one
  read), so a 98 GB table is never materialised and resident memory grows only by the rows asked
  for. A table row-split over several files (the inference-converted ``model{i}-mp{n}``
  layout, part ``i`` holding rows ``[i * part, (i + 1) * part)``) reads as one table.
- ``ProceduralTable(num_rows, head_dim, seed)``: a synthetic table whose row r is a fixed
  function of ``(seed, r)``, so the real dimensions (384M rows) run without 98 GB.

Every gather validates ids (``RowIdError`` names the id and the range), takes the sorted unique
ids, reads each unique row once and expands with the inverse index. ``table(row_ids)`` is the
reference lookup ``fp8.dequantize_rows(*table.gather_fp8(row_ids))`` -> bf16 ``[..., head_dim]``.

The generic lazy reader (``LazyRows``) serves any 2D tensor of a safetensors file; the token
embedding ``embed.weight`` (bf16 ``[vocab, dim]``) is read through it by ``TokenEmbedding``.
"""

from __future__ import annotations

import json
import math
import os
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from engram_viz.config import FP8_BLOCK_SIZE
from engram_viz.core import fp8

MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library refuses larger headers too

# safetensors dtype string -> (torch dtype, bytes per element)
SAFETENSORS_DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "F64": (torch.float64, 8),
    "F32": (torch.float32, 4),
    "F16": (torch.float16, 2),
    "BF16": (torch.bfloat16, 2),
    "I64": (torch.int64, 8),
    "I32": (torch.int32, 4),
    "I16": (torch.int16, 2),
    "I8": (torch.int8, 1),
    "U8": (torch.uint8, 1),
    "BOOL": (torch.bool, 1),
    "F8_E4M3": (torch.float8_e4m3fn, 1),
    "F8_E5M2": (torch.float8_e5m2, 1),
    "F8_E8M0": (torch.float8_e8m0fnu, 1),
}
TORCH_TO_SAFETENSORS = {dt: name for name, (dt, _) in SAFETENSORS_DTYPES.items()}

COALESCE_GAP_BYTES = 4096  # rows closer than this are read in one pread (gap bytes discarded)
MAX_READ_BYTES = 16 * 2**20  # one pread never asks for more than this
THREADED_MIN_READS = 4096  # below this many reads a gather stays on the calling thread
DEQUANT_CHUNK_ROWS = 4096  # bounds the float32 temporaries of dequantisation (4 MB each at head_dim 256)


class CheckpointError(ValueError):
    """A checkpoint or safetensors file is missing, corrupt, truncated or does not match the config."""


class RowIdError(CheckpointError):
    """A row id (table row or token id) outside the table."""


# --------------------------------------------------------------------------------------------
# safetensors headers


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie in a safetensors file (offsets are absolute file offsets)."""

    path: Path
    name: str
    dtype: str  # safetensors dtype string, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{self.path}: tensor {self.name!r} has dtype {self.dtype}, which engram-viz cannot read"
            )
        return SAFETENSORS_DTYPES[self.dtype][0]

    @property
    def itemsize(self) -> int:
        return SAFETENSORS_DTYPES[self.dtype][1]


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed and validated safetensors header."""

    path: Path
    file_size: int
    data_start: int  # 8 + header length
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Parse and validate the header of a safetensors file (without touching its data).

    Checks: the length prefix fits the file, the JSON parses to an object, every entry has a
    dtype string, a non-negative integer shape and ``data_offsets`` whose length equals
    ``numel * itemsize`` (for dtypes engram-viz knows), and every tensor's bytes lie inside the
    file (otherwise the file is reported as truncated). Tensors of unknown dtypes (e.g. packed
    fp4 experts) are listed but cannot be read.
    """
    path = Path(path)
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header: the file has {file_size} bytes, fewer than the 8-byte length prefix"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header: header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"
                )
            if 8 + n > file_size:
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors header: header length {n} runs past the end of the file ({file_size} bytes)"
                )
            raw = fh.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"safetensors file {path} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a directory, expected a safetensors file") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{path}: corrupt safetensors header: not valid UTF-8 JSON ({err})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, got {type(doc).__name__}")
    data_start = 8 + n
    data_size = file_size - data_start
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: __metadata__ must be an object")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in doc.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise CheckpointError(f"{where}: corrupt header entry, expected an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not isinstance(dtype, str):
            raise CheckpointError(f"{where}: corrupt header entry, dtype must be a string, got {dtype!r}")
        if not isinstance(shape, list) or not all(
            isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
        ):
            raise CheckpointError(
                f"{where}: corrupt header entry, shape must be a list of non-negative ints, got {shape!r}"
            )
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1]
        ):
            raise CheckpointError(
                f"{where}: corrupt header entry, data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}"
            )
        begin, end = offsets
        if dtype in SAFETENSORS_DTYPES:
            want = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
            if end - begin != want:
                raise CheckpointError(
                    f"{where}: corrupt header entry, {dtype} {shape} needs {want} bytes but data_offsets span {end - begin}"
                )
        if end > data_size:
            raise CheckpointError(
                f"{where}: truncated file: the tensor's bytes end at data offset {end} but the file holds only "
                f"{data_size} data bytes ({file_size} bytes in all)"
            )
        tensors[name] = TensorInfo(path, name, dtype, tuple(shape), data_start + begin, data_start + end)
    return SafetensorsHeader(path, file_size, data_start, tensors, {str(k): str(v) for k, v in metadata.items()})


def create_sparse_safetensors(
    path: str | Path, specs: dict[str, tuple[str, Sequence[int]]], metadata: dict[str, str] | None = None
) -> SafetensorsHeader:
    """Write a safetensors file of the given tensors (name -> (dtype string, shape)) whose data is a
    hole: a handwritten header, then ``truncate`` to the full size, so a 98 GB table takes no disk
    and reads as zeros. For memory tests and benchmarks at the real dimensions; fill rows with
    ``os.pwrite`` at ``header.tensors[name].start + row * row_bytes``. Written atomically."""
    path = Path(path)
    doc: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (dtype, shape) in specs.items():
        if dtype not in SAFETENSORS_DTYPES:
            raise ValueError(f"tensor {name!r}: unknown dtype {dtype!r}; expected one of {sorted(SAFETENSORS_DTYPES)}")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        doc[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps(doc, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # align the data to 8 bytes, as the safetensors writer does
    tmp = path.with_name(f".{path.name}.partial")
    try:
        with open(tmp, "wb") as fh:
            fh.write(struct.pack("<Q", len(header)) + header)
            fh.truncate(8 + len(header) + offset)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return read_safetensors_header(path)


def _pread_into(fd: int, buf: memoryview, offset: int, what: str) -> None:
    """Fill ``buf`` from ``offset`` (looping over short reads); a read past EOF means truncation."""
    done, total = 0, len(buf)
    while done < total:
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got == 0:
            raise CheckpointError(
                f"{what}: truncated file: read stopped at byte {offset + done}, expected {total - done} more bytes"
            )
        done += got


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """Read one whole tensor eagerly (CPU), bit for bit as stored."""
    dtype = info.torch_dtype
    out = np.empty(info.nbytes, dtype=np.uint8)
    fd = os.open(info.path, os.O_RDONLY)
    try:
        _pread_into(fd, memoryview(out), info.start, f"{info.path}: tensor {info.name!r}")
    finally:
        os.close(fd)
    flat = torch.from_numpy(out)
    if dtype == torch.bool:
        return flat.view(torch.bool).reshape(info.shape)
    return flat.view(dtype).reshape(info.shape)


# --------------------------------------------------------------------------------------------
# row ids


def check_row_ids(row_ids, num_rows: int, what: str) -> torch.Tensor:
    """Validate row ids (a tensor of any shape, or anything ``torch.as_tensor`` takes) -> int64.

    Raises ``TypeError`` for non-integer ids and ``RowIdError`` naming a bad id (the smallest
    negative or the largest too large), the table and the valid range.
    """
    ids = row_ids if isinstance(row_ids, torch.Tensor) else torch.as_tensor(np.asarray(row_ids))
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise TypeError(f"row ids for {what} must be integers, got {ids.dtype}")
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


def _unique(ids: torch.Tensor) -> tuple[np.ndarray, torch.Tensor]:
    """Sorted unique ids (numpy int64) of an id tensor of any shape and the flat inverse index (CPU)."""
    flat = ids.detach().reshape(-1).cpu().numpy()
    uniq, inv = np.unique(flat, return_inverse=True)
    return uniq.astype(np.int64, copy=False), torch.from_numpy(inv.reshape(-1).astype(np.int64, copy=False))


_WIDE = (torch.int64, torch.int32, torch.int16)


def _expand(rows: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
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


# --------------------------------------------------------------------------------------------
# row sources: any 2D tensor, read by rows


class RowSource:
    """Rows of a 2D tensor ``[num_rows, cols]`` of one dtype, read by sorted unique ids."""

    num_rows: int
    cols: int
    dtype: torch.dtype
    label: str

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        """Rows of sorted unique, already validated int64 ids ``[n]`` -> CPU ``[n, cols]``."""
        raise NotImplementedError

    def gather(self, row_ids) -> torch.Tensor:
        """Rows of ids of any shape ``[...]`` -> ``[..., cols]`` on the ids' device."""
        ids = check_row_ids(row_ids, self.num_rows, self.label)
        uniq, inv = _unique(ids)
        rows = self.read_unique(uniq)
        out = _expand(rows, inv).reshape(*ids.shape, self.cols)
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
            raise ValueError("LazyRows needs at least one tensor part")
        first = parts[0]
        for p in parts:
            where = f"{p.path}: tensor {p.name!r}"
            p.torch_dtype  # noqa: B018 - raises for unreadable dtypes
            if len(p.shape) != 2:
                raise CheckpointError(f"{where}: expected a 2D tensor to read by rows, got shape {list(p.shape)}")
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

    def close(self) -> None:
        """Close the file descriptors (they reopen on the next read)."""
        with self._lock:
            _close_fds(self._fds)

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
        plans = []
        bounds = np.searchsorted(ids, self.part_start)
        for k, part in enumerate(self.parts):
            a, b = int(bounds[k]), int(bounds[k + 1])
            if a < b:
                plans.append(self._plan(part, ids[a:b] - self.part_start[k], a))
        n_reads = sum(len(p.starts) for p in plans)
        if n_reads >= THREADED_MIN_READS and self.workers > 1:
            pieces = [piece for p in plans for piece in p.split(self.workers)]
            for f in [_pool().submit(piece.run, out) for piece in pieces]:
                f.result()
        else:
            for p in plans:
                p.run(out)
        rows = torch.from_numpy(out)
        return rows.view(self.dtype) if self.dtype != torch.bool else rows.view(torch.bool)

    def _plan(self, part: TensorInfo, local: np.ndarray, out_start: int) -> _ReadPlan:
        """Coalesce sorted local row ids into reads: rows closer than COALESCE_GAP_BYTES share one
        read, and no read crosses a MAX_READ_BYTES-aligned block of the tensor."""
        rb = self.row_bytes
        gap_rows = max(0, COALESCE_GAP_BYTES // rb)
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
        cuts = np.array_split(np.arange(len(self.starts)), n)
        return [
            _ReadPlan(
                self.fd,
                self.base,
                self.row_bytes,
                self.local,
                self.out_start,
                self.starts[c],
                self.ends[c],
                self.firsts[c],
                self.spans[c],
                self.what,
            )
            for c in cuts
            if len(c)
        ]

    def run(self, out: np.ndarray) -> None:
        rb, base, fd, preadv = self.row_bytes, self.base, self.fd, os.preadv
        flat = memoryview(out.reshape(-1))
        o = self.out_start
        for s, e, first, span in zip(
            self.starts.tolist(), self.ends.tolist(), self.firsts.tolist(), self.spans.tolist()
        ):
            n = e - s
            if span == n:  # dense run: read straight into the output
                dst = flat[(o + s) * rb : (o + e) * rb]
                if preadv(fd, [dst], base + first * rb) != n * rb:
                    _pread_into(fd, dst, base + first * rb, self.what)
            else:
                buf = np.empty((span, rb), dtype=np.uint8)
                _pread_into(fd, memoryview(buf.reshape(-1)), base + first * rb, self.what)
                out[o + s : o + e] = buf[self.local[s:e] - first]


def _close_fds(fds: dict) -> None:
    for fd in fds.values():
        try:
            os.close(fd)
        except OSError:
            pass
    fds.clear()


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
        return _expand(self.tensor, torch.from_numpy(np.asarray(ids, dtype=np.int64)).to(self.tensor.device)).cpu()


# --------------------------------------------------------------------------------------------
# procedural values


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
        raise ValueError(f"procedural rows need an even column count, got {cols}")
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


# --------------------------------------------------------------------------------------------
# tables


class EngramTable:
    """An Engram table: e4m3 rows ``[num_rows, head_dim]`` with e8m0 scales ``[num_rows, head_dim / 32]``.

    Subclasses implement ``_gather_unique(ids)`` for sorted unique validated ids.
    """

    num_rows: int
    head_dim: int
    label: str
    synthetic: bool = False

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def _check(self, row_ids) -> torch.Tensor:
        return check_row_ids(row_ids, self.num_rows, self.label)

    def gather_fp8(self, row_ids) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows of ids ``[...]``: weight float8_e4m3fn ``[..., head_dim]`` and scale
        float8_e8m0fnu ``[..., head_dim / 32]``, on the ids' device, bit for bit as stored."""
        ids = self._check(row_ids)
        uniq, inv = _unique(ids)
        w, s = self._gather_unique(uniq)
        w = _expand(w, inv).reshape(*ids.shape, self.head_dim)
        s = _expand(s, inv).reshape(*ids.shape, self.head_dim // FP8_BLOCK_SIZE)
        return w.to(ids.device), s.to(ids.device)

    def __call__(self, row_ids) -> torch.Tensor:
        """The reference lookup: bf16 ``[..., head_dim]`` = ``fp8.dequantize_rows(*gather_fp8(row_ids))``.

        Each unique row is read once; dequantisation runs in chunks of positions (the same
        per-element arithmetic), so float32 temporaries stay small. The result is on the ids' device.
        """
        ids = self._check(row_ids)
        uniq, inv = _unique(ids)
        w, s = self._gather_unique(uniq)
        w, s, inv = w.to(ids.device), s.to(ids.device), inv.to(ids.device)
        out = torch.empty(inv.numel(), self.head_dim, dtype=torch.bfloat16, device=ids.device)
        for a in range(0, inv.numel(), DEQUANT_CHUNK_ROWS):
            idx = inv[a : a + DEQUANT_CHUNK_ROWS]
            out[a : a + DEQUANT_CHUNK_ROWS] = fp8.dequantize_rows(_expand(w, idx), _expand(s, idx))
        return out.reshape(*ids.shape, self.head_dim)

    lookup = __call__

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
        return _expand(self.weight, idx), _expand(self.scale, idx)


class LazyTable(EngramTable):
    """A table whose rows are read on demand from safetensors files (see ``LazyRows``)."""

    def __init__(
        self,
        weight: LazyRows,
        scale: LazyRows,
        num_rows: int | None = None,
        label: str | None = None,
        synthetic: bool = False,
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

    @classmethod
    def open(
        cls,
        paths: str | Path | Sequence[str | Path],
        weight_name: str,
        scale_name: str,
        num_rows: int | None = None,
        label: str | None = None,
        synthetic: bool = False,
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
        return cls(w, s, num_rows=num_rows, label=label or w.label, synthetic=synthetic)

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        return self.weight.read_unique(ids), self.scale.read_unique(ids)

    def materialize(self) -> InMemoryTable:
        """Read the whole table into memory (only sensible for small tables)."""
        ids = np.arange(self.num_rows, dtype=np.int64)
        w, s = self._gather_unique(ids)
        return InMemoryTable(w, s, label=f"{self.label} (in memory)", synthetic=self.synthetic)

    def close(self) -> None:
        self.weight.close()
        self.scale.close()


class ProceduralTable(EngramTable):
    """A synthetic table: row r is ``fp8.quantize_rows(procedural_values([r], head_dim, key))`` with
    ``key = procedural_key(seed, STREAM_TABLE)`` (see ``procedural_values``), so it needs no storage
    and any row of a 384M-row table costs the same. Values are near-normal (std ~1.15) before
    quantisation; scales are the power-of-two scales ``quantize_rows`` picks per 32 features.
    """

    synthetic = True

    def __init__(self, num_rows: int, head_dim: int, seed: int = 0, label: str | None = None):
        if num_rows <= 0 or head_dim <= 0 or head_dim % FP8_BLOCK_SIZE:
            raise ValueError(
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


# --------------------------------------------------------------------------------------------
# token embedding


class TokenEmbedding:
    """Rows of the token embedding ``embed.weight`` (bf16 ``[vocab_size, dim]``) by raw token id.

    ``rows(raw_ids [...])`` -> bf16 ``[..., dim]`` on the ids' device; backed by any ``RowSource``
    (lazy from safetensors, in memory) or procedural (``ProceduralEmbedding``).
    """

    def __init__(self, source: RowSource, label: str | None = None, synthetic: bool = False):
        if source.dtype != torch.bfloat16:
            raise CheckpointError(f"{source.label}: token embedding must be bfloat16 (BF16), got {source.dtype}")
        self.source = source
        self.num_rows, self.dim = source.num_rows, source.cols
        self.label = label or source.label
        self.synthetic = synthetic

    def rows(self, raw_ids) -> torch.Tensor:
        ids = check_row_ids(raw_ids, self.num_rows, f"token embedding ({self.label})")
        uniq, inv = _unique(ids)
        rows = self.source.read_unique(uniq).to(ids.device)
        return _expand(rows, inv).reshape(*ids.shape, self.dim)

    __call__ = rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_rows:,} x {self.dim}, {self.label})"


class _ProceduralSource(RowSource):
    def __init__(self, num_rows: int, cols: int, key: int, label: str):
        self.num_rows, self.cols, self.key, self.label = num_rows, cols, key, label
        self.dtype = torch.bfloat16

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        return procedural_values(ids, self.cols, self.key).to(torch.bfloat16)


class ProceduralEmbedding(TokenEmbedding):
    """Synthetic token embedding: row r is ``procedural_values([r], dim, procedural_key(seed,
    STREAM_EMBED))`` rounded to bf16 (values k/128, |k| <= 510, std ~1.15)."""

    def __init__(self, num_rows: int, dim: int, seed: int = 0, label: str | None = None):
        label = label or f"synthetic procedural token embedding ({num_rows:,} x {dim}, seed {seed})"
        super().__init__(
            _ProceduralSource(num_rows, dim, procedural_key(seed, STREAM_EMBED), label), label, synthetic=True
        )
        self.seed = seed


if sys.byteorder != "little":  # safetensors is little-endian; every byte view above assumes so
    raise ImportError("engram_viz.weights.table needs a little-endian machine")
