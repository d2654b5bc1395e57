"""Sorted runs of n-gram counts on disk and their external merge: the bounded-memory store behind
``NgramCounts(memory_limit=...)``.

A *run* is one sorted, duplicate-free array of packed keys ``lo`` (uint64) with their counts
(int64), for one n-gram order and key group, written as two raw binary files. When an
accumulator's distinct keys outgrow its memory budget it writes its whole in-memory store as one
run per (order, group) and starts empty again; reading merges every run of an (order, group)
(plus what is still in memory) in one streaming k-way pass into a single run, read back
memory-mapped. The pass reads its input runs by plain file reads (``FileArray``), so pages it
has passed do not stay mapped (and counted in the resident memory) until it ends. The merge takes, from every run, the keys up to the smallest of the runs' chunk
ends, so each step holds about ``chunk`` keys per run; equal keys sum their counts. The result is
exactly the in-memory ``merge_sorted`` of all the runs: tables come out byte-identical.

The runs live in a temporary folder ``PREFIXxxxxxxxx.tmp`` made on the first spill under ``parent``
(the system's temporary folder by default) and removed when the store is closed or collected, or
at exit; ``run_corpus`` names it so that a killed run's folder is cleared by the next run.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engram_viz._compiled import compiled_kernel
from engram_viz._files import atomic_writer
from engram_viz.errors import MemoryLimitError, WriteError

KEY_BYTES = 16  # a distinct key costs 8 bytes of key and 8 of count
MERGE_MIN = 1 << 18  # keys from which two runs are merged by the compiled loop (numba)
MIN_CHUNK = 1 << 12  # keys per run per merge step, at least
MAX_MEMORY_LIMIT = 1 << 60  # 1 EiB: past any machine's memory, and far inside int64
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 2**10, "m": 1e6, "mb": 1e6, "mib": 2**20}
_UNITS.update({"g": 1e9, "gb": 1e9, "gib": 2**30, "t": 1e12, "tb": 1e12, "tib": 2**40})


def parse_memory_limit(value: str | int | None) -> int | None:
    """``"2GB"``, ``"512MiB"``, ``"64k"``, ``"1000000"`` or an int -> bytes (None stays None); at
    least 1 byte and at most :data:`MAX_MEMORY_LIMIT`, else MemoryLimitError."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise MemoryLimitError(f"memory limit must be bytes or a size like 2GB, got {value!r}")
    if isinstance(value, int):
        size = value
    else:
        text = str(value).strip().lower().replace(" ", "")
        number = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        try:
            amount = float(number) * _UNITS[text[len(number) :]]
        except (ValueError, KeyError):
            raise MemoryLimitError(
                f"memory limit {value!r} is not a size; expected bytes or a number with a unit like 2GB or 512MiB"
            ) from None
        if not math.isfinite(amount) or amount > MAX_MEMORY_LIMIT:
            raise MemoryLimitError(f"memory limit {value!r} is too large; expected at most 1EiB")
        size = int(amount)
    if not 1 <= size <= MAX_MEMORY_LIMIT:
        raise MemoryLimitError(f"memory limit must be from 1 byte to 1EiB (bytes or a size like 2GB), got {value!r}")
    return size


def _merge_loop(ak, ac, bk, bc):  # pragma: no cover - compiled by numba (_merge_kernel)
    """Two sorted unique runs merged in one linear pass, equal keys' counts summed."""
    keys = np.empty(ak.shape[0] + bk.shape[0], np.uint64)
    counts = np.empty(ak.shape[0] + bk.shape[0], np.int64)
    i = j = u = 0
    while i < ak.shape[0] and j < bk.shape[0]:
        if ak[i] < bk[j]:
            keys[u], counts[u] = ak[i], ac[i]
            i += 1
        elif bk[j] < ak[i]:
            keys[u], counts[u] = bk[j], bc[j]
            j += 1
        else:
            keys[u], counts[u] = ak[i], ac[i] + bc[j]
            i += 1
            j += 1
        u += 1
    while i < ak.shape[0]:
        keys[u], counts[u] = ak[i], ac[i]
        i += 1
        u += 1
    while j < bk.shape[0]:
        keys[u], counts[u] = bk[j], bc[j]
        j += 1
        u += 1
    return keys[:u], counts[:u]


@functools.lru_cache(maxsize=1)
def _merge_kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_merge_loop)
    signature = "Tuple((uint64[::1], int64[::1]))(uint64[::1], int64[::1], uint64[::1], int64[::1])"
    return compiled_kernel(source, "run_merge", "_merge_loop", signature, nogil=True, boundscheck=False)


