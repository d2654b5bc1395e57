"""Row usage: how often each Engram table row is read, per (layer, row), kept sparse.

**What is counted.** Every counted position reads 24 rows per Engram layer, one per (n-gram
order, head) column; a *hit* of row r is one such read. Counted positions are text positions
(``token_mask`` True); image positions, which also read the 24 rows of an all-pad window but
have their gate shut, are left out.

**How it is stored.** A row id is a function of the n-gram key (``ngrams`` module docstring), so
the accumulator keeps the distinct n-grams with their position counts (:class:`NgramCounts`,
16 bytes per distinct n-gram and order) and derives the per-row hits from them, one column at
a time: row hits are exact, never held as a dense table (384M rows per layer), and the
n-grams behind a hot row are known exactly, with no sampling or second pass. Keeping the
n-grams is ~16x smaller than keeping sparse (layer, row) counts, since every n-gram feeds 8
heads x n_layers rows.

Tables (``to_frame``), one row per observation:

- ``columns``: layer, order, head, column, prime, offset, distinct_ngrams, hits, rows_touched,
  coverage (rows_touched / prime), max_hits;
- ``hit_histogram``: layer, order, hits, rows (how many rows of that layer/order were hit
  exactly ``hits`` times);
- ``rank_frequency``: layer, rank, hits - row hit counts of a layer sorted descending, sampled
  at up to ``max_points`` log-spaced ranks (always rank 1 and the last rank), exact values;
- ``hot_rows``: layer, rank, row, order, head, bucket, hits, n_ngrams, ngram_rank, ngram,
  ngram_ids, ngram_hits - the ``top`` most-hit rows of each layer, one line per n-gram landing
  there (at most ``ngrams_per_row``, most frequent first). Ties break by row id;
- ``layer_totals``: layer, distinct_ngrams, row_reads, rows_touched, rows, coverage.

**Special-only n-grams.** Every prompt starts with n-grams made only of BOS and pad (the blocked
look-back before the first token: ``(pad, BOS)``, ``(pad, pad, BOS)`` ...); they are the hottest
rows of any prompt set and say nothing about its text. ``hot_rows`` and ``rank_frequency`` leave
them out unless ``specials=True``; ``coverage`` and ``layer_totals`` count every read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engram_viz.analysis.corpus.bucket_passes import column_view, iter_columns
from engram_viz.analysis.corpus.ngram_text import make_decoder
from engram_viz.analysis.corpus.top_k import top_indices
from engram_viz.analysis.row_stats.accumulator import NgramAccumulator
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import BOS_ID

EOS_ID = 1  # <｜end▁of▁sentence｜>; BOS and EOS keep their raw ids in the compressed vocabulary


@dataclass
class _HotRow:
    hits: int
    row: int
    column: int
    bucket: int
    n_ngrams: int
    ngrams: list[tuple[int, tuple[int, ...]]]  # (positions, n-gram), most frequent first


@dataclass
class _Pass:
    top: int
    ngrams_per_row: int
    columns: list[dict]
    histogram: dict[tuple[int, int], np.ndarray]  # (layer, order) -> rows hit exactly h times, index h
    hot: dict[int, list[_HotRow]]  # layer -> the top rows, hottest first (ties: smaller row id)
    specials: bool  # hot rows and the histogram count special-only n-grams too


class _UsageConsumer:
    """Collects every RowUsage figure during one pass over the columns (``run_column_pass``)."""

    def __init__(self, layout: EngramLayout, top: int, ngrams_per_row: int, specials: bool, special_ids: list[int]):
        self.params = (top, ngrams_per_row, specials)
        self.special_ids = np.asarray(special_ids, dtype=np.int64)
        self.result = _Pass(top, ngrams_per_row, [], {}, {layer: [] for layer in layout.layer_ids}, specials)
        # (an order's counts, its special-only n-grams): the same for every column of the order
        self._only_of: tuple[np.ndarray | None, np.ndarray] = (None, np.empty(0, np.int64))

    def _only(self, view) -> np.ndarray:
        """Sorted indices of the view's special-only n-grams (every id BOS/EOS/pad): those the hot
        rows and the histogram leave out (none with ``specials``)."""
        if self.result.specials or not len(view.counts):
            return np.empty(0, np.int64)
        if self._only_of[0] is not view.counts:  # once per order
            self._only_of = (view.counts, view.made_of(self.special_ids))
        return self._only_of[1]

    def __call__(self, view) -> None:
        buckets, distinct, hits = view.bucket_totals()
        self._column(view, buckets, hits)
        only = self._only(view)
        # the hot rows and the histogram without the special-only n-grams: only the few buckets they land in change
        changed = view.stats().changed_without(only, view.counts) if len(only) else None
        self._histogram(view, hits, changed)
        self._hot(view, buckets, distinct, hits, changed, only)

    def _column(self, view, buckets: np.ndarray, hits: np.ndarray) -> None:
        self.result.columns.append(
            {
                "layer": view.layer,
                "order": view.order,
                "head": view.head,
                "column": view.column,
                "prime": view.prime,
                "offset": view.offset,
                "distinct_ngrams": len(view.counts),
                "hits": view.positions,
                "rows_touched": len(buckets),
                "coverage": len(buckets) / view.prime,
                "max_hits": int(hits.max()) if len(hits) else 0,
            }
        )

    def _histogram(self, view, hits: np.ndarray, changed: tuple | None) -> None:
        """Add the column's buckets by hits (``changed``: the buckets whose hits drop without the special-only n-grams)."""
        res = self.result
        if len(hits):
            h = np.bincount(hits)
            if changed is not None:  # the changed buckets moved from their hits to the lower ones (0: not counted)
                at, _, lower = changed
                h -= np.bincount(hits[at], minlength=len(h))
                h += np.bincount(lower[lower > 0], minlength=len(h))
            old = res.histogram.get((view.layer, view.order), np.zeros(0, np.int64))
            if len(old) < len(h):
                old = np.pad(old, (0, len(h) - len(old)))
            old[: len(h)] += h
            res.histogram[(view.layer, view.order)] = old

    def _hot(self, view, buckets, distinct, hits, changed: tuple | None, only: np.ndarray) -> None:
        """Enter the column's hottest buckets into its layer's top rows; ``changed`` as in :meth:`_histogram`."""
        res = self.result
        hot = res.hot[view.layer]
        if not res.top or not len(hits):
            return
        # only rows at least as hot as the current top-th row of this layer can enter (their hits only drop)
        floor = hot[-1].hits if len(hot) >= res.top else 1
        cand = np.flatnonzero(hits >= floor)
        hits, distinct = hits[cand], distinct[cand]
        if changed is not None:
            at, lower_n, lower = changed
            pos = np.minimum(np.searchsorted(cand, at), max(len(cand) - 1, 0))
            inside = cand[pos] == at if len(cand) else np.zeros(0, bool)
            hits[pos[inside]], distinct[pos[inside]] = lower[inside], lower_n[inside]
            keep = hits >= floor
            cand, hits, distinct = cand[keep], hits[keep], distinct[keep]
        best = top_indices(hits, buckets[cand] + view.offset, res.top)
        if not len(best):
            return
        landed, landed_buckets = view.members_of(buckets[cand[best]])
        if len(only):
            kept = ~np.isin(landed, only)
            landed, landed_buckets = landed[kept], landed_buckets[kept]
        by = np.lexsort((landed, -view.counts[landed]))  # most frequent first
        landed, landed_buckets = landed[by], landed_buckets[by]
        per_bucket: dict[int, list] = {}
        for i, b in zip(landed.tolist(), landed_buckets.tolist()):
            entry = per_bucket.setdefault(b, [])
            if len(entry) < res.ngrams_per_row:
                entry.append((i, int(view.counts[i])))
        shown = np.array([i for entry in per_bucket.values() for i, _ in entry], dtype=np.int64)
        ids = dict(zip(shown.tolist(), (tuple(int(x) for x in row) for row in view.ngrams_at(shown))))
        per_bucket = {b: [(c, ids[i]) for i, c in entry] for b, entry in per_bucket.items()}
        for i in best:
            b = int(buckets[cand[i]])
            hot.append(_HotRow(int(hits[i]), b + view.offset, view.column, b, int(distinct[i]), per_bucket[b]))
        hot.sort(key=lambda r: (-r.hits, r.row))
        del hot[res.top :]


