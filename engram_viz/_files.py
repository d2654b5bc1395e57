"""The one atomic writer: every file the suite writes goes through here.

A file is written to a temporary file in the target's folder (``.NAME.XXXX.tmp``), flushed and
fsynced, given the usual permissions (``0o666 & ~umask``; ``mkstemp`` alone would leave 0600), then
renamed over the target with ``os.replace``. On any exception (``KeyboardInterrupt`` included) the
temporary file is removed and the target is left as it was, so an interrupted write never leaves a
partial file. Parent folders are created.

- :func:`atomic_writer`: an open file object (``"wb"`` or ``"w"``).
- :func:`atomic_path`: a temporary path, for libraries that write to a path themselves
  (``df.to_parquet``, ``safetensors.torch.save_file``, ``np.save``, ``fig.savefig``).
- :func:`write_table`: a tidy frame as ``NAME.parquet`` and ``NAME.csv``.
- :func:`safe_name`: a file name made from a user's string (a prompt id, a category, a figure
  name): one path component, portable, unique among the names already given in its folder.
- :func:`write_npz` / :func:`read_npz`: named arrays as one ``.npz`` with a ``meta`` header (the
  n-gram counts, the row index).
- :func:`atomic_folder`: a whole run folder (``engram-viz report``, ``engram-viz corpus``), all or
  nothing: built beside the target in ``.NAME.new-XXXX.tmp``, then swapped in (the old folder renamed
  aside to ``.NAME.old-XXXX.tmp``, the new one renamed in, the old one deleted), under a lock on
  ``.NAME.lock`` so a second writer into the same folder fails at once naming the first one's pid.
  A failed or interrupted run leaves the previous folder as it was (and no folder where there was
  none); leftovers of a killed run (``.NAME.new-*.tmp``, ``.NAME.old-*.tmp``) are removed, or the
  previous folder restored, by the next run into the same folder.

A temporary file of :func:`atomic_path` left by a killed process (``.NAME.XXXXXXXX.tmp``) is removed
by the next write of the same file once it is an hour old.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

from engram_viz.errors import InputError, WriteError

TABLE_FORMATS = ("parquet", "csv")
STALE_TEMP_S = 3600  # a temporary file untouched this long belongs to a process that died
NAME_BYTES = 96  # a safe name's most characters: with ".png", a temp file's ".NAME.XXXXXXXX.tmp" stays < 255
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_RESERVED = {"CON", "PRN", "AUX", "NUL", *(f"COM{i}" for i in range(10)), *(f"LPT{i}" for i in range(10))}


def safe_name(text: str, taken: set[str] | None = None) -> str:
    """``text`` as one file-name component: ASCII letters, digits, ``_`` and ``-`` (every other run
    of characters becomes ``_``: path separators, NUL, and dots, so never ``..``, hidden or with a
    suffix that an exporter would take for its format), at most :data:`NAME_BYTES` characters, no
    Windows device name. A name
    changed on the way gets ``-`` and 8 hex digits of the sha256 of ``text``, so two texts that read
    alike stay apart. ``taken``: the names already given in the same folder; the result differs
    from each of them ignoring case (``-2``, ``-3``... added when needed) and is added to it."""
    name = _UNSAFE.sub("_", text)[:NAME_BYTES]
    if name != text or not name or name.upper() in _RESERVED:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        name = f"{name[: NAME_BYTES - 9]}-{digest}"
    if taken is None:
        return name
    used = {t.casefold() for t in taken}
    unique, n = name, 1
    while unique.casefold() in used:
        n += 1
        unique = f"{name[: NAME_BYTES - len(str(n)) - 1]}-{n}"
    taken.add(unique)
    return unique


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The permissions a plainly created file gets under the current umask."""
    return 0o666 & ~_umask()


def folder_mode() -> int:
    """The permissions a plainly created folder gets under the current umask."""
    return 0o777 & ~_umask()


def _remove_stale_temps(target: Path, suffix: str) -> None:
    """Temporary files of earlier writes of ``target`` whose process died (an hour untouched)."""
    pattern = re.compile(rf"\.{re.escape(target.name)}\.[a-z0-9_]{{8}}{re.escape(suffix)}")
    now = time.time()
    try:
        for entry in os.scandir(target.parent):
            if (
                pattern.fullmatch(entry.name)
                and entry.is_file(follow_symlinks=False)
                and now - entry.stat(follow_symlinks=False).st_mtime > STALE_TEMP_S
            ):
                Path(entry.path).unlink(missing_ok=True)
    except OSError:  # a folder we cannot list: the write itself will say why
        pass


