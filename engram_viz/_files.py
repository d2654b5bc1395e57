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
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import numpy as np
import pandas as pd

TABLE_FORMATS = ("parquet", "csv")


def file_mode() -> int:
    """The permissions a plainly created file gets under the current umask."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_path(path: str | os.PathLike, suffix: str = ".tmp") -> Iterator[Path]:
    """Yield a temporary path next to ``path``; on a clean exit the file written there replaces
    ``path``. ``suffix`` ends the temporary name (some writers pick the format from it)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=suffix)
    os.close(fd)
    try:
        yield Path(tmp)
        with open(tmp, "rb") as fh:
            os.fsync(fh.fileno())
        os.chmod(tmp, file_mode())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """An open temporary file next to ``path`` (``mode`` ``"wb"`` or ``"w"``, UTF-8 by default for
    text); on a clean exit it replaces ``path``."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    with atomic_path(path) as tmp:
        with open(tmp, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as fh:
            yield fh


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically; returns the path."""
    with atomic_writer(path, "wb") as fh:
        fh.write(data)
    return Path(path)


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically; returns the path."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def _table_safe(df: pd.DataFrame) -> pd.DataFrame:
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
    """``out_dir/NAME.parquet`` and ``out_dir/NAME.csv`` (no index), each atomic; returns the paths."""
    unknown = [f for f in formats if f not in TABLE_FORMATS]
    if unknown:
        raise ValueError(f"table format {unknown[0]!r} unknown; expected one of {TABLE_FORMATS}")
    df = _table_safe(df)
    paths = []
    for fmt in formats:
        path = Path(out_dir) / f"{name}.{fmt}"
        with atomic_path(path) as tmp:
            if fmt == "parquet":
                df.to_parquet(tmp, index=False)
            else:
                df.to_csv(tmp, index=False)
        paths.append(path)
    return paths
