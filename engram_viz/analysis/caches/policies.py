"""The eviction policies, as libCacheSim (``pip install libcachesim``, its Python bindings) runs them.

``LRU``, ``LFU`` (in-cache counts, ties evicted first-in first-out), ``ARC``, ``S3-FIFO`` (small
queue 10% of the cache, ghost 90%, promotion after 2 hits), ``SIEVE``, ``W-TinyLFU`` (1% window,
SLRU main cache) and ``Belady`` (MIN: evict the row next used farthest ahead; it reads each
access's next use from the trace, ``future_access``). Every row has the same size, so a cache
holds a number of rows; the simulator counts each row as one unit (``ignore_obj_size``).

What the bindings cannot express, and what the suite does instead:

- **The miss stream.** The simulator's trace loop (``process_trace``, in C) returns only the
  miss ratio of a range of requests; which requests missed comes only from calling ``get`` per
  request from Python (about 10x slower). The page I/O (``page_io``) takes that path over a
  bounded window of the trace; the hit-rate tables take the C loop.
- **Hits by n-gram order inside one shared cache**: the same. A cache per order (a trace of one
  order's rows, scope ``n2``...) runs in C; the split of one shared cache's hits by order comes
  with the miss stream over the window.
- **Byte hit rate apart from hit rate**: all rows have one size, so the two are equal; rows of
  several sizes in one cache (weights and scales cached apart) are not modelled.
- **Belady with bypass.** libCacheSim's Belady inserts every missed row (demand paging) and
  evicts the one used farthest ahead; the optimum that may decline to cache a row is not offered,
  so the bound is MIN's.
"""

from __future__ import annotations

import re
from typing import Any

from engram_viz.errors import CacheSimError

# name -> (libcachesim class, its parameters as the simulator names them)
POLICIES: dict[str, tuple[str, dict[str, Any]]] = {
    "LRU": ("LRU", {}),
    "LFU": ("LFU", {}),
    "ARC": ("ARC", {}),
    "S3-FIFO": ("S3FIFO", {"small_size_ratio": 0.1, "ghost_size_ratio": 0.9, "move_to_main_threshold": 2}),
    "SIEVE": ("Sieve", {}),
    "W-TinyLFU": ("WTinyLFU", {"main_cache": "SLRU", "window_size": 0.01}),
    "Belady": ("Belady", {}),
}
OFFLINE = {"Belady"}  # policies that read the future (next access) from the trace
# The smallest caches the simulator runs as designed: below 10 rows S3-FIFO's small queue (10%)
# rounds to zero and libCacheSim aborts the whole process; below 100 rows W-TinyLFU's 1% window
# rounds to zero and it admits nothing (every read misses, or an abort under 3 rows). Refused here.
MIN_ROWS = {"S3-FIFO": 10, "W-TinyLFU": 100}
_KEY = re.compile(r"[^a-z0-9]")


def libcachesim() -> Any:
    """The ``libcachesim`` module, or CacheSimError saying how to install it."""
    try:
        import libcachesim
    except ImportError:
        raise CacheSimError("cache simulation needs libCacheSim's Python bindings: pip install libcachesim") from None
    return libcachesim


def policy_name(text: str) -> str:
    """A policy's canonical name, case and punctuation ignored (``s3fifo``, ``wtinylfu``, ``belady``)."""
    key = _KEY.sub("", str(text).lower())
    for name in POLICIES:
        if _KEY.sub("", name.lower()) == key:
            return name
    raise CacheSimError(f"unknown cache policy {text!r}; expected one of {', '.join(POLICIES)}")


def parse_policies(texts: str | list[str] | None) -> list[str]:
    """Comma-separated policy names (or a list; None: all of them) -> canonical names, in order."""
    if texts is None:
        return list(POLICIES)
    items = texts.split(",") if isinstance(texts, str) else list(texts)
    names = [policy_name(t.strip()) for t in items if str(t).strip()]
    if not names:
        raise CacheSimError(f"cache policies {texts!r}: expected one or more of {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def make_cache(policy: str, rows: int) -> Any:
    """A libCacheSim cache of ``rows`` rows (each row one unit) under ``policy``."""
    lcs = libcachesim()
    name = policy_name(policy)
    check_size(name, rows)
    cls, params = POLICIES[name]
    # the hash table's initial 2**hashpower buckets (it grows as needed): the default 2**24 costs
    # 0.1 s and 128 MiB a cache, more than a small simulation itself
    hashpower = min(24, max(12, int(rows).bit_length()))
    return getattr(lcs, cls)(rows, hashpower=hashpower, **params)


def check_size(policy: str, rows: int) -> None:
    """CacheSimError when ``policy`` cannot run a cache of ``rows`` rows (``MIN_ROWS``)."""
    least = MIN_ROWS.get(policy, 1)
    if rows < least:
        raise CacheSimError(f"{policy} needs a cache of at least {least} rows, got {rows}")


def trace_reader(path: str, offline: bool) -> Any:
    """libCacheSim's C reader over a trace file: uint32 rows (``<I``), or with ``offline`` the
    future file's ``(row uint32, next int64)`` records (``<Iq``); every row one unit."""
    lcs = libcachesim()
    params = lcs.ReaderInitParam(binary_fmt_str="<Iq" if offline else "<I", ignore_obj_size=True)
    params.obj_id_field = 1
    if offline:
        params.next_access_vtime_field = 2
    return lcs.TraceReader(str(path), lcs.TraceType.BIN_TRACE, params)