class RowUsage(NgramAccumulator):
    """Accumulator of row hits per (Engram layer, table row); adding, merging and sharing the
    counts as every :class:`NgramAccumulator`."""

    _what = "row usage"

    # -- per column / per row
    def column_hits(self, layer: int, order: int, head: int) -> tuple[np.ndarray, np.ndarray]:
        """Sparse hits of one column: ``(rows int64 [R] sorted, hits int64 [R])``, rows touched only."""
        view = column_view(self.layout, self.counts, self.layout.layer_index(layer), order, head)
        buckets, _, hits = view.bucket_totals()
        return buckets + view.offset, hits

    def row_hits(self, layer: int) -> tuple[np.ndarray, np.ndarray]:
        """Sparse hits of a whole layer: ``(rows int64 [R] sorted, hits int64 [R])``. R can reach
        8 x (distinct n-grams of all orders): use ``column_hits`` on big corpora."""
        li = self.layout.layer_index(layer)
        rows, hits = [], []
        for view in iter_columns(self.layout, self.counts):
            if view.layer_index == li:
                b, _, h = view.bucket_totals()
                rows.append(b + view.offset)
                hits.append(h)
        return np.concatenate(rows), np.concatenate(hits)

    def hits_of(self, layer: int, rows) -> np.ndarray:
        """Hits of the given rows of a layer: int64, same shape as ``rows`` (0 where never read)."""
        q = np.asarray(rows, dtype=np.int64)
        all_rows, all_hits = self.row_hits(layer)
        at = np.minimum(np.searchsorted(all_rows, q), max(len(all_rows) - 1, 0))
        found = (all_rows[at] == q) if len(all_rows) else np.zeros(q.shape, bool)
        return np.where(found, all_hits[at] if len(all_rows) else 0, 0)

    # -- one pass over the columns
    def _pass(self, top: int | None = None, ngrams_per_row: int | None = None, specials: bool = False) -> _Pass:
        """All per-column figures in one pass, keeping the ``top`` hottest rows per layer with up
        to ``ngrams_per_row`` n-grams each; None reuses any cached pass (defaults 20 and 5);
        ``specials``: hot rows and histogram count the special-only n-grams too."""
        cached = self._cached(
            lambda kept: (
                (top is None or kept[0] >= top)
                and (ngrams_per_row is None or kept[1] >= ngrams_per_row)
                and kept[2] == specials
            )
        )
        if cached is not None:
            return cached
        top, per_row = 20 if top is None else top, 5 if ngrams_per_row is None else ngrams_per_row
        return self._run(self._consumer(top, per_row, specials))

    def _consumer(self, top: int, ngrams_per_row: int, specials: bool = False) -> _UsageConsumer:
        special_ids = [BOS_ID, EOS_ID, self.counts.pad_id]
        return _UsageConsumer(self.layout, top, ngrams_per_row, specials, special_ids)

    # -- tables
    def coverage(self) -> pd.DataFrame:
        """Per (layer, order, head) column: rows touched / prime and hits (schema in module doc)."""
        return pd.DataFrame(self._pass().columns)

    def layer_totals(self) -> pd.DataFrame:
        """Per Engram layer: ``distinct_ngrams`` - distinct (order, n-gram) keys at the counted
        positions, each counted once (the 8 heads of an order read the same n-grams, so summing
        the columns' ``distinct_ngrams`` would count each 8 times); ``row_reads`` (positions x 24),
        ``rows_touched``, ``rows`` (the layer's table) and ``coverage`` (touched / rows)."""
        cov = self.coverage()
        distinct = sum(self.counts.n_distinct(n) for n in self.counts.orders)  # keys do not depend on the layer
        agg = cov.groupby("layer", as_index=False)[["hits", "rows_touched", "prime"]].sum()
        agg = agg.rename(columns={"hits": "row_reads", "prime": "rows"})
        agg.insert(1, "distinct_ngrams", distinct)
        agg["coverage"] = agg["rows_touched"] / agg["rows"]
        return agg

    def hit_histogram(self, specials: bool = False) -> pd.DataFrame:
        """(layer, order, hits, rows): how many rows were hit exactly ``hits`` times (special-only
        n-grams left out unless ``specials``)."""
        cols: dict[str, list[np.ndarray]] = {"layer": [], "order": [], "hits": [], "rows": []}
        for (layer, order), hist in sorted(self._pass(specials=specials).histogram.items()):
            hits = np.flatnonzero(hist)
            cols["layer"].append(np.full(len(hits), layer, np.int64))
            cols["order"].append(np.full(len(hits), order, np.int64))
            cols["hits"].append(hits.astype(np.int64))
            cols["rows"].append(hist[hits].astype(np.int64))
        if not sum(len(h) for h in cols["hits"]):
            return pd.DataFrame([], columns=list(cols))
        return pd.DataFrame({name: np.concatenate(parts) for name, parts in cols.items()})

    def rank_frequency(self, max_points: int = 256, specials: bool = False) -> pd.DataFrame:
        """(layer, rank, hits): the layer's row hits sorted descending, at up to ``max_points``
        log-spaced ranks (exact values; rank 1 and the last rank always included); special-only
        n-grams left out unless ``specials``."""
        recs = []
        hist = self.hit_histogram(specials)
        for layer in self.layout.layer_ids:
            h = hist[hist.layer == layer].groupby("hits")["rows"].sum().sort_index(ascending=False)
            if h.empty:
                continue
            values, n_rows = h.index.to_numpy(), h.to_numpy()
            last = np.cumsum(n_rows)  # rank of the last row with each value
            total = int(last[-1])
            if total <= max_points:
                ranks = np.arange(1, total + 1, dtype=np.int64)
            else:
                ranks = np.unique(np.rint(np.geomspace(1, total, num=max_points)).astype(np.int64))
            hits = values[np.searchsorted(last, ranks)]
            recs += [{"layer": layer, "rank": int(r), "hits": int(v)} for r, v in zip(ranks, hits)]
        return pd.DataFrame(recs, columns=["layer", "rank", "hits"])

    def hot_rows(self, top: int = 20, ngrams_per_row: int = 5, tokenizer=None, specials: bool = False) -> pd.DataFrame:
        """The ``top`` most-hit rows of each layer with the n-grams that land there, decoded;
        n-grams of only BOS/EOS/pad (sequence starts) are left out unless ``specials``."""
        hot = self._pass(top, ngrams_per_row, specials).hot
        decoder = make_decoder(self.config, tokenizer, self.counts.pad_id)
        recs = []
        for layer, entries in hot.items():
            for rank, r in enumerate(entries[:top], 1):
                for j, (c, ids) in enumerate(r.ngrams[:ngrams_per_row], 1):
                    recs.append(
                        {
                            "layer": layer,
                            "rank": rank,
                            "row": r.row,
                            "order": r.column // self.layout.n_heads + 2,
                            "head": r.column % self.layout.n_heads,
                            "bucket": r.bucket,
                            "hits": r.hits,
                            "n_ngrams": r.n_ngrams,
                            "ngram_rank": j,
                            "ngram": decoder.text(ids) if decoder else "",
                            "ngram_ids": " ".join(map(str, ids)),
                            "ngram_hits": c,
                        }
                    )
        cols = [
            "layer",
            "rank",
            "row",
            "order",
            "head",
            "bucket",
            "hits",
            "n_ngrams",
            "ngram_rank",
            "ngram",
            "ngram_ids",
            "ngram_hits",
        ]
        return pd.DataFrame(recs, columns=cols)

    def to_frame(
        self, top: int = 20, ngrams_per_row: int = 5, max_points: int = 256, tokenizer=None
    ) -> dict[str, pd.DataFrame]:
        """All tables, keyed ``columns``, ``hit_histogram``, ``rank_frequency``, ``hot_rows``."""
        return {
            "columns": self.coverage(),
            "hit_histogram": self.hit_histogram(),
            "rank_frequency": self.rank_frequency(max_points),
            "hot_rows": self.hot_rows(top, ngrams_per_row, tokenizer),
        }

    def summary(self) -> dict:
        """Plain-JSON totals per layer: positions, rows touched, coverage of the whole table."""
        cov = self.coverage()
        out = {"positions": self.n_positions, "layers": {}}
        for li, layer in enumerate(self.layout.layer_ids):
            c = cov[cov.layer == layer]
            touched = int(c.rows_touched.sum())
            out["layers"][str(layer)] = {
                "rows": int(self.layout.rows_per_layer[li]),
                "rows_touched": touched,
                "coverage": touched / int(self.layout.rows_per_layer[li]),
                "max_hits": int(c.max_hits.max()) if len(c) else 0,
            }
        return out
