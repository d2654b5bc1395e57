"""The distinct packed keys of one batch and how often each occurs, sorted: the counting's sort.

:func:`distinct_counts` takes a batch's keys ``(group, lo)`` (``keys``) and returns, per group,
the sorted distinct ``lo`` with their counts: what ``np.unique(..., return_counts=True)`` gives
per group. With numba installed, batches of ``RADIX_MIN`` keys or more go through a compiled
least-significant-digit radix sort instead (:func:`_radix_runs`: a few passes of ``DIGIT_BITS``
bits over the key's bits, the group as the last digit, then one run-length pass), about three
times faster than numpy's comparison sort on these keys and compiled once per machine
(``_compiled``). The two paths give the same arrays (tested).
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Callable

import numpy as np

from engram_viz._compiled import compiled_kernel

RADIX_MIN = 1 << 18  # keys from which the compiled radix sort is used: past the cost of loading numba and the kernel
DIGIT_BITS = 12  # bits per radix pass: 4,096 counters stay in L1


def _radix_runs(lo, group, key_bits, group_bits, digit_bits):  # pragma: no cover - compiled by numba
    """Sorted by (group, lo): ``(distinct lo uint64 [U], their group uint8 [U], counts int64 [U])``.
    ``lo`` uint64 [N] uses its low ``key_bits`` bits, ``group`` uint8 [N] its low ``group_bits``."""
    n = lo.shape[0]
    a, b = lo.copy(), np.empty_like(lo)
    ga, gb = group.copy(), np.empty_like(group)
    passes = (key_bits + digit_bits - 1) // digit_bits
    width = (key_bits + passes - 1) // passes if passes else 1
    mask = np.uint64((1 << width) - 1)
    counts = np.zeros((1 << max(width, group_bits)) + 1, np.int64)
    for p in range(passes + (1 if group_bits > 0 else 0)):
        counts[:] = 0
        on_group = p == passes
        shift = np.uint64(p * width)
        for i in range(n):
            d = np.int64(ga[i]) if on_group else np.int64((a[i] >> shift) & mask)
            counts[d + 1] += 1
        if counts.max() == n:  # one digit value everywhere: this pass would not move anything
            continue
        for j in range(1, counts.shape[0]):
            counts[j] += counts[j - 1]
        for i in range(n):
            d = np.int64(ga[i]) if on_group else np.int64((a[i] >> shift) & mask)
            b[counts[d]] = a[i]
            gb[counts[d]] = ga[i]
            counts[d] += 1
        a, b = b, a
        ga, gb = gb, ga
    keys, groups, runs = np.empty(n, np.uint64), np.empty(n, np.uint8), np.empty(n, np.int64)
    u = 0
    for i in range(n):
        if u and a[i] == keys[u - 1] and ga[i] == groups[u - 1]:
            runs[u - 1] += 1
        else:
            keys[u], groups[u], runs[u] = a[i], ga[i], 1
            u += 1
    return keys[:u], groups[:u], runs[:u]


@functools.lru_cache(maxsize=1)
def _kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_radix_runs)
    signature = "Tuple((uint64[::1], uint8[::1], int64[::1]))(uint64[::1], uint8[::1], int64, int64, int64)"
    return compiled_kernel(source, "key_sort", "_radix_runs", signature, nogil=True)


def distinct_counts(
    lo: np.ndarray, group: np.ndarray | None, key_bits: int, group_bits: int = 0
) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """``[(group, distinct lo uint64 [U_g] ascending, counts int64 [U_g])]`` by ascending group, of
    a batch's keys ``lo`` (uint64 [N], ``key_bits`` bits used) and ``group`` (uint8 [N] of
    ``group_bits`` bits, or None: all in group 0)."""
    lo = np.ascontiguousarray(lo, dtype=np.uint64)
    kernel = _kernel() if len(lo) >= RADIX_MIN else None
    if kernel is None:
        if group is None:
            keys, counts = np.unique(lo, return_counts=True)
            return [(0, keys, counts.astype(np.int64))] if len(keys) else []
        out = []
        for g in np.flatnonzero(np.bincount(group)):
            keys, counts = np.unique(lo[group == g], return_counts=True)
            out.append((int(g), keys, counts.astype(np.int64)))
        return out
    groups = np.zeros(len(lo), np.uint8) if group is None else np.ascontiguousarray(group, dtype=np.uint8)
    return by_group(*kernel(lo, groups, key_bits, group_bits if group is not None else 0, DIGIT_BITS))


def by_group(lo: np.ndarray, group: np.ndarray, counts: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """Keys sorted by (group, lo) with their counts, cut where the group changes: ``[(group, lo
    uint64 [U_g], counts int64 [U_g])]`` by ascending group (views)."""
    if not len(lo):
        return []
    bounds = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1, len(lo)]
    return [(int(group[a]), lo[a:b], counts[a:b]) for a, b in itertools.pairwise(bounds.tolist())]
