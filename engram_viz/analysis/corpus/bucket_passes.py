"""Column passes: the distinct n-grams of one (layer, order, head) column and their buckets.

:func:`iter_columns` yields every column as a :class:`ColumnView` (each order's n-grams unpacked
once, hashed once per layer); ``ColumnView.stats()`` sorts its buckets once into the occupancy
all analyses read. :func:`top_indices` is the deterministic top-k they rank with.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.row_ids import ngram_hashes
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError


@dataclass
class ColumnStats:
    """Occupancy of one column, computed once by one sort of its buckets: ``occupied`` int64
    ``[R]`` (sorted buckets holding at least one n-gram), ``n_ngrams`` and ``hits`` int64 ``[R]``
    (distinct n-grams and summed positions per occupied bucket), ``starts`` int64 ``[R]`` and
    ``order`` int64 ``[U]`` (``order[starts[r] : starts[r] + n_ngrams[r]]`` are the n-grams of
    bucket ``occupied[r]``), ``per_key`` int64 ``[U]`` (distinct n-grams in each n-gram's own
    bucket, itself included)."""

    occupied: np.ndarray
    n_ngrams: np.ndarray
    hits: np.ndarray
    starts: np.ndarray
    order: np.ndarray
    per_key: np.ndarray


def _sorted_runs(buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(order, sorted buckets)``, stable: one SIMD sort of ``bucket << 32 | index`` when it fits."""
    n = len(buckets)
    if n < 1 << 32 and (not n or int(buckets.max()) < 1 << 31):
        packed = (buckets.astype(np.int64) << 32) | np.arange(n, dtype=np.int64)
        packed.sort()
        return packed & 0xFFFF_FFFF, packed >> 32
    order = np.argsort(buckets, kind="stable")
    return order, buckets[order]


@dataclass
class ColumnView:
    """The distinct n-grams of one (layer, order, head) column and the bucket each lands in."""

    layer: int  # model layer id
    layer_index: int
    order: int
    head: int
    column: int  # (order - 2) * n_heads + head
    prime: int
    offset: int  # row = offset + bucket
    ngrams: np.ndarray  # int64 [U, order], oldest first, sorted
    counts: np.ndarray  # int64 [U], positions carrying each n-gram
    buckets: np.ndarray  # int64 [U], in [0, prime)
    _stats: ColumnStats | None = field(default=None, repr=False, compare=False)

    def stats(self) -> ColumnStats:
        """The column's occupancy (computed on first use, then kept on the view). Memory: a few
        arrays of U entries; never a dense array of the prime's size."""
        if self._stats is None:
            order, b = _sorted_runs(self.buckets)
            u = len(b)
            starts = np.flatnonzero(b[1:] != b[:-1]) + 1 if u else np.empty(0, np.int64)
            starts = np.concatenate([np.zeros(min(u, 1), np.int64), starts])
            lengths = np.diff(np.append(starts, u)).astype(np.int64)
            hits = np.add.reduceat(self.counts[order], starts).astype(np.int64) if u else np.empty(0, np.int64)
            per_key = np.empty(u, dtype=np.int64)
            per_key[order] = np.repeat(lengths, lengths)
            self._stats = ColumnStats(b[starts], lengths, hits, starts, order, per_key)
        return self._stats

    def bucket_totals(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Occupied buckets (sorted) with their distinct n-grams and summed positions:
        ``(buckets int64 [R], n_ngrams int64 [R], hits int64 [R])``."""
        s = self.stats()
        return s.occupied, s.n_ngrams, s.hits

    def occupancy(self) -> tuple[int, int, np.ndarray]:
        """``(occupied buckets, buckets holding >= 2 distinct n-grams, distinct n-grams in each
        n-gram's bucket int64 [U])``."""
        s = self.stats()
        return len(s.occupied), int(np.count_nonzero(s.n_ngrams >= 2)), s.per_key

    def keys_in(self, buckets: np.ndarray) -> np.ndarray:
        """Indices (into ``ngrams``, ascending) of the n-grams landing in any of ``buckets``."""
        s = self.stats()
        q = np.unique(np.asarray(buckets, dtype=np.int64))
        if not len(q) or not len(s.occupied):
            return np.empty(0, dtype=np.int64)
        at = np.minimum(np.searchsorted(s.occupied, q), len(s.occupied) - 1)
        at = at[s.occupied[at] == q]
        parts = [s.order[s.starts[r] : s.starts[r] + s.n_ngrams[r]] for r in at.tolist()]
        return np.sort(np.concatenate(parts)) if parts else np.empty(0, dtype=np.int64)


def bucket_lookup(buckets: np.ndarray, prime: int, query: np.ndarray) -> np.ndarray:
    """How many of ``buckets`` (int64 [U], one per distinct n-gram) equal each ``query`` bucket:
    int64 ``[Q]`` (sort + search; ``prime`` is only checked against)."""
    query = np.asarray(query, dtype=np.int64)
    if len(query) and (query.min() < 0 or query.max() >= prime):
        raise InputError(f"query buckets must lie in 0..{prime - 1}")
    b, n = np.unique(buckets, return_counts=True)
    if not len(b):
        return np.zeros(len(query), dtype=np.int64)
    at = np.minimum(np.searchsorted(b, query), len(b) - 1)
    return np.where(b[at] == query, n[at], 0)


def column_view(layout: EngramLayout, counts: NgramCounts, layer_index: int, order: int, head: int) -> ColumnView:
    """One column: the distinct n-grams of ``order`` and their buckets under (layer, head)."""
    col = layout.column(order, head)
    ngrams, c = counts.ngrams(order)
    p = int(layout.column_primes[layer_index, col])
    h = ngram_hashes(layout, layer_index, ngrams)
    layer = layout.layer_ids[layer_index]
    return ColumnView(layer, layer_index, order, head, col, p, int(layout.offsets[layer_index, col]), ngrams, c, h % p)


def run_column_pass(layout: EngramLayout, counts: NgramCounts, consumers: list) -> None:
    """One pass over every column, each consumer called with the same :class:`ColumnView` (so
    its ``stats()`` is computed once for all of them)."""
    for view in iter_columns(layout, counts):
        for consume in consumers:
            consume(view)


def iter_columns(layout: EngramLayout, counts: NgramCounts) -> Iterator[ColumnView]:
    """Every column, one at a time, in (order, layer, head) order: each order's n-grams are
    unpacked once and hashed once per layer."""
    for n in layout.config.ngram_orders:
        ngrams, c = counts.ngrams(n)
        for li, layer in enumerate(layout.layer_ids):
            h = ngram_hashes(layout, li, ngrams)
            for head in range(layout.n_heads):
                col = (n - 2) * layout.n_heads + head
                p = int(layout.column_primes[li, col])
                yield ColumnView(layer, li, n, head, col, p, int(layout.offsets[li, col]), ngrams, c, h % p)


def top_indices(values: np.ndarray, tiebreak: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest ``values``, ties broken by the smaller ``tiebreak`` (deterministic)."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    if len(values) > k:
        kth = np.partition(values, len(values) - k)[len(values) - k]
        cand = np.flatnonzero(values >= kth)
    else:
        cand = np.arange(len(values))
    order = np.lexsort((tiebreak[cand], -values[cand]))
    return cand[order[:k]]
