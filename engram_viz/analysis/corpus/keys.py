"""Packed n-gram keys: compressed-id tuples as ``(group, lo)`` integers.

Keys are the ids themselves, never their hash. They are packed into ``KEY_BITS`` (17) bits per
id; a 2- or 3-gram fits one uint64, a 4-gram needs 68 bits, so keys are stored as
``(group, lo)``: ``group`` = the bits above 64 (the top 4 bits of the oldest id), ``lo`` = the low
64 bits. Sorting by (group, lo) is sorting the tuples lexicographically.
"""

from __future__ import annotations

import numpy as np

from engram_viz.errors import InputError

KEY_BITS = 17  # bits per compressed id in a packed key (the compressed vocab 99,092 < 2**17)


def check_order(order: int) -> None:
    """Raise unless keys of ``order`` ids fit ``(group, lo)``."""
    if order * KEY_BITS - 64 > KEY_BITS:
        raise InputError(
            f"n-gram keys of order {order} need {order * KEY_BITS} bits; at most {64 + KEY_BITS} supported"
        )


def pack_ngrams(ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n-grams int ``[N, n]`` (compressed ids in 0..2**17-1, oldest first) -> ``(group uint8 [N], lo uint64 [N])``."""
    g = np.asarray(ngrams, dtype=np.int64)
    n = g.shape[1]
    check_order(n)
    if g.size and (g.min() < 0 or g.max() >= 1 << KEY_BITS):
        raise InputError(f"n-gram ids must lie in 0..{(1 << KEY_BITS) - 1} (pad, never DEAD)")
    u = g.astype(np.uint64)
    lo = np.zeros(len(g), dtype=np.uint64)
    for i in range(n):  # i = 0 is the oldest id, in the top bits
        shift = KEY_BITS * (n - 1 - i)
        if shift + KEY_BITS <= 64:
            lo |= u[:, i] << np.uint64(shift)
        else:  # the oldest id of a 4-gram straddles bit 64
            keep = 64 - shift
            lo |= (u[:, i] & np.uint64((1 << keep) - 1)) << np.uint64(shift)
    spill = n * KEY_BITS - 64
    if spill > 0:
        group = (g[:, 0] >> (KEY_BITS - spill)).astype(np.uint8)
    else:
        group = np.zeros(len(g), dtype=np.uint8)
    return group, lo


def pack_windows(windows: np.ndarray, orders) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """``{n: pack_ngrams(window_ngrams(windows, n))}`` for every order of ``orders``, from windows
    ``[N, max_ngram]`` (look-back s in column s), built newest id first: the key of order n is the
    key of order n - 1 with look-back n - 1 shifted in above it, so each id is range-checked, cast
    and shifted once for all orders (no strided copy per order)."""
    w = np.asarray(windows, dtype=np.int64)
    top = max(orders)
    check_order(top)
    if w.size and (w.min() < 0 or w.max() >= 1 << KEY_BITS):
        raise InputError(f"n-gram ids must lie in 0..{(1 << KEY_BITS) - 1} (pad, never DEAD)")
    out = {}
    lo = w[:, 0].astype(np.uint64)
    for s in range(1, top):
        look = w[:, s].astype(np.uint64)
        look <<= np.uint64(KEY_BITS * s)  # uint64 shifts drop the bits above 64: the group keeps them
        lo |= look
        n = s + 1
        if n in orders:
            spill = n * KEY_BITS - 64
            group = (w[:, s] >> (KEY_BITS - spill)).astype(np.uint8) if spill > 0 else np.zeros(len(w), np.uint8)
            out[n] = (group, lo.copy() if n < top else lo)
    return out


def unpack_ngrams(group: int | np.ndarray, lo: np.ndarray, order: int, out: np.ndarray | None = None) -> np.ndarray:
    """Inverse of :func:`pack_ngrams`: int64 ``[N, order]``, oldest first (written into ``out``,
    int64 ``[N, order]``, when given: e.g. one group's rows of a larger array)."""
    check_order(order)
    lo = np.asarray(lo, dtype=np.uint64)
    out = np.empty((len(lo), order), dtype=np.int64) if out is None else out
    field = np.uint64((1 << KEY_BITS) - 1)
    for i in range(order):
        shift = KEY_BITS * (order - 1 - i)
        if shift + KEY_BITS <= 64:
            out[:, i] = ((lo >> np.uint64(shift)) & field).astype(np.int64)
        else:
            keep = 64 - shift
            low = (lo >> np.uint64(shift)).astype(np.int64)
            out[:, i] = (np.asarray(group, dtype=np.int64) << keep) | low
    return out
