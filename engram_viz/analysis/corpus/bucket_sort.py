"""A sparse column's n-grams sorted by bucket in one compiled pass: every occupancy figure from the runs.

Under V4.1-Flash a column has ~16 M buckets and at most a few million distinct n-grams, so a
counter per bucket (``bucket_passes``' dense tally) is two 128 MB arrays page-faulted in and hit
at random for each of the 48 columns. Instead the kernel sorts the n-grams by bucket with a stable
least-significant-digit radix sort of one int64 per n-gram, its bucket, index and count packed
(``bucket << low | index << cbits | count``, a count too large for its field read from the counts):
the bucket's bits in 2 to 4 digits of at most 9 bits (V4.1: 24 bits, 3 digits of 8), every digit's
histogram counted in its own read of the buckets, then one scatter per digit through a few KB of
offsets (in cache), the first one packing. Stable, so within a bucket the indices stay ascending:
the sorted indices are ``ColumnStats.order`` as ``np.argsort(buckets, kind="stable")`` gives it.
One pass over the runs of equal buckets then yields the occupied buckets, their n-grams and
summed positions, each n-gram's bucket size (``per_key``) and the shared buckets' totals, with no gather at random but
``per_key``'s. Memory: the outputs, a few int64 arrays of U entries, and the sort's two buffers
(``SortScratch``, reused across columns); nothing per bucket.
The kernel takes the column's pre-modulo hashes and reduces them itself (``hash % prime`` by a float
reciprocal, corrected by one step: exact from primes above ``2**12``) into the sort's second buffer,
so no column writes a fresh [U] array of buckets; a bucket asked for later is hashed on its own.
Without numba :func:`sort_kernel` returns None and ``bucket_passes`` takes its numpy path (the
tables are the same: tested).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np

from engram_viz._compiled import compiled_kernel, readonly
from engram_viz.analysis.corpus.row_ids import fresh_rows
from engram_viz.errors import InputError


def _sort_tally(
    hashes, counts, prime, bits, ibits, a, t, order, per_key, occupied, n_ngrams, hits, shared
):  # pragma: no cover
    """Fill ``order`` and ``per_key`` [U], ``occupied``, ``n_ngrams`` and ``hits`` [R], ``shared`` [3] from the
    buckets ``hashes % prime`` (``hashes`` in ``[0, 2**63)``, ``prime`` in ``(2**12, 2**bits]``, or ``hashes``
    below ``prime``), indices below ``2**ibits``; return R. Packed entry: ``bucket << low |
    index << cbits | min(count, cmax)``, a count field at ``cmax`` read from ``counts`` instead (few:
    V4.1 leaves 17 bits). ``a`` and ``t`` [U]: the sort's buffers. ``shared``: the buckets holding >= 2
    n-grams, their n-grams and their positions. Compiled by numba (sort_kernel)."""
    u = hashes.shape[0]
    passes = max((bits + 8) // 9, 1)  # digits of at most 9 bits: 512 offsets, in L1
    width = (bits + passes - 1) // passes
    mask = (np.int64(1) << width) - 1
    cbits = 63 - bits - ibits
    low, cmax, imask = ibits + cbits, (np.int64(1) << cbits) - 1, (np.int64(1) << ibits) - 1
    offsets = np.zeros((passes, np.int64(1) << width), np.int64)
    buckets, inverse = t, 1.0 / prime  # t holds the buckets until the second digit's scatter
    for i in range(u):  # x - q * prime, q from a float reciprocal: off by at most one (x / prime < 2**51)
        x = hashes[i]
        b = x - np.int64(x * inverse) * prime
        buckets[i] = b + prime if b < 0 else (b - prime if b >= prime else b)
    for p in range(passes):  # every digit's histogram, one read of the buckets each (faster than one read for all)
        shift, row = p * width, offsets[p]
        for i in range(u):
            row[(buckets[i] >> shift) & mask] += 1
    for p in range(passes):  # exclusive prefix sums: where each digit's entries start
        total = 0
        for d in range(offsets.shape[1]):
            total, offsets[p, d] = total + offsets[p, d], total
    for i in range(u):  # the lowest digit's scatter packs the entries
        d = buckets[i] & mask
        a[offsets[0, d]] = (buckets[i] << low) | (np.int64(i) << cbits) | min(counts[i], cmax)
        offsets[0, d] += 1
    for p in range(1, passes):
        shift = low + p * width
        for i in range(u):
            d = (a[i] >> shift) & mask
            t[offsets[p, d]] = a[i]
            offsets[p, d] += 1
        a, t = t, a
    r, prev = -1, np.int64(-1)
    for j in range(u):  # the runs of equal buckets, in order
        b, i, c = a[j] >> low, (a[j] >> cbits) & imask, a[j] & cmax
        order[j] = i
        if b != prev:
            r += 1
            occupied[r], n_ngrams[r], hits[r], prev = b, 0, 0, b
        n_ngrams[r] += 1
        hits[r] += c if c < cmax else counts[i]
    per_key[:] = 1  # in order; then only the keys of shared buckets (few in a sparse column) at random
    j, shared[:] = 0, 0
    for k in range(r + 1):
        if n_ngrams[k] > 1:
            shared[0], shared[1], shared[2] = shared[0] + 1, shared[1] + n_ngrams[k], shared[2] + hits[k]
            for m in range(j, j + n_ngrams[k]):
                per_key[order[m]] = n_ngrams[k]
        j += n_ngrams[k]
    return r + 1


@functools.lru_cache(maxsize=1)
def sort_kernel() -> Callable | None:
    """The compiled :func:`_sort_tally`, or None without numba."""
    source = "import numpy as np\n\n\n" + inspect.getsource(_sort_tally)
    signature = f"int64({readonly('int64')}, {readonly('int64')}, int64, int64, int64{', int64[::1]' * 8})"
    return compiled_kernel(source, "bucket_sort", "_sort_tally", signature, nogil=True, boundscheck=False)


VALUE_KERNEL_MIN = 1 << 18  # entries from which value_tally's compiled read pays for loading it


def _value_tally(values, counts, n_keys, n_pos):  # pragma: no cover - compiled by numba (value_tally)
    for i in range(values.shape[0]):
        n_keys[values[i]] += 1
        n_pos[values[i]] += counts[i]


@functools.lru_cache(maxsize=1)
def _value_kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_value_tally)
    signature = f"void({readonly('int8')}, {readonly('int64')}, int64[::1], int64[::1])"
    return compiled_kernel(source, "value_tally", "_value_tally", signature, nogil=True, boundscheck=False)


def value_tally(values: np.ndarray, counts: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(keys int64 [n], positions int64 [n])``: how many entries of ``values`` (int8 ``[U]`` in
    ``[0, n)``) have each value, and their summed ``counts``: one compiled read (numba) from
    ``VALUE_KERNEL_MIN`` entries (below, loading it costs more), else two bincounts (the weighted one
    through float64, exact below 2**53)."""
    kernel = _value_kernel() if len(values) >= VALUE_KERNEL_MIN else None
    if kernel is None:
        n_pos = np.bincount(values, weights=counts, minlength=n)
        return np.bincount(values, minlength=n), np.rint(n_pos).astype(np.int64)
    n_keys, n_pos = np.zeros(n, np.int64), np.zeros(n, np.int64)
    kernel(np.ascontiguousarray(values, np.int8), np.ascontiguousarray(counts, np.int64), n_keys, n_pos)
    return n_keys, n_pos


