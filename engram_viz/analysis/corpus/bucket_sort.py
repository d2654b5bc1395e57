"""A sparse column's n-grams sorted by bucket in one compiled pass: every occupancy figure from the runs.

Under V4.1-Flash a column has ~16 M buckets and at most a few million distinct n-grams, so a
counter per bucket (``bucket_passes``' dense tally) is two 128 MB arrays page-faulted in and hit
at random for each of the 48 columns. Instead the kernel sorts the (bucket, index) pairs, packed
as ``bucket << 32 | index`` in one int64, with a stable least-significant-digit radix sort: the
bucket's bits in 2 to 4 digits of at most 9 bits (V4.1: 24 bits, 3 digits of 8), every digit's
histogram counted in one read of the buckets, then one scatter per digit through a few KB of
offsets (in cache). Stable, so within a bucket the indices stay ascending: the sorted indices are
``ColumnStats.order`` as ``np.argsort(buckets, kind="stable")`` gives it. One pass over the runs of
equal buckets then yields the occupied buckets, their n-grams and summed positions, and each
n-gram's bucket size (``per_key``). Memory: a few int64 arrays of U entries, nothing per bucket.
Without numba :func:`sort_kernel` returns None and ``bucket_passes`` takes its numpy path (the
tables are the same: tested).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np

from engram_viz._compiled import compiled_kernel, readonly

DIGIT_BITS = 9  # at most 512 offsets a digit: every digit's histogram stays in L1
INDEX_BITS = 32  # a pair is bucket << 32 | index: indices below 2**32, buckets below 2**31


def _sort_tally(buckets, counts, bits):  # pragma: no cover - compiled by numba (sort_kernel)
    """``(order, occupied, n_ngrams, hits, per_key)`` int64 (``order`` and ``per_key`` [U], the
    rest [R]) of buckets below ``2**bits``: radix sort of the packed pairs, each carrying its count
    (no gather at random afterwards), then the runs counted, then read."""
    u = buckets.shape[0]
    passes = max((bits + 8) // 9, 1)
    width = (bits + passes - 1) // passes
    mask = (np.int64(1) << width) - 1
    offsets = np.zeros((passes, np.int64(1) << width), np.int64)
    a = np.empty(u, np.int64)
    for i in range(u):
        b = buckets[i]
        a[i] = (b << 32) | i
        for p in range(passes):
            offsets[p, (b >> (p * width)) & mask] += 1
    for p in range(passes):  # exclusive prefix sums: where each digit's pairs start
        total = 0
        for d in range(offsets.shape[1]):
            c = offsets[p, d]
            offsets[p, d] = total
            total += c
    t, ac, tc = np.empty(u, np.int64), counts.copy(), np.empty(u, np.int64)
    for p in range(passes):
        shift = 32 + p * width
        for i in range(u):
            v = a[i]
            d = (v >> shift) & mask
            at = offsets[p, d]
            t[at], tc[at] = v, ac[i]
            offsets[p, d] = at + 1
        a, t, ac, tc = t, a, tc, ac
    r, prev = 0, np.int64(-1)
    for j in range(u):  # the occupied buckets, to size their arrays
        if a[j] >> 32 != prev:
            r, prev = r + 1, a[j] >> 32
    occupied, n_ngrams, hits = np.empty(r, np.int64), np.empty(r, np.int64), np.empty(r, np.int64)
    order = t  # the spare buffer takes the indices
    r, prev = -1, np.int64(-1)
    for j in range(u):
        b = a[j] >> 32
        order[j] = a[j] & 0xFFFFFFFF
        if b != prev:
            r += 1
            occupied[r], n_ngrams[r], hits[r], prev = b, 0, 0, b
        n_ngrams[r] += 1
        hits[r] += ac[j]
    per_key = a  # the sorted pairs are read: their buffer takes each n-gram's bucket size
    j = 0
    for k in range(r + 1):
        for m in range(j, j + n_ngrams[k]):
            per_key[order[m]] = n_ngrams[k]
        j += n_ngrams[k]
    return order, occupied, n_ngrams, hits, per_key


@functools.lru_cache(maxsize=1)
def sort_kernel() -> Callable | None:
    """The compiled :func:`_sort_tally` (``kernel(buckets, counts, bits)``), or None without numba."""
    source = "import numpy as np\n\n\n" + inspect.getsource(_sort_tally)
    out = "Tuple((int64[::1], int64[::1], int64[::1], int64[::1], int64[::1]))"
    signature = f"{out}({readonly('int64')}, {readonly('int64')}, int64)"
    return compiled_kernel(source, "bucket_sort", "_sort_tally", signature, nogil=True, boundscheck=False)


def sort_tally(kernel: Callable, buckets: np.ndarray, counts: np.ndarray, prime: int) -> tuple[np.ndarray, ...]:
    """``(order int64 [U], occupied int64 [R], n_ngrams int64 [R], hits int64 [R], per_key int64
    [U])`` of a column's ``buckets`` (int64 ``[U]`` in ``[0, prime)``, ``prime <= 2**31``, ``U <
    2**32``) and ``counts`` by the compiled ``kernel`` (:func:`sort_kernel`)."""
    bits = max(int(prime - 1).bit_length(), 1)
    return kernel(np.ascontiguousarray(buckets, np.int64), np.ascontiguousarray(counts, np.int64), bits)


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
