"""Column passes: the distinct n-grams of one (layer, order, head) column and their buckets.

:func:`iter_columns` yields every column as a :class:`ColumnView` (each order's n-grams unpacked
once, hashed once per layer); ``ColumnView.stats()`` derives the occupancy all analyses read
once per column: a counter per bucket where the column is dense (one compiled pass with numba,
else bincounts), one sort of (bucket, count) pairs where it is sparse. :func:`top_indices` is the deterministic top-k they rank with.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from engram_viz._compiled import compiled_kernel
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.row_ids import ngram_hashes, reduce_mod
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

# A column whose prime is at most DENSE_RATIO x its distinct n-grams is tallied into one counter per
# bucket (bincount: no sort, no gather over a permutation); a sparser one (V4.1's ~16M buckets per
# column) sorts its (bucket, count) pairs once, where most n-grams sit alone in their bucket.
DENSE_RATIO = 8
TALLY_MIN = 1 << 18  # n-grams from which a dense column is tallied by the compiled loop (numba)
_COUNT_BITS = 38  # a sorted pair is bucket << 38 | count: buckets below 2**25, counts below 2**38


@dataclass
class ColumnStats:
    """Occupancy of one column, computed once: ``occupied`` int64 ``[R]`` (sorted buckets holding
    at least one n-gram), ``n_ngrams`` and ``hits`` int64 ``[R]`` (distinct n-grams and summed
    positions per occupied bucket), ``per_key`` int64 ``[U]`` (distinct n-grams in each n-gram's
    own bucket, itself included). ``order`` and ``starts`` (the n-grams grouped by bucket) cost a
    sort and are computed only when asked for."""

    occupied: np.ndarray
    n_ngrams: np.ndarray
    hits: np.ndarray
    per_key: np.ndarray
    buckets: np.ndarray = field(repr=False)  # int64 [U], the view's

    @cached_property
    def order(self) -> np.ndarray:
        """int64 ``[U]``: ``order[starts[r] : starts[r] + n_ngrams[r]]`` are the n-grams (ascending)
        of bucket ``occupied[r]`` (one stable sort)."""
        return np.argsort(self.buckets, kind="stable")

    @cached_property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.n_ngrams) - self.n_ngrams

    def totals_without(self, left_out: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(n_ngrams, hits)`` int64 ``[R]`` per occupied bucket with the n-grams ``left_out``
        (bool ``[U]``, few: e.g. special-only n-grams) not counted; ``counts`` the view's. No sort:
        only the left-out n-grams are looked up."""
        idx = np.flatnonzero(left_out)
        at = np.searchsorted(self.occupied, self.buckets[idx])
        n_ngrams, hits = self.n_ngrams.copy(), self.hits.copy()
        np.subtract.at(n_ngrams, at, 1)
        np.subtract.at(hits, at, counts[idx])
        return n_ngrams, hits


def _tally(buckets, counts, prime):  # pragma: no cover - compiled by numba (_dense_kernel)
    """``(n-grams per bucket int64 [prime], positions per bucket int64 [prime], n-grams in each
    n-gram's bucket int64 [U])``: both counters in one pass, the gather in a second."""
    n_per = np.zeros(prime, np.int64)
    hits = np.zeros(prime, np.int64)
    for i in range(buckets.shape[0]):
        n_per[buckets[i]] += 1
        hits[buckets[i]] += counts[i]
    per_key = np.empty(buckets.shape[0], np.int64)
    for i in range(buckets.shape[0]):
        per_key[i] = n_per[buckets[i]]
    return n_per, hits, per_key


@functools.lru_cache(maxsize=1)
def _dense_kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_tally)
    signature = "Tuple((int64[::1], int64[::1], int64[::1]))(int64[::1], int64[::1], int64)"
    return compiled_kernel(source, "bucket_tally", "_tally", signature, nogil=True, boundscheck=False)


def _dense_stats(buckets: np.ndarray, counts: np.ndarray, prime: int) -> ColumnStats:
    """One counter per bucket: the compiled tally (``_tally``) from ``TALLY_MIN`` n-grams when numba
    is installed, else two bincounts over the n-grams and a gather from [prime] (in cache)."""
    kernel = _dense_kernel() if len(buckets) >= TALLY_MIN else None
    if kernel is not None:
        n_per, hits, per_key = kernel(np.ascontiguousarray(buckets), np.ascontiguousarray(counts), prime)
        occupied = np.flatnonzero(n_per)
        return ColumnStats(occupied, n_per[occupied], hits[occupied], per_key, buckets)
    n_per = np.bincount(buckets, minlength=prime)
    occupied = np.flatnonzero(n_per)
    hits = np.bincount(buckets, weights=counts, minlength=prime)[occupied]  # float64: exact below 2**53
    return ColumnStats(occupied, n_per[occupied], hits.astype(np.int64), n_per[buckets], buckets)


