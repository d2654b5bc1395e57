"""Column passes: the distinct n-grams of one (layer, order, head) column and their buckets.

:func:`iter_columns` yields every column as a :class:`ColumnView`, group by group: the heads of one
(order, layer) share a :class:`ColumnGroup` over the order's keys (``order_keys``). Where numba is
installed and the group is dense (every prime at most ``DENSE_RATIO`` x its distinct n-grams, from
``TALLY_MIN`` of them), one compiled pass over the packed keys (``group_tally``) tallies every head
at once and keeps each bucket's keys as a list: the views read their occupancy from it, walk the
lists for the keys of a few buckets, and unpack an n-gram or hash a key only where asked. Otherwise
each column is hashed and tallied on its own from the unpacked n-grams: sorted by bucket by a compiled
radix sort where its prime is far above cache (``bucket_sort``; V4.1), else a counter per bucket where
dense, one sort of (bucket, count) pairs where sparse; the results are the same (tested).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from functools import cached_property

import numpy as np

from engram_viz._compiled import compiled_kernel, readonly
from engram_viz.analysis.corpus.bucket_sort import SortScratch, sort_kernel, sort_tally, sorted_members, value_tally
from engram_viz.analysis.corpus.group_tally import (
    GroupTally,
    ListBuffer,
    compiled_group_tally,
    count_shift,
    tally_group,
)
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.order_keys import OrderKeys
from engram_viz.analysis.corpus.row_ids import ngram_hashes, reduce_mod
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

# A column whose prime is at most DENSE_RATIO x its distinct n-grams is tallied into one counter per
# bucket (no sort, no gather over a permutation); a sparser one (V4.1's ~16M buckets per column)
# sorts its (bucket, count) pairs once, where most n-grams sit alone in their bucket.
DENSE_RATIO = 8
TALLY_MIN = 1 << 18  # n-grams from which a dense column is tallied by a compiled loop (numba)
GROUP_TABLE_MAX = 1 << 26  # bytes of per-bucket tables (12 a bucket, every head) the group tally may hold
SORT_PRIME_MIN = 1 << 20  # from TALLY_MIN n-grams, a column of more buckets (V4.1) is sorted: bucket_sort
_COUNT_BITS = 38  # a sorted pair is bucket << 38 | count: buckets below 2**25, counts below 2**38


class ColumnStats:
    """Occupancy of one column, computed once: ``occupied`` int64 ``[R]`` (sorted buckets holding
    at least one n-gram), ``n_ngrams`` and ``hits`` int64 ``[R]`` (distinct n-grams and summed
    positions per occupied bucket), ``per_key`` int64 ``[U]`` (distinct n-grams in each n-gram's
    own bucket, itself included). ``per_key``, ``order`` and ``starts`` (the n-grams grouped by
    bucket) are computed when first read where the column's tally did not give them."""

    def __init__(
        self,
        occupied: np.ndarray,
        n_ngrams: np.ndarray,
        hits: np.ndarray,
        per_key: np.ndarray | None = None,
        buckets: np.ndarray | None = None,
        source: tuple[ColumnGroup, int] | None = None,
        order: np.ndarray | None = None,
        shared: tuple[int, int, int] | None = None,
    ):
        """What is not given is computed when first read; the buckets: ``source`` (group, head)'s."""
        self.occupied, self.n_ngrams, self.hits, self._shared = occupied, n_ngrams, hits, shared
        self._per_key, self._buckets, self._source, self._order = per_key, buckets, source, order

    def shared_totals(self) -> tuple[int, int, int]:
        """``(buckets holding >= 2 n-grams, their n-grams, their positions)`` (the sort's read-off counts them)."""
        if self._shared is None:
            on = self.n_ngrams >= 2
            self._shared = (int(np.count_nonzero(on)), int(self.n_ngrams[on].sum()), int(self.hits[on].sum()))
        return self._shared

    @property
    def buckets(self) -> np.ndarray:
        """int64 ``[U]``: the bucket of every n-gram (the view's)."""
        return self._buckets if self._buckets is not None else self._source[0].buckets(self._source[1])

    @property
    def per_key(self) -> np.ndarray:
        if self._per_key is None:
            self._per_key = self.n_ngrams[np.searchsorted(self.occupied, self.buckets)]
        return self._per_key

    def _buckets_at(self, index: np.ndarray) -> np.ndarray:
        return self._buckets[index] if self._buckets is not None else self._source[0].buckets_at(self._source[1], index)

    @property
    def order(self) -> np.ndarray:
        """int64 ``[U]``: ``order[starts[r] : starts[r] + n_ngrams[r]]`` are the n-grams (ascending)
        of bucket ``occupied[r]`` (one stable sort, where the tally did not sort them)."""
        if self._order is None:
            self._order = np.argsort(self.buckets, kind="stable")
        return self._order

    @property
    def sorted(self) -> bool:  # whether ``order`` is at hand (the column was tallied by sorting it: bucket_sort)
        return self._order is not None

    @cached_property
    def starts(self) -> np.ndarray:
        return np.cumsum(self.n_ngrams) - self.n_ngrams

    def totals_without(self, left_out: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(n_ngrams, hits)`` int64 ``[R]`` per occupied bucket with the n-grams ``left_out``
        (bool ``[U]``, few: e.g. special-only n-grams) not counted; ``counts`` the view's."""
        at, n, h = self.changed_without(np.flatnonzero(left_out), counts)
        n_ngrams, hits = self.n_ngrams.copy(), self.hits.copy()
        n_ngrams[at], hits[at] = n, h
        return n_ngrams, hits

    def changed_without(self, keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Where leaving out the n-grams ``keys`` (int64, distinct, few) changes :meth:`totals_without`:
        ``(at int64 [A] ascending, n_ngrams [A], hits [A])``, ``at`` indexing ``occupied`` (no copy of [R])."""
        at, inverse = np.unique(np.searchsorted(self.occupied, self._buckets_at(keys)), return_inverse=True)
        hits = self.hits[at].copy()
        np.subtract.at(hits, inverse, counts[keys])
        return at, self.n_ngrams[at] - np.bincount(inverse, minlength=len(at)), hits


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
    signature = f"Tuple((int64[::1], int64[::1], int64[::1]))({readonly('int64')}, {readonly('int64')}, int64)"
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


def column_stats(
    buckets: np.ndarray | None, counts: np.ndarray, prime: int, scratch: SortScratch | None = None, source=None
) -> ColumnStats:
    """The occupancy of one column from its buckets (int64 ``[U]``; None: those of ``source``, a
    (ColumnGroup, head)) and counts: sorted by the compiled radix sort where it applies (``bucket_sort``,
    in ``scratch``'s buffers; it reduces the group's hashes itself), else dense (a counter per
    bucket) where ``prime <= DENSE_RATIO x U``, else sorted (or ``np.unique`` past the packing)."""
    u = len(counts)
    kernel = sort_kernel() if TALLY_MIN <= u < 1 << 32 and SORT_PRIME_MIN < prime <= 1 << 31 else None
    if kernel is not None:
        hashes = buckets if buckets is not None else source[0].hashes()
        order, occupied, n_ngrams, hits, per_key, shared = sort_tally(kernel, hashes, counts, prime, scratch)
        return ColumnStats(occupied, n_ngrams, hits, per_key, buckets, source, order, shared)
    buckets = buckets if buckets is not None else source[0].buckets(source[1])
    if prime <= DENSE_RATIO * max(len(buckets), 1):
        return _dense_stats(buckets, counts, prime)
    if _packable(buckets, counts, prime):
        return _sorted_stats(buckets, counts)
    # a prime above 2**25 or a count above 2**38: tally the sparse column by np.unique
    occupied, inverse, n = np.unique(buckets, return_inverse=True, return_counts=True)
    hits = np.bincount(inverse, weights=counts, minlength=len(occupied)).astype(np.int64)
    return ColumnStats(occupied, n.astype(np.int64), hits, n[inverse].astype(np.int64), buckets)


class ColumnView:
    """The distinct n-grams of one (layer, order, head) column and the bucket each lands in:
    ``ngrams`` int64 ``[U, order]`` (oldest first, sorted), ``counts`` int64 ``[U]`` (positions
    carrying each), ``buckets`` int64 ``[U]`` in ``[0, prime)``; row = ``offset`` + bucket. Built
    from arrays, or by :func:`iter_columns` over a :class:`ColumnGroup`, where ``ngrams`` and
    ``buckets`` are computed when first read (the methods below read only the keys they need)."""

    def __init__(
        self,
        layer: int,
        layer_index: int,
        order: int,
        head: int,
        column: int,
        prime: int,
        offset: int,
        ngrams: np.ndarray | None,
        counts: np.ndarray,
        buckets: np.ndarray | None,
        positions: int = -1,
        group: ColumnGroup | None = None,
    ):
        self.layer, self.layer_index, self.order, self.head, self.column = layer, layer_index, order, head, column
        self.prime, self.offset, self.counts, self.group = prime, offset, counts, group
        self._ngrams, self._buckets = ngrams, buckets
        self.positions = int(counts.sum()) if positions < 0 else positions  # positions of the order
        self._stats: ColumnStats | None = None

    @property
    def ngrams(self) -> np.ndarray:
        if self._ngrams is None:
            self._ngrams = self.group.keys.ngrams()
        return self._ngrams

    @property
    def buckets(self) -> np.ndarray:
        if self._buckets is None:
            self._buckets = self.group.buckets(self.head)
        return self._buckets

    def _tally(self) -> GroupTally | None:
        return self.group.tally() if self.group is not None else None

    def stats(self) -> ColumnStats:
        """The column's occupancy (computed on first use, then kept on the view, so every consumer
        of a pass shares it). Memory: a few arrays of U entries, plus one counter per bucket when
        the column is dense (prime <= DENSE_RATIO x U)."""
        if self._stats is None:
            tally = self._tally()
            if tally is not None:
                n_per = tally.n_ngrams(self.head, slice(0, self.prime))
                occupied = np.flatnonzero(n_per)
                source = (self.group, self.head)  # the stats read the buckets there: no view <-> stats cycle
                self._stats = ColumnStats(occupied, n_per[occupied], tally.hits(self.head, occupied), source=source)
            else:
                source = (self.group, self.head) if self.group is not None else None
                scratch = self.group and self.group.scratch
                self._stats = column_stats(self._buckets, self.counts, self.prime, scratch, source)
                if self.group is not None:
                    self.group.add_colliding(self.head, self._stats.per_key)
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
        return len(s.occupied), s.shared_totals()[0], s.per_key

    def ngrams_at(self, index: np.ndarray) -> np.ndarray:
        """``ngrams[index]`` (int64 ``[Q, order]``), unpacking only those rows where not yet unpacked."""
        return self.group.keys.ngrams_at(index) if self._ngrams is None else self._ngrams[index]

    def buckets_at(self, index: np.ndarray) -> np.ndarray:
        """``buckets[index]`` (int64 ``[Q]``), hashing only those keys where not yet all hashed."""
        index = np.asarray(index, dtype=np.int64)
        return self.group.buckets_at(self.head, index) if self._buckets is None else self._buckets[index]

    def per_key_at(self, index: np.ndarray) -> np.ndarray:
        """``stats().per_key[index]``: the distinct n-grams in the buckets of the n-grams ``index``."""
        tally = self._tally()
        if tally is None:
            return self.stats().per_key[index]
        return tally.n_ngrams(self.head, self.buckets_at(index))

    def members_of(self, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The n-grams landing in any of ``buckets``, unordered: ``(indices int64 [M], bucket of
        each int64 [M])``. From the group's bucket lists where tallied (only those n-grams are
        read) or slices of the column's sorted order (``bucket_sort``), else one scan of the
        column's buckets through a table of the buckets asked for."""
        q = np.asarray(buckets, dtype=np.int64).ravel()
        q = q[(q >= 0) & (q < self.prime)]
        tally = self._tally()
        if tally is not None:
            return tally.members(self.head, np.unique(q))
        s = self._stats
        if s is not None and s.sorted:  # slices of the order; asked buckets often come sorted: no np.unique then
            return sorted_members(
                s.occupied, s.n_ngrams, s.starts, s.order, q if np.all(q[1:] > q[:-1]) else np.unique(q)
            )
        if not len(q) or not len(self.buckets):
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.int64)
        asked = np.zeros(self.prime, dtype=bool)  # one byte per bucket: 16 MB on V4.1's largest column
        asked[q] = True
        idx = np.flatnonzero(asked[self.buckets])
        return idx, self.buckets[idx]

    def keys_in(self, buckets: np.ndarray) -> np.ndarray:
        """Indices (into ``ngrams``, ascending) of the n-grams landing in any of ``buckets``."""
        idx = self.members_of(buckets)[0]  # unordered from the lists or the sorted runs
        if 16 * len(idx) < len(self.counts):
            return np.sort(idx)
        many = np.zeros(len(self.counts), dtype=bool)
        many[idx] = True
        return np.flatnonzero(many)

    def second_largest(self, buckets: np.ndarray) -> np.ndarray:
        """int64 ``[Q]``: per bucket of ``buckets`` (distinct, in range), the second largest count
        of its n-grams (the largest where two share it; -1 for a bucket of fewer than two)."""
        cand = np.asarray(buckets, dtype=np.int64)
        tally = self._tally()
        if tally is not None:
            return tally.second_largest(self.head, cand, self.counts)
        sel, sel_buckets = self.members_of(cand)
        group = np.searchsorted(np.sort(cand), sel_buckets)
        counts = self.counts[sel]
        largest = np.full(len(cand), -1, dtype=np.int64)
        np.maximum.at(largest, group, counts)
        at_max = np.flatnonzero(counts == largest[group])
        _, first = np.unique(group[at_max], return_index=True)
        rest = counts.copy()
        rest[at_max[first]] = -1  # one largest per bucket left out: the next largest is the second
        second = np.full(len(cand), -1, dtype=np.int64)
        np.maximum.at(second, group, rest)
        return second[np.searchsorted(np.sort(cand), cand)]

    def made_of(self, ids: np.ndarray) -> np.ndarray:
        """Sorted indices of the n-grams whose every id is one of ``ids`` (e.g. BOS, EOS, pad)."""
        if self._ngrams is None:
            return self.group.keys.made_of(ids)
        only = np.flatnonzero(np.isin(self._ngrams[:, 0], ids))  # few start with one
        for j in range(1, self._ngrams.shape[1]):  # the next ids of those only
            only = only[np.isin(self._ngrams[only, j], ids)]
        return only

    def heads_shared(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Over every head of the view's (layer, order) group: ``(heads_shared int8 [U], keys
        int64 [H + 1], positions int64 [H + 1])``, on how many heads each n-gram's bucket holds
        another n-gram, and how many n-grams, and positions, have each value."""
        if self.group is None:
            raise InputError("heads_shared needs a view from iter_columns (the heads of its group)")
        return self.group.heads_shared()

    def grouped(self) -> tuple[np.ndarray, np.ndarray]:
        """The n-grams grouped by bucket: ``(order int64 [U], starts int64 [R])``, where
        ``order[starts[r] : starts[r] + n_ngrams[r]]`` are the n-grams (ascending) of bucket
        ``occupied[r]`` (one stable sort, for a caller that walks every bucket's members)."""
        s = self.stats()
        return s.order, s.starts


class ColumnGroup:
    """The columns of one (order, layer): the order's keys (``OrderKeys``) under each head's prime.
    ``kernel`` (the layout's compiled group tally, or None) tallies every head in one pass on first
    use; without it each head is hashed and tallied on its own and ``heads_shared`` is summed from
    the heads' ``per_key`` as their stats are computed."""

    def __init__(
        self,
        layout: EngramLayout,
        keys: OrderKeys,
        layer_index: int,
        kernel: Callable | None = None,
        lists: ListBuffer | None = None,
        scratch: SortScratch | None = None,
    ):
        self.layout, self.keys, self.layer_index, self.order = layout, keys, layer_index, keys.order
        self.columns = [layout.column(keys.order, head) for head in range(layout.n_heads)]
        self.primes = [int(layout.column_primes[layer_index, c]) for c in self.columns]
        self.kernel, self.scratch = kernel, scratch if scratch is not None else SortScratch()  # the columns' sorts
        self._lists = lists if lists is not None or kernel is None else ListBuffer(len(keys), layout.n_heads)
        self._tally: tuple[GroupTally, int] | None = None  # with the lease of its lists
        self._hashes: np.ndarray | None = None
        self._shared = np.zeros(len(keys), dtype=np.int8) if kernel is None else None
        self._added: set[int] = set()  # heads summed into _shared

    def view(self, head: int) -> ColumnView:
        li, col = self.layer_index, self.columns[head]
        layer, offset = self.layout.layer_ids[li], int(self.layout.offsets[li, col])
        k = self.keys
        return ColumnView(
            layer, li, self.order, head, col, self.primes[head], offset, None, k.counts, None, k.positions, self
        )

    def tally(self) -> GroupTally | None:
        """Every head's tally (the compiled pass, run once; again if a later group took the lists'
        buffer since), or None where the group has no kernel."""
        if self.kernel is None:
            return None
        if self._tally is None or self._tally[1] != self._lists.lease:
            orders = list(self.layout.config.ngram_orders)
            which = orders.index(self.order) * len(self.layout.layer_ids) + self.layer_index
            k = self.keys
            nxt, lease = self._lists.take(len(k))
            self._tally = (
                tally_group(self.kernel, which, max(self.primes), (k.gvals, k.bounds, k.lo, k.counts), nxt),
                lease,
            )
        return self._tally[0]

    def hashes(self) -> np.ndarray:
        """Pre-modulo hashes int64 ``[U]`` of the keys (from the unpacked n-grams; kept)."""
        if self._hashes is None:
            self._hashes = ngram_hashes(self.layout, self.layer_index, self.keys.ngrams())  # >= 0
        return self._hashes

    def buckets(self, head: int) -> np.ndarray:
        """int64 ``[U]``: every key's bucket on ``head`` (``hash % prime`` without a division per key)."""
        h = self.hashes()
        return reduce_mod(h, self.primes[head], np.empty_like(h))

    def buckets_at(self, head: int, index: np.ndarray) -> np.ndarray:
        """int64 ``[Q]``: the buckets of keys ``index`` on ``head``, only those hashed."""
        h = self._hashes[index] if self._hashes is not None else ngram_hashes(
            self.layout, self.layer_index, self.keys.ngrams_at(index)
        )  # fmt: skip
        return h % self.primes[head]

    def add_colliding(self, head: int, per_key: np.ndarray) -> None:
        """Sum a head's colliding keys (``per_key >= 2``) into ``heads_shared`` (numpy path; once per head)."""
        if self._shared is not None and head not in self._added:
            self._shared += per_key >= 2
            self._added.add(head)

    def heads_shared(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(heads_shared int8 [U], keys int64 [H + 1], positions int64 [H + 1])`` (ColumnView.heads_shared)."""
        heads = len(self.primes)
        tally = self.tally()
        if tally is not None:
            return tally.heads_shared, tally.shared_keys, tally.shared_positions
        for head in sorted(set(range(heads)) - self._added):
            self.view(head).stats()  # sums the head in
        return (self._shared, *value_tally(self._shared, self.keys.counts, heads + 1))


def _group_kernel(layout: EngramLayout, keys: OrderKeys, layer_index: int) -> Callable | None:
    """The compiled group tally where it applies: ``TALLY_MIN`` keys or more (below that, loading
    the kernel costs more than it saves), every head dense, the per-bucket tables within
    ``GROUP_TABLE_MAX``, key indices within int32 and a bucket's keys and positions within one
    int64 (``group_tally.count_shift``)."""
    u = len(keys)
    primes = [int(layout.column_primes[layer_index, layout.column(keys.order, h)]) for h in range(layout.n_heads)]
    if u < TALLY_MIN or u >= 1 << 31 or max(primes) > DENSE_RATIO * u or count_shift(u, keys.positions) is None:
        return None
    if 12 * layout.n_heads * max(primes) > GROUP_TABLE_MAX:
        return None
    return compiled_group_tally(layout)


def column_view(layout: EngramLayout, counts: NgramCounts, layer_index: int, order: int, head: int) -> ColumnView:
    """One column: the distinct n-grams of ``order`` and their buckets under (layer, head)."""
    layout.column(order, head)
    return ColumnGroup(layout, OrderKeys(counts, order), layer_index).view(head)


def run_column_pass(layout: EngramLayout, counts: NgramCounts, consumers: list) -> None:
    """One pass over every column, each consumer called with the same :class:`ColumnView` (so
    its ``stats()`` is computed once for all of them)."""
    for view in iter_columns(layout, counts):
        for consume in consumers:
            consume(view)


def iter_columns(layout: EngramLayout, counts: NgramCounts) -> Iterator[ColumnView]:
    """Every column, one at a time, in (order, layer, head) order: the heads of an (order, layer)
    share one :class:`ColumnGroup` (one compiled tally, or one unpacking and hashing of the keys)."""
    # one buffer for the bucket lists and one for the sorts, sized for the largest order up front (where reading
    # the sizes costs nothing: with runs spilled to disk it would cost a merge, and the buffers grow instead)
    orders = layout.config.ngram_orders
    largest = max(counts.n_distinct(n) for n in orders) if not counts.n_spills else 0
    lists, scratch = ListBuffer(largest, layout.n_heads), SortScratch(largest)
    for n in orders:
        keys = OrderKeys(counts, n)
        for li in range(len(layout.layer_ids)):
            group = ColumnGroup(layout, keys, li, _group_kernel(layout, keys, li), lists, scratch)
            for head in range(layout.n_heads):
                yield group.view(head)