def _merge_two(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Two sorted unique runs into one: by the compiled linear merge (numba) from ``MERGE_MIN``
    keys or once it is loaded, else ``b``'s keys go to their insertion points in ``a`` (one search, keys ascending),
    each before an equal key of ``a``, whose counts are then summed into one (no sort, no gather)."""
    (ak, ac), (bk, bc) = a, b
    loaded = _merge_kernel.cache_info().currsize  # once loaded, the compiled loop is the faster at any size
    kernel = _merge_kernel() if loaded or len(ak) + len(bk) >= MERGE_MIN else None
    if kernel is not None:
        c = np.ascontiguousarray
        return kernel(c(ak, dtype=np.uint64), c(ac, dtype=np.int64), c(bk, dtype=np.uint64), c(bc, dtype=np.int64))
    n = len(ak) + len(bk)
    at = np.searchsorted(ak, bk)
    at += np.arange(len(bk))  # b's places in the merged run
    from_a = np.ones(n, dtype=bool)
    from_a[at] = False
    keys, counts = np.empty(n, dtype=np.uint64), np.empty(n, dtype=np.int64)
    keys[at], counts[at] = bk, bc
    keys[from_a], counts[from_a] = ak, ac
    equal = np.flatnonzero(keys[1:] == keys[:-1])  # a key of b, then the same key of a
    if len(equal):
        counts[equal] += counts[equal + 1]
        keep = np.ones(n, dtype=bool)
        keep[equal + 1] = False
        keys, counts = keys[keep], counts[keep]
    return keys, counts


def merge_sorted(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge sorted unique (keys, counts) runs: sum the counts of equal keys. Runs are merged in
    pairs, the two shortest first (as a Huffman tree: each key is copied about log(runs) times)."""
    runs = sorted((p for p in parts if len(p[0])), key=lambda p: len(p[0]))
    if not runs:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    while len(runs) > 1:
        merged = _merge_two(runs[0], runs[1])
        runs = sorted([*runs[2:], merged], key=lambda p: len(p[0]))
    return runs[0]


@dataclass
class Run:
    """One sorted run on disk: ``length`` keys in ``stem.keys`` (uint64), counts in ``stem.counts``."""

    stem: Path
    length: int

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.length:
            return np.empty(0, np.uint64), np.empty(0, np.int64)
        keys = np.memmap(self.stem.with_suffix(".keys"), np.uint64, "r", shape=(self.length,))
        counts = np.memmap(self.stem.with_suffix(".counts"), np.int64, "r", shape=(self.length,))
        return np.asarray(keys), np.asarray(counts)

    def readers(self) -> tuple[FileArray, FileArray]:
        """``(keys, counts)`` read by slices as the merge advances (nothing stays mapped)."""
        return FileArray(self.stem.with_suffix(".keys"), np.uint64, self.length), FileArray(
            self.stem.with_suffix(".counts"), np.int64, self.length
        )


@dataclass
class FileArray:
    """A raw binary array on disk, read by index or slice (step 1) with plain file reads: what a
    merge has read does not stay mapped in the process, so its resident memory is its chunks,
    not every run it has passed through (as with memory-mapped runs)."""

    path: Path
    dtype: type
    length: int

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int | slice) -> np.ndarray:
        if isinstance(index, slice):
            start, stop, step = index.indices(self.length)
            if step != 1:
                raise ValueError("FileArray reads contiguous slices only")
        else:
            start = index + self.length if index < 0 else index
            if not 0 <= start < self.length:
                raise IndexError(f"index {index} out of range for {self.length} items")
            stop = start + 1
        size = np.dtype(self.dtype).itemsize
        with self.path.open("rb") as fh:
            out = np.fromfile(fh, self.dtype, max(0, stop - start), offset=start * size)
        return out if isinstance(index, slice) else out[0]


def external_merge(runs: list[tuple], chunk: int, write) -> int:
    """Stream the k-way merge of sorted unique runs (arrays, or ``FileArray`` pairs read as the
    merge advances) into ``write(keys, counts)`` in key order, about ``chunk`` keys per run per
    step; returns the number of keys written."""
    pos, total = [0] * len(runs), 0
    while True:
        live = [i for i, (k, _) in enumerate(runs) if pos[i] < len(k)]
        if not live:
            return total
        cutoff = min(runs[i][0][min(pos[i] + chunk, len(runs[i][0])) - 1] for i in live)
        parts = []
        for i in live:
            keys, counts = runs[i]
            window = keys[pos[i] : pos[i] + chunk]
            take = int(np.searchsorted(window, cutoff, side="right"))  # later keys are > cutoff
            parts.append((np.array(window[:take]), np.array(counts[pos[i] : pos[i] + take])))
            pos[i] += take
        keys, counts = merge_sorted(parts)
        write(keys, counts)
        total += len(keys)


