"""Rows read from the Hub, kept on disk: a bounded, checksummed cache of tensor rows by row id.

The store lives under ``settings.cache_dir()/hub-rows``. Each remote tensor has a folder of its own,
named by a hash of its repository, commit, file, ETag and tensor name (:func:`store_folder`), so rows
of another revision or of changed bytes are never taken for these. The rows one gather fetched are
written as one batch file ``<random>.rows``: the rows' bytes, then their int64 ids (``n`` rows of
``row_bytes`` take ``n * (row_bytes + 8)`` bytes), atomically and with a sha256 sidecar
(``_cache.cached_path``). When a store opens, a batch file its sidecar does not vouch for (edited,
truncated, an interrupted write) is deleted, never read; a batch file deleted later (by another run
keeping the bound) reads as rows not cached.

The bound: after each write the least recently used batch files under the root (by modification
time, which a hit renews) are deleted until the root holds at most ``$ENGRAM_VIZ_ROW_CACHE_MB``
(``settings.row_cache_bytes``; 0 keeps nothing). Memory holds only the index (16 bytes a row).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import threading
from pathlib import Path

import numpy as np

from engram_viz import settings
from engram_viz._cache import cached_path, checksum_path, is_verified

ROOT_NAME = "hub-rows"
SUFFIX = ".rows"
ID_BYTES = 8


def store_root() -> Path:
    """The folder every row store lives in."""
    return settings.cache_dir() / ROOT_NAME


def store_folder(*key: str) -> Path:
    """The folder of the rows identified by ``key`` (repository, commit, file, ETag, tensor)."""
    return store_root() / hashlib.sha256("\0".join(key).encode()).hexdigest()[:32]


class RowStore:
    """Rows ``[row_bytes]`` by row id in ``folder`` (see the module docstring)."""

    def __init__(self, folder: Path, row_bytes: int):
        self.folder, self.row_bytes = Path(folder), int(row_bytes)
        self.capacity = settings.row_cache_bytes()
        self._files: list[Path] = []
        self._counts: list[int] = []  # rows of each file
        self._ids = np.empty(0, dtype=np.int64)  # sorted; row _ids[k] is row _pos[k] of file _file[k]
        self._file = np.empty(0, dtype=np.int64)
        self._pos = np.empty(0, dtype=np.int64)
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        if not self.folder.is_dir():
            return
        for path in sorted(self.folder.glob(f"*{SUFFIX}")):
            size = path.stat().st_size if path.is_file() else -1
            if not is_verified(path) or size % (self.row_bytes + ID_BYTES):
                _remove(path)
                continue
            n = size // (self.row_bytes + ID_BYTES)
            ids = np.fromfile(path, dtype="<i8", offset=n * self.row_bytes)
            self._index(path, ids)

    def _index(self, path: Path, ids: np.ndarray) -> None:
        self._files.append(path)
        self._counts.append(len(ids))
        ids_all = np.concatenate([self._ids, ids])
        order = np.argsort(ids_all, kind="stable")
        self._ids = ids_all[order]
        self._file = np.concatenate([self._file, np.full(len(ids), len(self._files) - 1)])[order]
        self._pos = np.concatenate([self._pos, np.arange(len(ids))])[order]

    def lookup(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For sorted unique ``ids``: which are cached (bool ``[n]``) and their rows (uint8
        ``[hits, row_bytes]``, in the order of ``ids``)."""
        with self._lock:
            at = np.minimum(np.searchsorted(self._ids, ids), max(len(self._ids) - 1, 0))
            hit = (self._ids[at] == ids) if len(self._ids) else np.zeros(len(ids), dtype=bool)
            rows = np.empty((int(hit.sum()), self.row_bytes), dtype=np.uint8)
            where = np.nonzero(hit)[0]
            files, pos = self._file[at[hit]], self._pos[at[hit]]
            for f in np.unique(files):
                mine = files == f
                try:
                    shape = (self._counts[f], self.row_bytes)
                    rows[mine] = np.memmap(self._files[f], dtype=np.uint8, mode="r", shape=shape)[pos[mine]]
                    os.utime(self._files[f])  # recently used: evicted last
                except (OSError, ValueError):  # deleted (or cut) by another run since: not cached after all
                    hit[where[mine]] = False
            return hit, rows[hit[where]]

    def add(self, ids: np.ndarray, rows: np.ndarray) -> None:
        """Keep ``rows`` (uint8 ``[n, row_bytes]``) of sorted unique ``ids`` not kept yet as one batch
        file, then keep the bound."""
        if not self.capacity:
            return
        path = self.folder / f"{secrets.token_hex(8)}{SUFFIX}"
        with self._lock:
            at = np.minimum(np.searchsorted(self._ids, ids), max(len(self._ids) - 1, 0))
            fresh = self._ids[at] != ids if len(self._ids) else np.ones(len(ids), dtype=bool)
            ids, rows = ids[fresh], rows[fresh]  # rows kept already are not written twice
            if not len(ids):
                return
            self.folder.mkdir(parents=True, exist_ok=True)
            with cached_path(path) as tmp, open(tmp, "wb") as fh:
                fh.write(np.ascontiguousarray(rows, dtype=np.uint8).tobytes())
                fh.write(np.ascontiguousarray(ids, dtype="<i8").tobytes())
            self._index(path, np.asarray(ids, dtype=np.int64))
        evict(self.capacity)


def evict(capacity: int) -> None:
    """Delete the least recently used batch files under the root until it holds at most ``capacity`` bytes."""
    files = []
    for path in store_root().glob(f"*/*{SUFFIX}"):
        try:
            st = path.stat()
        except OSError:  # deleted meanwhile by another run
            continue
        files.append((st.st_mtime_ns, st.st_size, path))
    total = sum(size for _, size, _ in files)
    for _, size, path in sorted(files):
        if total <= capacity:
            break
        _remove(path)
        total -= size


def _remove(path: Path) -> None:
    for p in (path, checksum_path(path)):
        p.unlink(missing_ok=True)
