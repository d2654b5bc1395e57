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


def next_accesses(
    rows: np.ndarray, start: int, seen_rows: np.ndarray, seen_pos: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``next`` int64 ``[n]`` of the block ``rows`` (uint32 ``[n]``, starting at trace position
    ``start``), given ``seen_rows`` (sorted) / ``seen_pos``: the first access of each row after the
    block; and ``seen`` after stepping back over the block (its first access of each row replaces
    a later one). One stable sort of the block serves both."""
    n = len(rows)
    order = np.argsort(rows, kind="stable")  # groups of equal rows, positions ascending within each
    ordered = rows[order]
    nxt = np.full(n, NEVER, dtype=np.int64)
    same = ordered[1:] == ordered[:-1]
    nxt[order[:-1][same]] = order[1:][same] + start  # the next member of the same group
    last = np.ones(n, dtype=bool)
    last[:-1] = ~same  # the last access of each row in the block
    first = np.ones(n, dtype=bool)
    first[1:] = ~same  # the first access of each row in the block
    block_rows = ordered[first]  # the block's distinct rows, sorted (as ordered[last])
    at = np.searchsorted(seen_rows, block_rows)
    found = at < len(seen_rows)
    found[found] = seen_rows[at[found]] == block_rows[found]
    nxt[order[last][found]] = seen_pos[at[found]]
    first_pos = order[first].astype(np.int64) + start
    seen_pos = seen_pos.copy()
    seen_pos[at[found]] = first_pos[found]  # seen again earlier: the block's access is now the first
    new = ~found  # rows not seen after the block: inserted in sorted place (a merge, no sort)
    return nxt, np.insert(seen_rows, at[new], block_rows[new]), np.insert(seen_pos, at[new], first_pos[new])


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
            records["next"], seen_rows, seen_pos = next_accesses(chunk, start, seen_rows, seen_pos)
            os.pwrite(dst.fileno(), records.tobytes(), start * FUTURE_DTYPE.itemsize)
    return out_path
