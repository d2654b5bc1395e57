"""Hash bucket collisions of the Engram n-gram hash, defined exactly.

**Population.** The n-grams at the counted positions of everything accumulated: text positions
(``token_mask`` True) of every sequence added; image positions are left out.

**Key.** The key of the n-gram of order n at position t is the tuple of n compressed ids
``(c[t-n+1], ..., c[t])``, oldest first, in which every look-back blocked by the start of the
sequence or by an image (DEAD) position - and every longer look-back after it - is the pad id
(``token_map[engram_pad_id]`` = 2). These are exactly the ids the hasher multiplies. The key is
never the hash: two distinct keys whose hashes are equal *do* collide.

**Column.** Each (Engram layer, order n, head) column has its own prime m and row range; a key's
bucket there is ``hash_layer(key) mod m`` (reference section 3). Different orders, heads and
layers never share rows, so collisions are counted per column.

Per column (``columns`` table):

- ``distinct_ngrams`` k: distinct keys of that order;
- ``occupied``: buckets holding at least one key;
- ``shared_buckets``: buckets holding two or more distinct keys;
- ``colliding_ngrams``: distinct keys whose bucket holds another distinct key;
- ``positions`` / ``colliding_positions``: counted positions, and those whose key collides;
- ``expected_*``: the same under an ideal uniform hash into m buckets, with q = (1 - 1/m):
  E[occupied] = m (1 - q^k), E[shared_buckets] = m - m q^k - k q^(k-1),
  E[colliding_ngrams] = k (1 - q^(k-1)).

Per n-gram and layer, ``heads_shared`` in 0..n_heads: on how many of its heads the key shares
its bucket with another distinct key (``heads_shared`` table: how many keys - and positions -
have each value, beside the expectation under uniform hashing, a Poisson-binomial with
per-head probability 1 - q_h^(k-1)).

Per position and layer, the **collision exposure**: how many of its 24 rows (one per order and
head) hold a distinct key other than the position's own, within the accumulated population
(``shared_rows`` / ``exposure``; a query key that is not in the population is compared with
all keys there). To set exposure beside gates, accumulate the prompts themselves (and any
reference corpus) first.

``examples``: decoded colliding n-grams. Per column, candidate buckets are those of the
``candidates`` most frequent colliding keys; they are ranked by the positions of their
second most frequent key (a collision that matters needs two frequent n-grams), then by
bucket; each lists its keys, most frequent first.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engram_viz.analysis.corpus.bucket_passes import run_column_pass
from engram_viz.analysis.corpus.bucket_sort import bucket_lookup
from engram_viz.analysis.corpus.ngram_text import make_decoder
from engram_viz.analysis.corpus.row_ids import ngram_hashes
from engram_viz.analysis.corpus.top_k import top_indices
from engram_viz.analysis.corpus.windows import sequence_windows, window_ngrams
from engram_viz.analysis.row_stats.accumulator import NgramAccumulator
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError


def poisson_binomial(probs: np.ndarray) -> np.ndarray:
    """P(exactly j successes), j = 0..len(probs), of independent trials with success ``probs``."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return dist


def expected_uniform(k: int | np.ndarray, m: int | np.ndarray) -> dict[str, np.ndarray]:
    """Expected occupied buckets, buckets with >= 2 keys and colliding keys when k distinct keys
    fall uniformly and independently into m buckets (closed forms in the module docstring)."""
    k = np.asarray(k, dtype=np.float64)
    m = np.asarray(m, dtype=np.float64)
    log_q = np.log1p(-1.0 / m)
    q_k = np.exp(k * log_q)
    q_k1 = np.exp(np.maximum(k - 1, 0) * log_q)
    return {
        "occupied": m * (1 - q_k),
        "shared_buckets": np.where(k > 0, m - m * q_k - k * q_k1, 0.0),
        "colliding_ngrams": k * (1 - q_k1),
    }


@dataclass
class _Pass:
    columns: list[dict]
    heads_shared: list[dict]
    examples: list[dict]
    shared: dict[tuple[int, int], np.ndarray]  # (layer, order) -> heads_shared int8 [U]
    ranked: dict[int, tuple[np.ndarray, np.ndarray]]  # order -> its most frequent keys, their counts (examples)