class SortScratch:
    """The radix sort's two int64 buffers, lent to one column at a time: a pass over the columns
    sorts in the same pages instead of fresh ones (``fresh_rows``: populated once, up front)."""

    def __init__(self, rows: int = 0) -> None:
        """``rows``: the size to take on first use (e.g. the largest order's n-grams), or the first asked."""
        self.rows, self._buffer = rows, None

    def take(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        if self._buffer is None or self._buffer.shape[1] < rows:
            self._buffer = fresh_rows((2, max(rows, self.rows)), np.dtype(np.int64))
        return self._buffer[0, :rows], self._buffer[1, :rows]


def sort_tally(
    kernel: Callable, hashes: np.ndarray, counts: np.ndarray, prime: int, scratch: SortScratch | None = None
) -> tuple[np.ndarray, ...]:
    """``(order int64 [U], occupied int64 [R], n_ngrams int64 [R], hits int64 [R], per_key int64
    [U], shared (buckets holding >= 2 n-grams, their n-grams, their positions))`` of a column's
    buckets ``hashes % prime`` (``hashes`` int64 ``[U]`` in ``[0, 2**63)``, e.g. the buckets
    themselves; ``prime <= 2**31``, ``U <= 2**32``) and ``counts`` by the compiled ``kernel``
    (:func:`sort_kernel`, which reduces the hashes itself above ``2**12``); ``scratch`` lends the
    sort's buffers (a fresh one without)."""
    u = len(hashes)
    bits, ibits = max(int(prime - 1).bit_length(), 1), max(u - 1, 0).bit_length()
    scratch = scratch or SortScratch()
    a, t = scratch.take(u)
    order, per_key, occupied, n_ngrams, hits = np.empty((5, u), np.int64)  # the column's own: its stats keep them
    h, c = np.ascontiguousarray(hashes, np.int64), np.ascontiguousarray(counts, np.int64)
    if prime <= 1 << 12:  # the kernel's float reciprocal is exact to one only from there
        h = h % prime
    shared = np.zeros(3, np.int64)
    r = kernel(h, c, prime, bits, ibits, a, t, order, per_key, occupied, n_ngrams, hits, shared)
    return order, occupied[:r], n_ngrams[:r], hits[:r], per_key, tuple(int(x) for x in shared)


def sorted_members(
    occupied: np.ndarray, n_ngrams: np.ndarray, starts: np.ndarray, order: np.ndarray, asked: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``(indices int64 [M], bucket of each int64 [M])`` of the n-grams in the distinct sorted
    buckets ``asked``, bucket by bucket, from a column's occupancy (``occupied``, ``n_ngrams``)
    and its n-grams grouped by bucket (``order``, ``starts``): only those n-grams are read."""
    at = np.minimum(np.searchsorted(occupied, asked), max(len(occupied) - 1, 0))
    at = at[occupied[at] == asked] if len(occupied) else at[:0]
    n = n_ngrams[at]
    ends = np.cumsum(n)
    pos = np.arange(int(ends[-1]) if len(ends) else 0) + np.repeat(starts[at] - (ends - n), n)
    return order[pos], np.repeat(occupied[at], n)


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
