"""Page-level I/O of tables on disk: the pages a cache's misses read, and the disk a target rate needs.

**Pages.** A table on disk is read in pages of ``page_bytes`` (4 KiB). A :class:`PageLayout` says
how a row's bytes lie: ``split`` is the checkpoint's (safetensors) layout, the fp8 weights
``[rows, 256]`` (16 rows a page) apart from the e8m0 scales ``[rows, 8]`` (512 rows a page), so
a missed row reads one weight page and one scale page; ``packed`` keeps each row's 264 B together,
``floor(4096 / 264) = 15`` rows a page (a row never straddles two pages). Row r lies in page
``r // rows_per_page`` of each array (pages counted from the array's start).

**The miss stream** (:func:`miss_stream`): which accesses of a trace window missed, from
libCacheSim's ``get`` called per access (the C loop returns totals only, ``policies``); the cache
is warmed in C over the trace before the window. Pages touched are counted after page dedup:
the distinct pages of the missed rows of each token (``token`` trace) or each prefill step
(``chunk<C>`` trace, rows already distinct within the step).

**The calculator** (:func:`disk_need`), for a target rate of R tokens a second::

    decode  (per token):          IOPS = R * P_token              bandwidth = IOPS * page_bytes
    prefill (steps of C tokens):  IOPS = (R / C) * P_step         bandwidth = IOPS * page_bytes

where P_token (P_step) is the mean number of distinct pages the misses of one token (one step)
read, summed over the Engram layers (each layer its own table and cache). At hit rate h a token
misses ``24 (1 - h)`` rows a layer, so ``P_token = 24 (1 - h) x pages a missed row x (1 - page
dedup)``; the measured P comes from the simulated miss stream, so dedup is exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engram_viz.analysis.caches.future_access import FUTURE_DTYPE
from engram_viz.analysis.caches.policies import OFFLINE, libcachesim, make_cache, trace_reader
from engram_viz.analysis.caches.row_trace import RowTrace
from engram_viz.analysis.caches.simulate import future_path
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import CacheSimError

PAGE_BYTES = 4096


@dataclass(frozen=True)
class PageLayout:
    """How a row lies on disk: ``segments``, the bytes a row in each separately stored array."""

    name: str
    segments: tuple[int, ...]
    page_bytes: int = PAGE_BYTES

    @property
    def rows_per_page(self) -> tuple[int, ...]:
        """Rows a page of each array (a row never straddles two pages)."""
        return tuple(self.page_bytes // s for s in self.segments)


LAYOUTS = {
    "split": PageLayout("split", (256, 8)),  # the checkpoint: weight [rows, 256] fp8, scale [rows, 8] e8m0
    "packed": PageLayout("packed", (264,)),  # a row with its scales, 15 a page
}


def pages_per_unit(rows: np.ndarray, units: np.ndarray, layout: PageLayout) -> np.ndarray:
    """Distinct pages each unit (token or step) reads: rows int ``[M]`` with their unit int ``[M]``
    (non-decreasing from 0) -> int64 ``[units]``, the pages of every array summed."""
    n_units = int(units[-1]) + 1 if len(units) else 0
    out = np.zeros(n_units, dtype=np.int64)
    for rpp in layout.rows_per_page:
        keys = np.unique(units.astype(np.int64) << 32 | (rows.astype(np.int64) // rpp))
        out += np.bincount(keys >> 32, minlength=n_units)
    return out


def miss_stream(path: str, policy: str, cache_rows: int, start: int, stop: int) -> np.ndarray:
    """bool ``[stop - start]``, True where access i of the trace file at ``path`` (uint32 rows;
    Belady: its future file) missed, the cache warmed in C over accesses ``[0, start)``."""
    lcs = libcachesim()
    offline = policy in OFFLINE
    cache = make_cache(policy, cache_rows)
    if start:
        cache.process_trace(trace_reader(path, offline), start_req=0, max_req=start)
    dtype = FUTURE_DTYPE if offline else np.dtype("<u4")
    window = np.memmap(path, dtype=dtype, mode="r")[start:stop]
    rows = (window["row"] if offline else window).tolist()
    nexts = window["next"].tolist() if offline else None
    req = lcs.Request()
    req.obj_size = 1
    missed = np.zeros(len(rows), dtype=bool)
    for i, row in enumerate(rows):
        req.obj_id = row
        if nexts is not None:
            req.next_access_vtime = nexts[i]
        missed[i] = not cache.get(req)
    return missed


def _window(trace: RowTrace, layer: int, mode: str, tokens: int) -> tuple[int, int, np.ndarray]:
    """``(start, stop, unit of each access)`` of the last ``tokens`` tokens (whole steps) of a trace."""
    n = trace.accesses(layer, "all", mode)
    if mode == "token":
        per = trace.config.n_hash_cols
        start = max(0, trace.tokens - tokens) * per
        return start, n, np.arange(n - start) // per
    sizes = trace.step_sizes(layer)
    first = max(0, len(sizes) - max(1, tokens // max(1, trace.chunk or 1)))
    start = int(sizes[:first].sum())
    return start, n, np.repeat(np.arange(len(sizes) - first), sizes[first:])


def _column_orders(trace: RowTrace, layer: int, rows: np.ndarray) -> np.ndarray:
    """The n-gram order of each row id (its column from the layer's offsets)."""
    layout = EngramLayout(trace.config)
    offsets = layout.offsets[list(trace.config.engram_layer_ids).index(layer)]
    col = np.searchsorted(offsets, rows, side="right") - 1
    return 2 + col // trace.config.engram_n_heads


def page_io(
    trace: RowTrace,
    policies: list[str],
    sizes: list[int],
    tokens: int = 20_000,
    layouts: tuple[str, ...] = ("split", "packed"),
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(pages, order_hits)`` over the last ``tokens`` tokens of the trace (scope ``all``), every
    layer, mode, policy and size. ``pages``: layer, mode, policy, cache_rows, layout, tokens, units,
    accesses, missed_rows, missed_pages, pages_per_unit (per token, or per prefill step).
    ``order_hits``: the shared cache's hits split by n-gram order (layer, mode, policy,
    cache_rows, order, accesses, hits, hit_rate)."""
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise CacheSimError(f"page I/O window must be a positive number of tokens, got {tokens!r}")
    if unknown := [n for n in layouts if n not in LAYOUTS]:
        raise CacheSimError(f"unknown page layout(s) {unknown}; expected {', '.join(LAYOUTS)}")
    page_rows, order_rows = [], []
    for layer in trace.layer_ids:
        for mode in trace.modes:
            start, stop, units = _window(trace, layer, mode, tokens)
            rows = np.asarray(trace.rows(layer, "all", mode)[start:stop]).astype(np.int64)
            orders = _column_orders(trace, layer, rows)
            for policy in policies:
                path = str(
                    future_path(trace, layer, "all", mode) if policy in OFFLINE else trace.path(layer, "all", mode)
                )
                for size in sizes:
                    missed = miss_stream(path, policy, size, start, stop)
                    key = {"layer": layer, "mode": mode, "policy": policy, "cache_rows": size}
                    for name in layouts:
                        pages = pages_per_unit(rows[missed], units[missed], LAYOUTS[name])
                        n_units = int(units[-1]) + 1 if len(units) else 0
                        page_rows.append(
                            {
                                **key,
                                "layout": name,
                                "tokens": min(tokens, trace.tokens),
                                "units": n_units,
                                "accesses": len(rows),
                                "missed_rows": int(missed.sum()),
                                "missed_pages": int(pages.sum()),
                                "pages_per_unit": pages.sum() / max(n_units, 1),
                            }
                        )
                    for n in trace.config.ngram_orders:
                        at = orders == n
                        hits = int((~missed[at]).sum())
                        order_rows.append(
                            {
                                **key,
                                "order": n,
                                "accesses": int(at.sum()),
                                "hits": hits,
                                "hit_rate": hits / max(at.sum(), 1),
                            }
                        )
    return pd.DataFrame(page_rows), pd.DataFrame(order_rows)


def disk_need(pages_per_unit: float, tokens_per_s: float, tokens_per_unit: int = 1, page_bytes: int = PAGE_BYTES):
    """``(IOPS, bytes/s)`` a disk must serve for ``tokens_per_s`` tokens a second when each unit
    of ``tokens_per_unit`` tokens (1: decode; C: a prefill step) reads ``pages_per_unit`` pages
    (summed over the layers): IOPS = tokens_per_s / tokens_per_unit x pages_per_unit, bandwidth =
    IOPS x page_bytes."""
    if tokens_per_s < 0 or pages_per_unit < 0 or tokens_per_unit < 1 or page_bytes < 1:
        raise CacheSimError(
            f"disk_need: expected non-negative rates and pages, a unit of >= 1 token and a page of >= 1 byte; got "
            f"pages_per_unit={pages_per_unit}, tokens_per_s={tokens_per_s}, tokens_per_unit={tokens_per_unit}, "
            f"page_bytes={page_bytes}"
        )
    iops = tokens_per_s / tokens_per_unit * pages_per_unit
    return iops, iops * page_bytes


def disk_table(pages: pd.DataFrame, decode_tokens_per_s: float, prefill_tokens_per_s: float) -> pd.DataFrame:
    """The disk each (mode, policy, cache_rows, layout) needs at the target rates, the layers'
    pages summed: mode, policy, cache_rows, layout, pages_per_unit, tokens_per_s, iops, mb_per_s."""
    if not len(pages):
        return pd.DataFrame(columns=["mode", "policy", "cache_rows", "layout", "pages_per_unit", "tokens_per_s"])
    total = pages.groupby(["mode", "policy", "cache_rows", "layout"], as_index=False, sort=False)[
        "pages_per_unit"
    ].sum()
    out = []
    for r in total.itertuples(index=False):
        chunk = 1 if r.mode == "token" else int(str(r.mode).removeprefix("chunk"))
        rate = decode_tokens_per_s if r.mode == "token" else prefill_tokens_per_s
        layout = LAYOUTS[r.layout]
        iops, bw = disk_need(float(r.pages_per_unit), rate, chunk, layout.page_bytes)
        out.append({**r._asdict(), "tokens_per_s": rate, "iops": iops, "mb_per_s": bw / 1e6})
    return pd.DataFrame(out)
