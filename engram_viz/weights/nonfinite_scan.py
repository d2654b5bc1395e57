"""``engram-viz inspect --verify``: every byte of every Engram-path tensor scanned for NaN/Inf.

Opening a checkpoint checks the small tensors and a gather checks the rows it reads; a whole scan
(two 98 GB tables on the real checkpoint) is only done when asked. Tensors are read in chunks of
whole rows with ``pread`` (resident memory stays at one chunk) and tested with the bit rule of
``finite.py``; a progress bar (``_progress``) counts bytes. Every bad tensor is reported (file, count, first rows),
not only the first.
"""

from __future__ import annotations

import math

import numpy as np

from engram_viz._progress import ProgressBar, progress_bar
from engram_viz.core.schema import SAFETENSORS_DTYPES
from engram_viz.weights.nonfinite import NONFINITE_MASK, SHOWN_ROWS, count_nonfinite, describe, nonfinite_rows
from engram_viz.weights.safetensors import TensorInfo, pread_into, torch_dtype_of
from engram_viz.weights.scan import CheckpointScan, TensorEntry

CHUNK_BYTES = 64 * 2**20  # one read; rows are never split across reads


def _row_bytes(info: TensorInfo) -> int:
    """Bytes of one row (the first dimension; a 0-D or 1-D tensor is one row)."""
    inner = math.prod(info.shape[1:]) if len(info.shape) >= 2 else math.prod(info.shape)
    return max(1, inner * info.itemsize)


def _scan_part(info: TensorInfo, first_row: int, bar: ProgressBar) -> tuple[int, int, list[int]]:
    """(non-finite values, rows holding one, the first row ids) of one tensor part."""
    dtype = info.torch_dtype
    rb = _row_bytes(info)
    rows_per_read = max(1, CHUNK_BYTES // rb)
    values, rows, shown = 0, 0, []
    with open(info.path, "rb") as fh:
        fd = fh.fileno()
        for start in range(info.start, info.end, rows_per_read * rb):
            n = min(rows_per_read * rb, info.end - start)
            buf = np.empty(n, dtype=np.uint8)
            pread_into(fd, memoryview(buf), start, f"{info.path}: tensor {info.name!r}")
            block = buf.reshape(-1, rb)
            bad = nonfinite_rows(block, dtype)
            if len(bad):
                values += count_nonfinite(block[bad], dtype)
                rows += len(bad)
                base = first_row + (start - info.start) // rb
                shown.extend((base + bad[: SHOWN_ROWS - len(shown)]).tolist())
            bar.update(n)
    return values, rows, shown


def _scan_entry(entry: TensorEntry, bar: ProgressBar) -> dict | None:
    """The finding for one tensor (all its parts), or None when every value is finite."""
    values, rows, shown, files = 0, 0, [], []
    first_row = 0
    for part in entry.parts:
        v, r, s = _scan_part(part, first_row if entry.split else 0, bar)
        if v:
            files.append(part.path.name)
        values, rows, shown = values + v, rows + r, (shown + s)[:SHOWN_ROWS]
        first_row += part.shape[0] if part.shape else 1
    if not values:
        return None
    return {
        "name": entry.name,
        "files": files,
        "nonfinite_values": values,
        "rows": rows,
        "first_rows": shown,
        "what": describe(torch_dtype_of(entry.dtype)),
    }


def verify_tensors(scan: CheckpointScan, progress: bool = True) -> dict:
    """Scan every Engram-path tensor of a checkpoint whole: ``{"tensors", "bytes", "bad": [...]}``
    with one entry per tensor holding NaN/Inf (name, files, value and row counts, first row ids).
    Tensors of integer dtypes, or dtypes engram-viz cannot read, are skipped."""
    entries = [
        e for e in scan.tensors.values() if e.dtype in SAFETENSORS_DTYPES and torch_dtype_of(e.dtype) in NONFINITE_MASK
    ]
    total = sum(e.nbytes for e in entries)
    bad = []
    with progress_bar(
        total=total, unit="B", unit_scale=True, desc="verify", disable=not progress, leave=False, dynamic_ncols=True
    ) as bar:
        for entry in sorted(entries, key=lambda e: e.name):
            bar.set_postfix_str(entry.name, refresh=False)
            finding = _scan_entry(entry, bar)
            if finding:
                bad.append(finding)
    return {"tensors": len(entries), "bytes": total, "bad": bad}