def _write_error(target: Path, err: OSError) -> WriteError:
    if target.is_dir():
        return WriteError(f"cannot write the file {target}: a folder is in the way (remove it)")
    return WriteError(f"cannot write the file {target}: {err.strerror or err}")


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a clean exit the file written there replaces
    ``path``. ``suffix`` ends the temporary name (some writers pick the format from it). A target
    that cannot be written (a folder in its place, a file where its folder should be, no
    permission) raises :class:`WriteError` naming it."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temps(target, suffix)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    except OSError as err:
        raise _write_error(target, err) from None
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        try:
            os.replace(tmp, target)
        except OSError as err:
            raise _write_error(target, err) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """An open temporary file next to ``path`` (``mode`` ``"wb"`` or ``"w"``, UTF-8 by default for
    text); on a clean exit it replaces ``path``."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    with atomic_path(path) as tmp, open(tmp, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as fh:
        yield fh


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_writer(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def write_npz(path: str | os.PathLike, arrays: Mapping[str, np.ndarray]) -> Path:
    """``arrays`` as one uncompressed ``.npz`` (``np.savez``), written atomically; returns the path.
    The store files of the suite keep their header array under ``meta``."""
    with atomic_writer(path, "wb") as fh:
        np.savez(fh, **arrays)
    return Path(path)


@contextmanager
def read_npz(path: str | os.PathLike, what: str, error: type[Exception]) -> Iterator[tuple[np.ndarray, Any]]:
    """Open a ``.npz`` of :func:`write_npz`: yields ``(meta, data)``, its ``meta`` array and the open
    ``NpzFile`` (arrays by name, ``data.files``), closed on exit. A file numpy cannot read raises
    ``error("<what> file <path> is unreadable: <why>")``; the caller checks ``meta``."""
    try:
        data = np.load(path)
    except (OSError, ValueError) as err:
        raise error(f"{what} file {path} is unreadable: {err}") from None
    with data:
        yield data["meta"], data


def flatten_tuples(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet/CSV-friendly: columns of tuples (n-gram ids) become space-separated strings."""
    tuple_cols = [
        c
        for c in df.columns
        if df[c].dtype == object and len(df) and isinstance(df[c].iloc[0], (tuple, list, np.ndarray))
    ]
    if not tuple_cols:
        return df
    out = df.copy()
    for col in tuple_cols:
        out[col] = out[col].map(lambda v: " ".join(str(int(x)) for x in v))
    return out


def write_table(
    df: pd.DataFrame, out_dir: str | os.PathLike, name: str, formats: Sequence[str] = TABLE_FORMATS
) -> list[Path]:
    """``out_dir/NAME.parquet`` and ``out_dir/NAME.csv`` (no index), each atomic; returns the paths.
    ``NAME`` is ``name`` through :func:`safe_name` (unchanged for the suite's own table names)."""
    unknown = [f for f in formats if f not in TABLE_FORMATS]
    if unknown:
        raise InputError(f"table format {unknown[0]!r} unknown; expected one of {TABLE_FORMATS}")
    df = flatten_tuples(df).copy(deep=False)
    df.attrs = {}  # provenance rides with a frame in memory; on disk it is the manifest's, so tables stay plain
    paths, stem = [], safe_name(name)
    for fmt in formats:
        path = Path(out_dir) / f"{stem}.{fmt}"
        with atomic_path(path) as tmp:
            if fmt == "parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
        paths.append(path)
    return paths


# -- whole folders: build beside, swap in, under a lock

_LEFTOVER = r"\.{name}\.(?P<kind>new|old)-[A-Za-z0-9_]+\.tmp"


def _lock_holder(fd: int) -> str:
    try:
        text = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
    except OSError:
        text = ""
    return f"pid {text}" if text.isdigit() else "pid unknown"


