"""The deterministic top-k the corpus tables rank with: the k largest values, ties by the smaller tiebreak.

:func:`top_indices` packs each (value, tiebreak) into one distinct int64 key where both fit
(``value << 32 | ~tiebreak``). From ``COMPILED_MIN`` values on, with numba, one compiled pass
keeps the k largest keys in a heap (on a corpus's skewed counts almost every value falls below
the heap's least and costs one comparison); otherwise one ``argpartition`` of the keys finds the
k. Inputs that do not fit the packing take a partition and a sort of the candidates at or above
the k-th value.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import numpy as np

from engram_viz._compiled import compiled_kernel, readonly

COMPILED_MIN = 1 << 16  # values from which the compiled heap pays for loading its kernel


def _heap_top(values, tiebreak, k, out):  # pragma: no cover - compiled by numba
    """The ``k`` largest keys ``values[i] << 32 | (2**32 - 1 - tiebreak[i])`` (``tiebreak`` empty:
    the index), descending, their indices written to ``out``; returns False (``out`` unwritten)
    when a value is outside ``[0, 2**31)`` or a tiebreak outside ``[0, 2**32)``."""
    n = values.shape[0]
    keys = np.empty(k, np.int64)  # a min-heap: keys[0] the least kept
    index = np.empty(k, np.int64)
    size = 0
    for i in range(n):
        v = values[i]
        t = tiebreak[i] if tiebreak.shape[0] else i
        if v < 0 or v >= 1 << 31 or t < 0 or t >= 1 << 32:
            return False
        key = (v << 32) | ((1 << 32) - 1 - t)
        if size < k:  # sift up
            j = size
            size += 1
            while j > 0 and keys[(j - 1) >> 1] > key:
                keys[j], index[j] = keys[(j - 1) >> 1], index[(j - 1) >> 1]
                j = (j - 1) >> 1
            keys[j], index[j] = key, i
        elif key > keys[0]:  # replace the least, sift down
            j = 0
            while True:
                child = 2 * j + 1
                if child >= k:
                    break
                if child + 1 < k and keys[child + 1] < keys[child]:
                    child += 1
                if keys[child] >= key:
                    break
                keys[j], index[j] = keys[child], index[child]
                j = child
            keys[j], index[j] = key, i
    order = np.argsort(-keys[:size])
    for j in range(size):
        out[j] = index[order[j]]
    return True


@functools.lru_cache(maxsize=1)
def _kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_heap_top)
    signature = f"boolean({readonly('int64')}, {readonly('int64')}, int64, int64[::1])"
    return compiled_kernel(source, "top_k", "_heap_top", signature, nogil=True, boundscheck=False)


def top_indices(values: np.ndarray, tiebreak: np.ndarray | None, k: int) -> np.ndarray:
    """Indices of the k largest ``values``, ties broken by the smaller ``tiebreak`` (deterministic;
    ``tiebreak`` holds distinct values; None: the index itself), in that order. Values in
    ``[0, 2**31)`` and tiebreaks in ``[0, 2**32)`` (counts, rows, indices) are packed into one
    distinct int64 key each, ``value << 32 | ~tiebreak`` (numpy's introselect slows to a crawl on
    the many equal counts of a corpus; on distinct keys it stays linear)."""
    if k <= 0:
        return np.empty(0, dtype=np.int64)
    v = np.ascontiguousarray(values, dtype=np.int64)
    n = len(v)
    given = np.empty(0, np.int64) if tiebreak is None else np.ascontiguousarray(tiebreak, dtype=np.int64)
    kernel = _kernel() if n >= COMPILED_MIN else None
    if kernel is not None:
        out = np.empty(min(k, n), np.int64)
        if kernel(v, given, min(k, n), out):
            return out
    t = np.arange(n, dtype=np.int64) if tiebreak is None else given
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