class _CollisionConsumer:
    """Collects every CollisionStats figure during one pass over the columns (``run_column_pass``)."""

    def __init__(self, layout: EngramLayout, n_examples: int, ngrams_per_bucket: int, candidates: int):
        self.layout = layout
        self.params = (n_examples, ngrams_per_bucket, candidates)
        self.result = _Pass([], [], [], {}, {})
        self._probs: list[float] = []
        self._ranked: tuple[int, np.ndarray] = (-1, np.empty(0, np.int64))  # (order, its most frequent keys)

    def __call__(self, view) -> None:
        res, heads = self.result, self.layout.n_heads
        k, m = len(view.counts), view.prime
        stats = view.stats()
        n_shared, n_colliding, colliding_positions = stats.shared_totals()
        exp = expected_uniform(k, m)
        res.columns.append(
            {
                "layer": view.layer,
                "order": view.order,
                "head": view.head,
                "column": view.column,
                "prime": m,
                "distinct_ngrams": k,
                "occupied": len(stats.occupied),
                "shared_buckets": n_shared,
                "colliding_ngrams": n_colliding,
                "positions": view.positions,
                "colliding_positions": colliding_positions,
                "expected_occupied": float(exp["occupied"]),
                "expected_shared_buckets": float(exp["shared_buckets"]),
                "expected_colliding_ngrams": float(exp["colliding_ngrams"]),
            }
        )
        if view.head == 0:  # the heads of one (layer, order) come one after another
            self._probs = []
        self._probs.append(float(1 - np.exp(max(k - 1, 0) * np.log1p(-1.0 / m))))
        if view.head == heads - 1:
            shared, n_keys, n_pos = view.heads_shared()
            res.shared[(view.layer, view.order)] = shared
            expected = poisson_binomial(np.array(self._probs)) * k
            for j in range(heads + 1):
                res.heads_shared.append(
                    {
                        "layer": view.layer,
                        "order": view.order,
                        "heads_shared": j,
                        "ngrams": int(n_keys[j]),
                        "positions": int(n_pos[j]),
                        "expected_ngrams": float(expected[j]),
                    }
                )
        n_examples, per_bucket, candidates = self.params
        if n_examples and n_colliding:
            top = self._top_colliding(view, stats, candidates)
            res.examples += _column_examples(view, top, n_examples, per_bucket, frequent=True)

    def _top_colliding(self, view, stats, candidates: int) -> np.ndarray:
        """The ``candidates`` most frequent colliding keys (ties: smaller index). The order's
        most frequent keys are ranked once for all its columns (twice as many as the first column's
        share of colliding keys needs, up to 64 x ``candidates``); a column with fewer colliding
        keys among them ranks its own colliding keys."""
        if self._ranked[0] != view.order:
            u, colliding = len(view.counts), max(stats.shared_totals()[1], 1)
            want = max(candidates, min(2 * candidates * u // colliding, 64 * candidates))
            self._ranked = (view.order, top_indices(view.counts, None, want))
            self.result.ranked[view.order] = (self._ranked[1], view.counts[self._ranked[1]])
        ranked = self._ranked[1]
        hit = ranked[view.per_key_at(ranked) >= 2]
        if len(hit) >= candidates or len(ranked) == len(view.counts):
            return hit[:candidates]  # the global ranking restricted to colliding keys keeps its order
        # ascending; a sorted column (bucket_sort) has every key's bucket size at hand: no search by bucket
        idx = np.flatnonzero(stats.per_key >= 2) if stats.sorted else view.keys_in(stats.occupied[stats.n_ngrams >= 2])
        return idx[top_indices(view.counts[idx], idx, candidates)]


def _column_examples(view, top: np.ndarray, n_examples: int, per_bucket: int, frequent: bool = False) -> list[dict]:
    """The ``n_examples`` example buckets of a column among those of its ``top`` colliding keys:
    ranked by their second largest count, then their positions, then the bucket; only the chosen
    buckets' n-grams are sorted (and unpacked). ``frequent``: ``top`` holds the column's most
    frequent colliding keys, so the buckets' other keys count at most ``min(counts[top])``
    (:func:`_candidate_seconds`)."""
    cand, second = _candidate_seconds(view, top, n_examples, frequent)
    stats = view.stats()
    total = stats.hits[np.searchsorted(stats.occupied, cand)]
    chosen = cand[np.lexsort((cand, -total, -second))[:n_examples]]
    sel, sel_buckets = view.members_of(chosen)
    out = []
    for rank, b in enumerate(chosen, 1):
        members = sel[sel_buckets == b]
        members = members[np.lexsort((members, -view.counts[members]))]  # count desc, then index
        shown = members[:per_bucket]
        for j, (i, ids) in enumerate(zip(shown, view.ngrams_at(shown)), 1):
            out.append(
                {
                    "layer": view.layer,
                    "order": view.order,
                    "head": view.head,
                    "example": rank,
                    "row": int(b) + view.offset,
                    "bucket": int(b),
                    "n_ngrams": len(members),
                    "ngram_rank": j,
                    "ngram_ids": tuple(int(x) for x in ids),
                    "count": int(view.counts[i]),
                }
            )
    return out


def _candidate_seconds(view, top: np.ndarray, n_examples: int, frequent: bool) -> tuple[np.ndarray, np.ndarray]:
    """``(candidate buckets int64 [C] sorted, second largest count of each int64 [C])``: the
    buckets of the ``top`` keys. Where ``top`` holds the most frequent colliding keys (``frequent``)
    a bucket holding two of them has the second of those as its second (its other keys count less
    or the same), and a bucket holding one has a second of at most ``min(counts[top])``: those are
    read (their keys walked) only when enough buckets of the first kind do not beat that bound."""
    b_top, c_top = view.buckets_at(top), view.counts[top]
    cand, group = np.unique(b_top, return_inverse=True)  # every candidate bucket holds >= 2 keys
    if not frequent:
        return cand, view.second_largest(cand)
    by = np.lexsort((-c_top, group))  # by bucket, then count descending
    starts = np.searchsorted(group[by], np.arange(len(cand)))
    n_top = np.diff(np.append(starts, len(by)))
    second = np.where(n_top >= 2, c_top[by][np.minimum(starts + 1, len(by) - 1)], -1)
    alone = n_top < 2
    if alone.any() and np.count_nonzero(second > c_top.min()) < n_examples:
        second[alone] = view.second_largest(cand[alone])
    return cand, second


class CollisionStats(NgramAccumulator):
    """Accumulator of hash bucket collisions (definition in the module docstring); adding, merging
    and sharing the counts as every :class:`NgramAccumulator` (the population of merged shards is
    a union of keys, with position counts summed)."""

    _what = "collision stats"

    # -- per n-gram
    def ngram_heads_shared(self, layer: int, order: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every distinct n-gram of ``order`` with its positions and, for ``layer``, on how many
        heads it shares a bucket: ``(ngrams int64 [U, order] sorted, counts int64 [U], heads_shared int8 [U])``."""
        self.layout.layer_index(layer)
        self.layout.column(order, 0)
        ngrams, counts = self.counts.ngrams(order)
        return ngrams, counts, self._pass().shared[(layer, order)]

    # -- one pass over the columns
    def _pass(self, n_examples: int | None = None, ngrams_per_bucket: int = 4, candidates: int = 200) -> _Pass:
        """All per-column figures in one pass; ``n_examples`` None reuses any cached pass."""
        cached = self._cached(lambda kept: n_examples is None or kept == (n_examples, ngrams_per_bucket, candidates))
        if cached is not None:
            return cached
        return self._run(self._consumer(3 if n_examples is None else n_examples, ngrams_per_bucket, candidates))

    def _consumer(self, n_examples: int, ngrams_per_bucket: int, candidates: int) -> _CollisionConsumer:
        return _CollisionConsumer(self.layout, n_examples, ngrams_per_bucket, candidates)

    def _sort(self, result: _Pass) -> None:
        super()._sort(result)
        result.heads_shared.sort(key=lambda r: (r["layer"], r["order"], r["heads_shared"]))
        result.examples.sort(key=lambda r: (r["layer"], r["order"], r["head"], r["example"], r["ngram_rank"]))

    # -- tables
    def columns(self) -> pd.DataFrame:
        """Per (layer, order, head): observed and expected collision figures (module docstring)."""
        return pd.DataFrame(self._pass().columns)

    def heads_shared(self) -> pd.DataFrame:
        """(layer, order, heads_shared, ngrams, positions, expected_ngrams)."""
        return pd.DataFrame(
            self._pass().heads_shared,
            columns=["layer", "order", "heads_shared", "ngrams", "positions", "expected_ngrams"],
        )

    def examples(
        self, n_examples: int = 3, ngrams_per_bucket: int = 4, candidates: int = 200, tokenizer=None
    ) -> pd.DataFrame:
        """Decoded colliding n-grams: (layer, order, head, example, row, bucket, n_ngrams,
        ngram_rank, ngram, ngram_ids, count); ``n_examples`` buckets per column."""
        recs = [dict(r) for r in self._pass(n_examples, ngrams_per_bucket, candidates).examples]
        decoder = make_decoder(self.config, tokenizer, self.counts.pad_id)
        for r in recs:
            ids = r.pop("ngram_ids")
            r["ngram"] = decoder.text(ids) if decoder else ""
            r["ngram_ids"] = " ".join(map(str, ids))
        cols = [
            "layer",
            "order",
            "head",
            "example",
            "row",
            "bucket",
            "n_ngrams",
            "ngram_rank",
            "ngram",
            "ngram_ids",
            "count",
        ]
        return pd.DataFrame(recs, columns=cols)

    def top_ngrams(self, top: int = 50, tokenizer=None) -> pd.DataFrame:
        """The ``top`` most frequent n-grams of each order with, per layer, on how many heads they
        share a bucket: (order, rank, ngram, ngram_ids, count, layer, heads_shared)."""
        decoder = make_decoder(self.config, tokenizer, self.counts.pad_id)
        recs = []
        shared = self._pass().shared
        for order in self.config.ngram_orders:
            best, counts = self._most_frequent(order, top)
            for rank, (i, c, row) in enumerate(zip(best, counts, self.counts.ngrams_at(order, best)), 1):
                ids = tuple(int(x) for x in row)
                text = decoder.text(ids) if decoder else ""
                for layer in self.layout.layer_ids:
                    recs.append(
                        {
                            "order": order,
                            "rank": rank,
                            "ngram": text,
                            "ngram_ids": " ".join(map(str, ids)),
                            "count": int(c),
                            "layer": layer,
                            "heads_shared": int(shared[(layer, order)][i]),
                        }
                    )
        return pd.DataFrame(recs, columns=["order", "rank", "ngram", "ngram_ids", "count", "layer", "heads_shared"])

    def _most_frequent(self, order: int, top: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``top`` most frequent keys of ``order`` (ties: smaller index) and their counts: the
        head of the pass's ranking for the examples where it is long enough, else ranked here."""
        kept = self._pass().ranked.get(order)
        if kept is not None and (len(kept[0]) >= top or len(kept[0]) == self.counts.n_distinct(order)):
            return kept[0][:top], kept[1][:top]
        counts = self.counts.ngram_counts(order)
        best = top_indices(counts, None, top)
        return best, counts[best]

    def to_frame(
        self, n_examples: int = 3, ngrams_per_bucket: int = 4, top: int = 50, tokenizer=None
    ) -> dict[str, pd.DataFrame]:
        """All tables, keyed ``columns``, ``heads_shared``, ``examples``, ``top_ngrams``."""
        return {
            "columns": self.columns(),
            "heads_shared": self.heads_shared(),
            "examples": self.examples(n_examples, ngrams_per_bucket, tokenizer=tokenizer),
            "top_ngrams": self.top_ngrams(top, tokenizer),
        }

    def summary(self) -> dict:
        """Plain-JSON totals per (layer, order): distinct n-grams, colliding share observed and expected."""
        cols = self.columns()
        out = {"positions": self.counts.n_positions, "layers": {}}
        for layer in self.layout.layer_ids:
            per = {}
            for order in self.config.ngram_orders:
                c = cols[(cols.layer == layer) & (cols.order == order)]
                k = int(c.distinct_ngrams.iloc[0]) if len(c) else 0
                per[str(order)] = {
                    "distinct_ngrams": k,
                    "colliding_ngrams_per_head": float(c.colliding_ngrams.mean()) if len(c) else 0.0,
                    "expected_colliding_ngrams_per_head": float(c.expected_colliding_ngrams.mean()) if len(c) else 0.0,
                    "colliding_position_share": float(c.colliding_positions.sum() / max(c.positions.sum(), 1)),
                }
            out["layers"][str(layer)] = per
        return out

    # -- per position
    def _shared_windows(self, windows: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """bool ``[N, n_layers, n_hash_cols]`` for windows ``[N, max_ngram]`` (one pass over the population)."""
        out = np.zeros((len(windows), len(self.layout.layer_ids), self.layout.n_hash_cols), dtype=bool)
        for order in self.config.ngram_orders:
            q = window_ngrams(windows, order)
            member = (self.counts.count_of(q) > 0).astype(np.int64)
            stored, _ = self.counts.ngrams(order)
            for li in range(len(self.layout.layer_ids)):
                hs, hq = ngram_hashes(self.layout, li, stored), ngram_hashes(self.layout, li, q)
                for head in range(self.layout.n_heads):
                    col = self.layout.column(order, head)
                    p = int(self.layout.column_primes[li, col])
                    out[:, li, col] = bucket_lookup(hs % p, p, hq % p) - member >= 1
        out &= mask[:, None, None]
        return out

    def shared_rows(self, compressed, token_mask=None) -> np.ndarray:
        """For sequences of compressed ids ``[B, T]`` or ``[T]`` (each from position 0, token_mask
        False at image positions): bool ``[B, T, n_layers, n_hash_cols]`` (or ``[T, ...]``), True
        where the position's row also holds a distinct key other than its own. Image positions: False.
        Every call hashes the whole population once: pass many sequences per call
        (``shared_rows_ragged`` for sequences of different lengths)."""
        c = np.asarray(compressed.detach().cpu().numpy() if hasattr(compressed, "detach") else compressed)
        windows, mask = sequence_windows(c, self.counts.pad_id, self.config.engram_max_ngram_size, token_mask)
        return self._shared_windows(windows, mask).reshape(*c.shape, len(self.layout.layer_ids), -1)

    def shared_rows_ragged(self, sequences, token_masks=None) -> list[np.ndarray]:
        """``shared_rows`` of sequences of different lengths (a list of ``[T_i]`` compressed ids,
        optional list of bool ``[T_i]`` masks) in one pass: a list of bool ``[T_i, n_layers, 24]``."""
        sequences = [np.asarray(x.detach().cpu().numpy() if hasattr(x, "detach") else x) for x in sequences]
        if token_masks is not None and len(token_masks) != len(sequences):
            raise InputError(
                f"token_masks has {len(token_masks)} entries, expected one per sequence ({len(sequences)})"
            )
        parts = [
            sequence_windows(
                c,
                self.counts.pad_id,
                self.config.engram_max_ngram_size,
                None if token_masks is None else token_masks[i],
            )
            for i, c in enumerate(sequences)
        ]
        if not parts:
            return []
        flat = self._shared_windows(np.concatenate([w for w, _ in parts]), np.concatenate([m for _, m in parts]))
        return np.split(flat, np.cumsum([len(c) for c in sequences])[:-1])

    def exposure(self, compressed, token_mask=None) -> np.ndarray:
        """Collision exposure int64 ``[B, T, n_layers]`` (or ``[T, n_layers]``): how many of the
        position's rows are shared with a different n-gram (0..n_hash_cols; 0 at image positions)."""
        return self.shared_rows(compressed, token_mask).sum(-1)

    def exposure_ragged(self, sequences, token_masks=None) -> list[np.ndarray]:
        """``exposure`` of sequences of different lengths in one pass: a list of int64 ``[T_i, n_layers]``."""
        return [s.sum(-1) for s in self.shared_rows_ragged(sequences, token_masks)]


def analyse_together(
    usage: RowUsage,
    collisions: CollisionStats,
    top: int = 20,
    ngrams_per_row: int = 5,
    n_examples: int = 3,
    ngrams_per_bucket: int = 4,
    candidates: int = 200,
) -> None:
    """Fill both analyses' tables in one pass over the columns (each column's occupancy computed
    once). ``usage`` and ``collisions`` must share one :class:`NgramCounts`."""
    if usage.counts is not collisions.counts:
        raise InputError("analyse_together needs a RowUsage and a CollisionStats over the same NgramCounts")
    u = usage._consumer(top, ngrams_per_row)
    c = collisions._consumer(n_examples, ngrams_per_bucket, candidates)
    run_column_pass(usage.layout, usage.counts, [u, c])
    usage._finish(u)
    collisions._finish(c)
