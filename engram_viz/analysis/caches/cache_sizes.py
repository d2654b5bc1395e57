"""Cache sizes in rows and in bytes: a row of an Engram table and the sizes a user writes.

A cached row is what a lookup gathers: ``head_dim`` fp8 features (1 byte each) and one e8m0
scale (1 byte) per block of ``fp8.BLOCK`` (32) features, so **264 B** a row at V4.1-Flash
(256 + 8); another row type (a GGUF Q8_0 row of 272 B, a bf16 row of 512 B) is a different
``row_bytes``. A cache of B bytes holds ``floor(B / row_bytes)`` rows.

:func:`parse_size` reads one size: a row count (``16384``, ``16384rows``), bytes with a unit
(``4MiB``, ``50GB``, ``1.5GiB``; decimal kB/MB/GB/TB and binary KiB/MiB/GiB/TiB), a share of the
table (``10%``) or ``table`` (every row). Zero, negative, non-finite and unreadable sizes are refused
(:class:`~engram_viz.errors.CacheSimError`), and so is a size below one row.
"""

from __future__ import annotations

import math
import re

from engram_viz.config import EngramConfig
from engram_viz.core.fp8 import BLOCK
from engram_viz.errors import CacheSimError

UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
UNITS.update({"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40})
_SIZE = re.compile(r"(?P<num>[0-9]+(?:\.[0-9]+)?)\s*(?P<unit>[a-z%]*)")

# The hot-row caches serving ports of V4.1 ship (GUIDE: "an LRU, a 50 GB hot cache, 16,384 rows
# per table"), per table: the 50 GB cache holds the rows of both Engram tables, half a table each.
SHIPPED_SIZES = {"16,384 rows a table": "16384", "50 GB hot cache (25 GB a table)": "25GB"}


def row_bytes(config: EngramConfig) -> int:
    """Bytes of one table row with its scales: ``head_dim`` fp8 + ``head_dim / 32`` e8m0 (264 at V4.1-Flash)."""
    return config.engram_head_dim + config.engram_head_dim // BLOCK


def parse_size(text: str | int, row_size: int, table_rows: int) -> int:
    """One cache size -> rows (see the module docstring); ``row_size``: bytes a row,
    ``table_rows``: rows of the table (``table`` and ``%`` sizes). Capped at the table."""
    if isinstance(text, bool):
        raise CacheSimError(f"cache size must be rows, bytes with a unit, a % or 'table', got {text!r}")
    if isinstance(text, int):
        text = str(text)
    shown = str(text).strip().lower()
    if shown in ("table", "full"):
        return table_rows
    m = _SIZE.fullmatch(shown)
    unit = m.group("unit") if m else ""
    if m is None or unit not in ("", "rows", "%", *UNITS):
        raise CacheSimError(
            f"cache size {text!r}: expected rows (16384), bytes with a unit (4MiB, 50GB), a share (10%) or 'table'"
        )
    value = float(m.group("num"))
    if unit in ("", "rows"):
        if not m.group("num").isdigit():
            raise CacheSimError(f"cache size {text!r}: a row count is a whole number")
        rows = int(m.group("num"))
    elif unit == "%":
        if value > 100:
            raise CacheSimError(f"cache size {text!r}: a share of the table is at most 100%")
        rows = math.floor(table_rows * value / 100)
    else:
        rows = math.floor(value * UNITS[unit] / row_size)
    if rows < 1:
        raise CacheSimError(f"cache size {text!r}: expected at least one row ({row_size} B), got {rows} rows")
    return min(rows, table_rows)


def parse_sizes(texts: str | list, row_size: int, table_rows: int) -> list[int]:
    """Comma-separated sizes (or a list) -> distinct row counts, ascending (CacheSimError on none)."""
    items = [t for t in texts.split(",")] if isinstance(texts, str) else list(texts)
    items = [t.strip() if isinstance(t, str) else t for t in items]
    if not items or any(t == "" for t in items):
        raise CacheSimError(f"cache sizes {texts!r}: expected one or more sizes separated by commas")
    return sorted({parse_size(t, row_size, table_rows) for t in items})


def default_sizes(table_rows: int, row_size: int, unique_rows: int) -> list[int]:
    """Sizes from 1 MiB up to the trace's distinct rows, by factors of 4, plus the shipped sizes
    below that: rows, ascending. A cache of the distinct rows or more never evicts, so it hits
    as an infinite cache does (``best_hit_rate``); larger sizes are not simulated (W-TinyLFU's
    sketch grows with the cache: 1.6 GB and a minute at a whole table)."""
    top = max(1, min(unique_rows, table_rows))
    rows = math.floor(2**20 / row_size)
    out = {top}
    while rows < top:
        out.add(rows)
        rows *= 4
    out.update(r for r in (parse_size(s, row_size, table_rows) for s in SHIPPED_SIZES.values()) if r < top)
    return sorted(out)


def working_set_sizes(distinct_rows: int, steps: int = 9, least: int = 100) -> list[int]:
    """Sizes for a small trace: ``steps`` sizes from 1/256 of its distinct rows up to all of them
    (geometric; each at least ``least`` rows, the smallest cache every policy builds)."""
    top = max(least, distinct_rows)
    return sorted({max(least, round(top * 256 ** (k / (steps - 1) - 1))) for k in range(steps)})