@contextmanager
def folder_lock(target: Path, shown: str) -> Iterator[None]:
    """Hold ``.NAME.lock`` beside ``target`` (fcntl, released by the kernel if the process dies);
    a second holder fails at once with a :class:`WriteError` naming the first one's pid."""
    lock = target.parent / f".{target.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, file_mode())
        except OSError as err:
            raise WriteError(f"cannot create the output folder {shown!r}: {err.strerror or err}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _lock_holder(fd)
            os.close(fd)
            raise WriteError(
                f"another engram-viz run ({holder}) is writing into the output folder {shown!r}; "
                "wait for it to end or choose another folder"
            ) from None
        try:  # the file may have been removed by its previous holder between open and flock
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        lock.unlink(missing_ok=True)  # while still held, so nobody locks a file about to vanish
        os.close(fd)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def clear_leftovers(target: Path) -> None:
    """Remove what killed runs into ``target`` left beside it; a run killed between its two
    renames left no ``target`` but the previous folder aside: that one is put back."""
    pattern = re.compile(_LEFTOVER.format(name=re.escape(target.name)))
    found = [p for p in target.parent.iterdir() if pattern.fullmatch(p.name)]
    olds = sorted((p for p in found if pattern.fullmatch(p.name)["kind"] == "old"), key=lambda p: p.stat().st_mtime)
    if olds and not target.exists() and not target.is_symlink():
        os.rename(olds.pop(), target)
    for path in found:
        if path.exists() or path.is_symlink():
            _remove(path)


@contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done (main thread only), then act as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, lambda signum, frame: caught.append(signum)) for s in sigs}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for s in caught:
            if callable(previous[s]):
                previous[s](s, None)
            elif previous[s] == signal.SIG_DFL:
                os.kill(os.getpid(), s)


def _swap_in(build: Path, target: Path, pause: Callable[[str], None]) -> None:
    """Rename ``target`` aside, ``build`` in its place, then delete the old one."""
    aside = target.parent / f".{target.name}.old-{secrets.token_hex(6)}.tmp"
    with _signals_deferred():
        had_old = target.exists()
        if had_old:
            os.rename(target, aside)
        pause("swap")
        try:
            os.rename(build, target)
        except BaseException:
            if had_old:
                os.rename(aside, target)
            raise
        try:
            dir_fd = os.open(target.parent, os.O_RDONLY)
            os.fsync(dir_fd)
            os.close(dir_fd)
        except OSError:
            pass
    if had_old:
        shutil.rmtree(aside, ignore_errors=True)


def _check_target(target: Path, shown: str, marker: str | None) -> None:
    """An existing ``target`` must be a writable folder, empty or an earlier run (holds ``marker``)."""
    if not target.exists():
        return
    if not target.is_dir():
        raise WriteError(f"cannot write the output folder {shown!r}: it is a file")
    if not os.access(target, os.W_OK):
        raise WriteError(f"cannot write the output folder {shown!r}: it is read-only")
    if marker and not (target / marker).exists() and any(target.iterdir()):
        raise WriteError(
            f"the output folder {shown!r} holds files of something else (no {marker}); it would be "
            "replaced as a whole: choose a new or empty folder"
        )


def _make_parents(target: Path, shown: str) -> list[Path]:
    """Create ``target``'s missing parents; returns those created (deepest first)."""
    created = []
    parent = target.parent
    while not parent.exists() and not parent.is_symlink():
        created.append(parent)
        parent = parent.parent
    if not parent.is_dir():
        raise WriteError(f"cannot create the output folder {shown!r}: {str(parent)!r} is a file, not a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise WriteError(f"cannot create the output folder {shown!r}: {err.strerror or err}") from None
    return created


def _wrapped(shown: str, step: Callable[[], Any]) -> Any:
    """Run one of the folder's own steps; an OSError becomes a WriteError naming the folder."""
    try:
        return step()
    except WriteError:
        raise
    except OSError as err:
        raise WriteError(f"cannot write the output folder {shown!r}: {err.strerror or err}") from None


@contextmanager
def atomic_folder(
    path: str | os.PathLike, *, marker: str | None = None, pause: Callable[[str], None] | None = None
) -> Iterator[Path]:
    """Yield an empty folder built beside ``path``; on a clean exit it replaces ``path`` whole (see
    the module docstring). ``marker``: the file every complete run writes (``manifest.json``); a
    non-empty folder without it is not replaced. ``pause(stage)`` is called between the renames
    (a test hook). Any failure or interrupt removes the new folder and leaves ``path`` as it was;
    parents created for it are removed again."""
    shown = str(path)
    target = Path(os.path.realpath(path))
    created = _make_parents(target, shown)
    try:
        with folder_lock(target, shown):
            _wrapped(shown, lambda: clear_leftovers(target))
            _wrapped(shown, lambda: _check_target(target, shown, marker))
            prefix = f".{target.name}.new-"
            build = Path(_wrapped(shown, lambda: tempfile.mkdtemp(dir=target.parent, prefix=prefix, suffix=".tmp")))
            try:
                yield build
                mode = (target.stat().st_mode & 0o7777) if target.exists() else folder_mode()
                _wrapped(shown, lambda: os.chmod(build, mode))
                _wrapped(shown, lambda: _swap_in(build, target, pause or (lambda stage: None)))
            finally:
                shutil.rmtree(build, ignore_errors=True)
    except BaseException:
        for folder in created:
            try:
                folder.rmdir()
            except OSError:
                break
        raise
