"""Belady's second pass: each access's next access to the same row, from a spilled trace.

Belady's optimum (MIN) evicts the cached row whose next access lies farthest ahead, so it needs
the future: for access i of row r, ``next[i]`` = the smallest j > i with ``rows[j] == r``, or
"never". :func:`write_future_trace` reads a trace file (uint32 row ids) backwards in blocks and
writes libCacheSim's records ``(row uint32, next int64)`` (12 B an access; never = INT64_MAX, as
its Belady expects) into a second file of the same length.

Within a block, ``next`` comes from a stable sort by row (the next access of a row in the same
block is the next member of its group); a row's last access in the block takes its next from
``seen``, the first access of each row in the blocks after it (sorted row ids and positions).
Memory: one block (``BLOCK`` accesses, 12 B each plus sort scratch) and 12 B per distinct row of
the trace, never more than the table's rows; nothing is held for the trace's length.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from engram_viz.analysis.caches.row_trace import ROW_DTYPE

NEVER = np.iinfo(np.int64).max  # libCacheSim's "no next access" (Belady refuses -1)
FUTURE_DTYPE = np.dtype([("row", "<u4"), ("next", "<i8")])  # libCacheSim binary format "<Iq"
BLOCK = 1 << 23  # accesses per block: 8 M (about 200 MB with the sort scratch)


def next_accesses(rows: np.ndarray, start: int, seen_rows: np.ndarray, seen_pos: np.ndarray) -> np.ndarray:
    """``next`` int64 ``[n]`` of the block ``rows`` (uint32 ``[n]``, starting at trace position
    ``start``), given ``seen_rows`` (sorted) / ``seen_pos``: the first access of each row after the block."""
    n = len(rows)
    order = np.argsort(rows, kind="stable")  # groups of equal rows, positions ascending within each
    ordered = rows[order]
    nxt = np.full(n, NEVER, dtype=np.int64)
    same = ordered[1:] == ordered[:-1]
    nxt[order[:-1][same]] = order[1:][same] + start  # the next member of the same group
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same  # the last access of each row in the block
    tail_rows, tail_idx = ordered[last], order[last]
    at = np.searchsorted(seen_rows, tail_rows)
    found = at < len(seen_rows)
    found[found] = seen_rows[at[found]] == tail_rows[found]
    nxt[tail_idx[found]] = seen_pos[at[found]]
    return nxt


def _merge_seen(rows: np.ndarray, start: int, seen_rows: np.ndarray, seen_pos: np.ndarray):
    """``seen`` after stepping back over the block: the block's first access of each row replaces
    a later one (sorted row ids, positions)."""
    first_rows, first = np.unique(rows, return_index=True)
    both = np.concatenate([first_rows, seen_rows])
    pos = np.concatenate([first.astype(np.int64) + start, seen_pos])
    merged, pick = np.unique(both, return_index=True)  # the block's entry comes first: it wins
    return merged, pos[pick]


def write_future_trace(trace_path: str | Path, out_path: str | Path, block: int = BLOCK) -> Path:
    """The records ``(row, next)`` of the trace at ``trace_path`` (uint32 rows) into ``out_path``.
    Blocks are read and written with plain positioned I/O, not memory maps, so the pages of the
    two files never count in this process's memory."""
    trace_path, out_path = Path(trace_path), Path(out_path)
    n = trace_path.stat().st_size // ROW_DTYPE.itemsize
    seen_rows, seen_pos = np.zeros(0, dtype=ROW_DTYPE), np.zeros(0, dtype=np.int64)
    with open(trace_path, "rb") as src, open(out_path, "wb") as dst:
        dst.truncate(n * FUTURE_DTYPE.itemsize)
        for start in range((n - 1) // block * block, -1, -block) if n else ():
            size = min(block, n - start)
            chunk = np.frombuffer(
                os.pread(src.fileno(), size * ROW_DTYPE.itemsize, start * ROW_DTYPE.itemsize), ROW_DTYPE
            )
            records = np.empty(size, dtype=FUTURE_DTYPE)
            records["row"] = chunk
            records["next"] = next_accesses(chunk, start, seen_rows, seen_pos)
            os.pwrite(dst.fileno(), records.tobytes(), start * FUTURE_DTYPE.itemsize)
            seen_rows, seen_pos = _merge_seen(chunk, start, seen_rows, seen_pos)
    return out_path