def _write_array(fh, a: np.ndarray, dtype: type) -> None:
    """``a`` as raw ``dtype`` bytes, by a plain file write (no copy): a failed write keeps the
    system's reason (numpy's ``tofile`` says only "N requested and M written")."""
    fh.write(memoryview(np.ascontiguousarray(a, dtype)).cast("B"))


def _mount_point(path: Path) -> Path:
    """The mount point of the disk that holds ``path`` (an existing folder)."""
    path = Path(os.path.realpath(path))
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path


def _disk(folder: Path) -> str:
    """The disk of ``folder`` in words: its mount point and free space (if it can be read)."""
    try:
        usage = shutil.disk_usage(folder)
    except OSError:
        return f"the disk mounted at {_mount_point(folder)}"
    return f"the disk mounted at {_mount_point(folder)}, {usage.free:,} of {usage.total:,} bytes free"


class SpillStore:
    """The runs of one accumulator, by ``(order, group)``, in a temporary folder under ``parent``.
    ``memory_limit``: the accumulator's budget that makes it spill (named when a spill cannot be
    written: a full disk, a file size limit)."""

    def __init__(
        self,
        parent: str | Path | None = None,
        prefix: str = "engram-spill-",
        chunk_bytes: int = 1 << 26,
        memory_limit: int | None = None,
    ):
        self.parent, self.prefix = (None if parent is None else Path(parent)), prefix
        self.chunk_bytes = chunk_bytes
        self.memory_limit = memory_limit
        self.runs: dict[tuple[int, int], list[Run]] = {}
        self._folder: tempfile.TemporaryDirectory | None = None
        self._serial = 0

    def _stem(self) -> Path:
        if self._folder is None:
            if self.parent is not None:
                self.parent.mkdir(parents=True, exist_ok=True)
            self._folder = tempfile.TemporaryDirectory(suffix=".tmp", prefix=self.prefix, dir=self.parent)
        self._serial += 1
        return Path(self._folder.name) / f"run{self._serial:06d}"

    @contextlib.contextmanager
    def _writing(self, what: str) -> Iterator[None]:
        """A failed write of the runs (a full disk: numpy says only "N requested and M written") as
        ``WriteError`` naming the folder, its disk and the memory limit that made the store spill."""
        try:
            yield
        except OSError as err:
            folder = Path(self._folder.name) if self._folder else (self.parent or Path(tempfile.gettempdir()))
            limit = (
                "no memory limit" if self.memory_limit is None else f"the memory limit of {self.memory_limit:,} bytes"
            )
            raise WriteError(
                f"could not {what} in {folder} ({_disk(folder)}): "
                f"{err.strerror or err}; the n-gram counts spill there past {limit} (--memory-limit): "
                "free space on that disk, or raise the limit"
            ) from None

    def write(self, order: int, group: int, keys: np.ndarray, counts: np.ndarray) -> None:
        """Add one sorted unique run of ``(order, group)``."""
        with self._writing(f"spill {len(keys):,} n-gram counts to disk"):
            stem = self._stem()
            with atomic_writer(stem.with_suffix(".keys")) as fh:
                _write_array(fh, keys, np.uint64)
            with atomic_writer(stem.with_suffix(".counts")) as fh:
                _write_array(fh, counts, np.int64)
        self.runs.setdefault((order, group), []).append(Run(stem, len(keys)))

    def groups(self, order: int) -> set[int]:
        return {g for (o, g) in self.runs if o == order}

    def merged(self, order: int, group: int, extra: tuple[np.ndarray, np.ndarray] | None):
        """Every run of ``(order, group)`` plus ``extra`` (in memory) merged into one run, which
        replaces them: ``(keys, counts)`` memory-mapped."""
        old = self.runs.pop((order, group), [])
        extra = [extra] if extra is not None and len(extra[0]) else []
        if len(old) == 1 and not extra:
            self.runs[(order, group)] = old
            return old[0].arrays()
        parts = [r.readers() for r in old] + extra
        chunk = max(MIN_CHUNK, self.chunk_bytes // (KEY_BYTES * max(1, len(parts))))
        with self._writing(f"merge {len(parts)} spilled runs of n-gram counts"):
            stem = self._stem()
            with atomic_writer(stem.with_suffix(".keys")) as fk, atomic_writer(stem.with_suffix(".counts")) as fc:
                length = external_merge(
                    parts, chunk, lambda k, c: (_write_array(fk, k, np.uint64), _write_array(fc, c, np.int64))
                )
        del parts
        for r in old:
            r.stem.with_suffix(".keys").unlink(missing_ok=True)
            r.stem.with_suffix(".counts").unlink(missing_ok=True)
        run = Run(stem, length)
        self.runs[(order, group)] = [run]
        return run.arrays()

    def __bool__(self) -> bool:
        return bool(self.runs)

    def close(self) -> None:
        """Remove the runs and their folder."""
        self.runs = {}
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None