def _sorted_stats(buckets: np.ndarray, counts: np.ndarray) -> ColumnStats:
    """One sort of packed (bucket, count) pairs; the runs of equal buckets give every figure, and
    only the n-grams of shared buckets (few, in a sparse column) are looked up again."""
    u = len(buckets)
    packed = (buckets << _COUNT_BITS) | counts
    packed.sort()
    b = packed >> _COUNT_BITS
    first = np.flatnonzero(np.r_[True, b[1:] != b[:-1]]) if u else np.empty(0, np.int64)
    n_ngrams = np.diff(np.append(first, u))
    sorted_counts = packed & ((1 << _COUNT_BITS) - 1)
    hits = np.add.reduceat(sorted_counts, first) if u else np.empty(0, np.int64)
    occupied = b[first]
    per_key = np.ones(u, dtype=np.int64)
    shared = n_ngrams >= 2
    if shared.any():
        shared_buckets, shared_sizes = occupied[shared], n_ngrams[shared]
        at = np.minimum(np.searchsorted(shared_buckets, buckets), len(shared_buckets) - 1)
        found = shared_buckets[at] == buckets
        per_key[found] = shared_sizes[at[found]]
    return ColumnStats(occupied, n_ngrams, hits, per_key, buckets)


def _packable(buckets: np.ndarray, counts: np.ndarray, prime: int) -> bool:
    return prime <= 1 << (63 - _COUNT_BITS) and (not len(counts) or int(counts.max()) < 1 << _COUNT_BITS)


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
    positions: int = -1  # counts.sum(): positions of the order (the same for every column of it)
    _stats: ColumnStats | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.positions < 0:
            self.positions = int(self.counts.sum())

    def stats(self) -> ColumnStats:
        """The column's occupancy (computed on first use, then kept on the view, so every consumer
        of a pass shares it). Memory: a few arrays of U entries, plus one counter per bucket when
        the column is dense (prime <= DENSE_RATIO x U)."""
        if self._stats is None:
            u = len(self.buckets)
            if self.prime <= DENSE_RATIO * max(u, 1):
                self._stats = _dense_stats(self.buckets, self.counts, self.prime)
            elif _packable(self.buckets, self.counts, self.prime):
                self._stats = _sorted_stats(self.buckets, self.counts)
            else:  # a prime above 2**25 or a count above 2**38: tally the sparse column by np.unique
                occupied, inverse, n = np.unique(self.buckets, return_inverse=True, return_counts=True)
                hits = np.bincount(inverse, weights=self.counts, minlength=len(occupied)).astype(np.int64)
                self._stats = ColumnStats(occupied, n.astype(np.int64), hits, n[inverse].astype(np.int64), self.buckets)
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
        """Indices (into ``ngrams``, ascending) of the n-grams landing in any of ``buckets``: one
        scan of the column's buckets through a table of the buckets asked for (no sort)."""
        q = np.asarray(buckets, dtype=np.int64).ravel()
        q = q[(q >= 0) & (q < self.prime)]
        if not len(q) or not len(self.buckets):
            return np.empty(0, dtype=np.int64)
        asked = np.zeros(self.prime, dtype=bool)  # one byte per bucket: 16 MB on V4.1's largest column
        asked[q] = True
        return np.flatnonzero(asked[self.buckets])

    def grouped(self) -> tuple[np.ndarray, np.ndarray]:
        """The n-grams grouped by bucket: ``(order int64 [U], starts int64 [R])``, where
        ``order[starts[r] : starts[r] + n_ngrams[r]]`` are the n-grams (ascending) of bucket
        ``occupied[r]`` (one stable sort, for a caller that walks every bucket's members)."""
        s = self.stats()
        return s.order, s.starts


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
    b = reduce_mod(h, p, np.empty_like(h))
    return ColumnView(layer, layer_index, order, head, col, p, int(layout.offsets[layer_index, col]), ngrams, c, b)


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
        positions = int(c.sum())
        for li, layer in enumerate(layout.layer_ids):
            h = ngram_hashes(layout, li, ngrams)  # >= 0: every product stays below 2**63
            for head in range(layout.n_heads):
                col = (n - 2) * layout.n_heads + head
                p = int(layout.column_primes[li, col])
                b = reduce_mod(h, p, np.empty_like(h))  # h % p without a division per n-gram
                yield ColumnView(layer, li, n, head, col, p, int(layout.offsets[li, col]), ngrams, c, b, positions)


def top_indices(values: np.ndarray, tiebreak: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest ``values``, ties broken by the smaller ``tiebreak`` (deterministic;
    ``tiebreak`` holds distinct values). Values in ``[0, 2**31)`` and tiebreaks in ``[0, 2**32)``
    (counts, rows, indices) are packed into one distinct int64 key each, ``value << 32 | ~tiebreak``,
    so one partition finds the k (numpy's introselect slows to a crawl on the many equal counts of
    a corpus; on distinct keys it stays linear); other inputs take a partition and a sort of the
    candidates at or above the k-th value."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    v, t = np.asarray(values, dtype=np.int64), np.asarray(tiebreak, dtype=np.int64)
    n = len(v)
    if n and 0 <= v.min() and v.max() < 1 << 31 and 0 <= t.min() and t.max() < 1 << 32:
        key = (v << 32) | ((1 << 32) - 1 - t)  # larger key: larger value, then smaller tiebreak
        cand = np.argpartition(key, n - k)[n - k :] if n > k else np.arange(n)
        return cand[np.argsort(-key[cand])]
    if n > k:
        kth = np.partition(v, n - k)[n - k]
        cand = np.flatnonzero(v >= kth)
    else:
        cand = np.arange(n)
    order = np.lexsort((t[cand], -v[cand]))
    return cand[order[:k]]
