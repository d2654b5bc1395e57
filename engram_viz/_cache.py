"""Cached derived files with a checksum beside each: a tampered or damaged entry is rebuilt, never used.

Every file the suite derives and keeps in ``settings.cache_dir()`` (the compressed token map, the
default corpus text, the cached synthetic ``wkv``, the tiny LM's training n-gram counts) is written
through :func:`cached_path` (or :func:`cached`, which also reads it back), which writes the file
atomically (``_files.atomic_path``) and then its sidecar ``NAME.sha256`` (one line, ``sha256sum``
format: ``<hex digest>  NAME``). :func:`is_verified` is True only when both
exist and the file's sha256 equals the sidecar's. A reader calls it before trusting a cache entry
and rebuilds on False: an edited, truncated or swapped file, a missing or garbled sidecar, or a
write interrupted between the file and its sidecar all read as "not cached".

A cached *folder* (the tiny synthetic checkpoint) checks itself when it is opened: :func:`cached_folder`
opens it, and builds it whole through ``_files.atomic_folder`` when it is missing or does not open.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from engram_viz._files import atomic_folder, atomic_path, atomic_write_text

SIDECAR_SUFFIX = ".sha256"
T = TypeVar("T")


def file_sha256(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes, read 1 MiB at a time."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def checksum_path(path: str | os.PathLike) -> Path:
    """The sidecar of ``path``: ``NAME.sha256`` in the same folder."""
    path = Path(path)
    return path.with_name(path.name + SIDECAR_SUFFIX)


def write_checksum(path: str | os.PathLike) -> Path:
    """Write (atomically) the sidecar of an existing file; returns the sidecar's path."""
    path = Path(path)
    return atomic_write_text(checksum_path(path), f"{file_sha256(path)}  {path.name}\n")


def is_verified(path: str | os.PathLike) -> bool:
    """True when ``path`` is a file whose sha256 equals the one its sidecar records."""
    path, sidecar = Path(path), checksum_path(path)
    try:
        if not path.is_file() or not sidecar.is_file():
            return False
        recorded = sidecar.read_text(encoding="utf-8").split()
        return len(recorded) == 2 and recorded[1] == path.name and recorded[0] == file_sha256(path)
    except (OSError, UnicodeDecodeError):
        return False


@contextmanager
def cached_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Like ``_files.atomic_path``: yields a temporary path to write; on a clean exit it replaces
    ``path`` and the sidecar records its sha256. The stale sidecar goes first, so an interrupted
    rebuild never leaves a new file beside an old checksum that happens to be trusted."""
    checksum_path(path).unlink(missing_ok=True)
    with atomic_path(path, suffix=suffix) as tmp:
        yield tmp
    write_checksum(path)


def cached(
    path: str | os.PathLike,
    read: Callable[[Path], T | None],
    build: Callable[[], T],
    write: Callable[[T, Path], None],
    suffix: str = ".tmp",
) -> T:
    """The value kept at ``path``: ``read(path)`` when the sidecar vouches for the file and ``read``
    accepts it (None: it does not, e.g. a shape from an older build), else ``build()``, written
    there by ``write(value, tmp)`` through :func:`cached_path` and returned."""
    path = Path(path)
    if is_verified(path):
        value = read(path)
        if value is not None:
            return value
    value = build()
    with cached_path(path, suffix=suffix) as tmp:
        write(value, tmp)
    return value


def cached_folder(
    path: str | os.PathLike,
    open_folder: Callable[[Path], T],
    build: Callable[[Path], None],
    damaged: tuple[type[Exception], ...],
) -> T:
    """The folder kept at ``path``, opened: ``open_folder(path)`` when it opens (``damaged``: the
    errors that say it does not), else ``build(folder)`` fills a new one, swapped in whole by
    ``_files.atomic_folder`` (replacing a damaged one), and that is opened. When another process
    built it first (the build fails but a folder is there now), that one is opened."""
    path = Path(path)
    was_damaged = False
    if path.is_dir():
        try:
            return open_folder(path)
        except damaged:
            was_damaged = True
    try:
        with atomic_folder(path) as folder:
            build(folder)
    except OSError:
        if was_damaged or not path.is_dir():
            raise
    return open_folder(path)
