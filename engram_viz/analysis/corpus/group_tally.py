"""The compiled tally of one (order, layer) group of columns: every head's buckets in one pass over the keys.

The heads of one n-gram order and Engram layer hash the same distinct keys with the same
multipliers and differ only in the prime, so one pass over the keys serves all of them. The kernel
reads the keys as :class:`~engram_viz.analysis.corpus.ngram_counts.NgramCounts` keeps them, packed
(``keys``: 17 bits per id, oldest id on top, ``(group, lo)``), computes each key's hash from its
packed ids (no ``[U, order]`` array unpacked), then per head its bucket ``hash % prime``, counts it
(n-grams and hits of a bucket share one int64, ``n << shift | hits``: one add a key and head) and
pushes the key onto the bucket's list
(``first[head, bucket]`` and ``nxt[key, head]``: the keys of a bucket, last key first), so the keys
of a few buckets are read by walking their lists instead of scanning every key. The kernel is
generated per layout with the multipliers and primes as literal constants, so each ``% prime`` is a
multiply by a precomputed reciprocal and a shift (as ``row_id_kernel``), and compiled once per
machine (``_compiled``).

``heads_shared[key]`` (on how many heads the key's bucket holds another key) is n_heads less the
heads on which it is alone, and a key alone in its bucket is that bucket's list head: no second
pass over the keys per head. Without numba :func:`compiled_group_tally` returns None and the
columns are tallied one at a time with numpy (``bucket_passes``); tests compare both.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from engram_viz._compiled import compiled_kernel, readonly
from engram_viz.analysis.corpus.keys import KEY_BITS
from engram_viz.analysis.corpus.row_ids import fresh_rows
from engram_viz.core.layout import EngramLayout

_ID_MASK = (1 << KEY_BITS) - 1


def _hash_lines(order: int, multipliers: tuple[int, ...]) -> list[str]:
    """Source lines setting ``hu`` (uint64) and ``h`` (the same bits as int64), the pre-modulo hash
    of the packed key ``key`` (uint64) whose bits above 64 are ``top`` (uint64, already shifted into
    place): XOR over the look-backs s of ``id[s] * multiplier[s]``, look-back 0 (the newest id) in
    the lowest bits. The products are taken in uint64, where wrapping is defined (numpy's int64
    products in ``ngram_hashes`` wrap to the same bits; a compiled int64 product may be assumed
    not to wrap, and a sign test after it folded away)."""
    lines = []
    for s in range(order):
        shift = KEY_BITS * s
        if shift + KEY_BITS <= 64:
            ident = f"((key >> np.uint64({shift})) & np.uint64({_ID_MASK}))"
        else:  # the oldest id of a 4-gram straddles bit 64: its high bits are the key's group
            ident = f"(top | (key >> np.uint64({shift})))"
        product = f"{ident} * np.uint64({multipliers[s]})"
        lines.append(f"                hu = {product}" if s == 0 else f"                hu = hu ^ ({product})")
    return [*lines, "                h = np.int64(hu)"]


def _source(groups: tuple[tuple[int, tuple[int, ...], tuple[int, ...]], ...]) -> str:
    """Python source of ``tally(which, shift, gvals, bounds, lo, counts, tab, first, nxt, shared,
    shared_keys, shared_positions)``: one branch per group ``(order, multipliers, primes)``; ``tab``
    int64 ``[H, P]`` holds each bucket's ``n_ngrams << shift | hits``."""
    lines = [
        "import numpy as np",
        "",
        "",
        "def tally(which, shift, gvals, bounds, lo, counts, tab, first, nxt, shared, shared_keys, shared_positions):",
        "    one = np.int64(1) << shift",
    ]
    for which, (order, multipliers, primes) in enumerate(groups):
        spill = order * KEY_BITS - 64
        lines.append(f"    {'if' if which == 0 else 'elif'} which == {which}:")
        lines.append("        for g in range(gvals.shape[0]):")
        lines.append(f"            top = np.uint64(gvals[g]) << np.uint64({max(KEY_BITS - spill, 0)})")
        lines.append("            for i in range(bounds[g], bounds[g + 1]):")
        lines.append("                key = lo[i]")
        lines.append("                c = counts[i]")
        lines += _hash_lines(order, multipliers)
        lines.append("                if h >= 0:  # unsigned division by a constant: the cheaper reciprocal")
        lines += [
            f"                    b{head} = np.int64(hu % np.uint64({prime}))" for head, prime in enumerate(primes)
        ]
        lines.append("                else:  # ids past the vocabulary can wrap a product: floor modulo, as numpy's")
        lines += [f"                    b{head} = h % {prime}" for head, prime in enumerate(primes)]
        for head in range(len(primes)):
            lines.append(f"                tab[{head}, b{head}] += one + c")
            lines.append(f"                nxt[i, {head}] = first[{head}, b{head}]")
            lines.append(f"                first[{head}, b{head}] = i")
    return "\n".join(lines + _HEADS_SHARED) + "\n"


# After the pass: every key shared on every head, less one for each head where its bucket holds it
# alone (it is that bucket's list head); then how many keys, and positions, have each value.
_HEADS_SHARED = [
    "    heads = tab.shape[0]",
    "    for i in range(shared.shape[0]):",
    "        shared[i] = heads",
    "    for head in range(heads):",
    "        for b in range(tab.shape[1]):",
    "            if tab[head, b] >> shift == 1:",
    "                shared[first[head, b]] -= 1",
    "    for i in range(shared.shape[0]):",
    "        shared_keys[shared[i]] += 1",
    "        shared_positions[shared[i]] += counts[i]",
]


@functools.lru_cache(maxsize=8)
def _compile(groups: tuple) -> Callable | None:
    signature = (
        f"void(int64, int64, int64[::1], int64[::1], {readonly('uint64')}, {readonly('int64')}, int64[:, ::1], "
        "int32[:, ::1], int32[:, ::1], int8[::1], int64[::1], int64[::1])"
    )
    return compiled_kernel(_source(groups), "group_tally", "tally", signature, nogil=True, boundscheck=False)


def _groups(layout: EngramLayout) -> tuple:
    """``((order, multipliers, primes), ...)`` in (order, layer) order: the kernel's branches."""
    out = []
    for order in layout.config.ngram_orders:
        for li in range(len(layout.layer_ids)):
            cols = [layout.column(order, head) for head in range(layout.n_heads)]
            mult = tuple(int(m) for m in layout.multipliers[li][:order])
            out.append((order, mult, tuple(int(layout.column_primes[li, c]) for c in cols)))
    return tuple(out)


def compiled_group_tally(layout: EngramLayout) -> Callable | None:
    """The layout's compiled tally (one branch per (order, layer) group), or None without numba."""
    return _compile(_groups(layout))


def _walk(first, nxt, head, asked, counts, keys, buckets, second):  # pragma: no cover - compiled by numba
    """Walk the lists of the ``asked`` buckets 16 at a time (one list is a chain of dependent loads
    from memory; 16 lists side by side overlap them). With ``second`` empty, every key of every
    list goes to ``keys`` and its bucket to ``buckets`` (unordered); else each bucket's second
    largest of ``counts`` goes to ``second`` (the largest where two keys share it; -1 below two)."""
    lanes = 16
    cur = np.full(lanes, -1, np.int64)
    slot = np.zeros(lanes, np.int64)
    m1 = np.zeros(lanes, np.int64)
    m2 = np.zeros(lanes, np.int64)
    listing = second.shape[0] == 0
    taken, active, j = 0, 0, 0
    while True:
        for w in range(lanes):  # idle lanes take the next buckets
            while cur[w] < 0 and taken < asked.shape[0]:
                slot[w], m1[w], m2[w] = taken, -1, -1
                cur[w] = first[asked[taken]]
                if cur[w] >= 0:
                    active += 1
                elif not listing:
                    second[taken] = -1
                taken += 1
        if active == 0:
            return
        for w in range(lanes):
            i = cur[w]
            if i < 0:
                continue
            if listing:
                keys[j] = i
                buckets[j] = asked[slot[w]]
                j += 1
            else:
                c = counts[i]
                if c > m1[w]:
                    m2[w], m1[w] = m1[w], c
                elif c > m2[w]:
                    m2[w] = c
            cur[w] = nxt[i, head]
            if cur[w] < 0:
                active -= 1
                if not listing:
                    second[slot[w]] = m2[w]


@functools.lru_cache(maxsize=1)
def _walk_kernel() -> Callable | None:
    source = "import numpy as np\n\n\n" + inspect.getsource(_walk)
    signature = (
        f"void(int32[::1], int32[:, ::1], int64, int64[::1], {readonly('int64')}, int64[::1], int64[::1], int64[::1])"
    )
    return compiled_kernel(source, "bucket_walk", "_walk", signature, nogil=True, boundscheck=False)


@dataclass
class GroupTally:
    """Every head's occupancy of one (order, layer) group, from :func:`tally_group`: ``table``
    int64 ``[H, P]`` (P the largest prime; head h uses ``[:prime_h]``), each bucket's ``n_ngrams <<
    shift | hits``; the bucket lists ``first`` int32 ``[H, P]`` (-1: empty) and ``nxt`` int32
    ``[U, H]`` (-1: end); ``heads_shared`` int8 ``[U]``, and how many keys and positions have each
    value of it, ``shared_keys`` and ``shared_positions`` int64 ``[H + 1]``."""

    table: np.ndarray
    shift: int
    first: np.ndarray
    nxt: np.ndarray
    heads_shared: np.ndarray
    shared_keys: np.ndarray
    shared_positions: np.ndarray

    def n_ngrams(self, head: int, buckets: slice | np.ndarray) -> np.ndarray:
        """int64: the distinct n-grams in ``buckets`` of ``head``."""
        return self.table[head, buckets] >> self.shift

    def hits(self, head: int, buckets: slice | np.ndarray) -> np.ndarray:
        """int64: the positions summed over ``buckets`` of ``head``."""
        return self.table[head, buckets] & ((1 << self.shift) - 1)

    def members(self, head: int, buckets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(keys int64 [M], bucket of each int64 [M])`` of the distinct ``buckets`` (int64, in
        range) on ``head``, unordered (only their keys are read)."""
        asked = np.ascontiguousarray(buckets, dtype=np.int64)
        total = int(self.n_ngrams(head, asked).sum())
        keys, at, none = np.empty(total, np.int64), np.empty(total, np.int64), np.empty(0, np.int64)
        _walk_kernel()(self.first[head], self.nxt, head, asked, none, keys, at, none)
        return keys, at

    def second_largest(self, head: int, buckets: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """int64 ``[Q]``: per bucket of ``buckets`` (int64, in range) on ``head``, the second
        largest of its keys' ``counts`` (the largest where two share it; -1 below two keys)."""
        asked = np.ascontiguousarray(buckets, dtype=np.int64)
        out, none = np.empty(len(asked), np.int64), np.empty(0, np.int64)
        if len(asked):
            _walk_kernel()(self.first[head], self.nxt, head, asked, counts, none, none, out)
        return out


def count_shift(keys: int, positions: int) -> int | None:
    """The bit where a bucket's n-gram count starts in its packed int64 (``n << shift | hits``),
    for ``keys`` distinct keys carrying ``positions`` in all; None where both do not fit 63 bits."""
    shift = 63 - max(keys, 1).bit_length()
    return shift if positions < 1 << shift else None


class ListBuffer:
    """One int32 ``[rows, heads]`` buffer for the groups' bucket lists (``nxt``), lent to one group
    at a time: a pass over the groups writes its lists into the same pages instead of fresh ones
    (populated once, up front: far cheaper here than huge-page faults). ``lease`` counts the loans,
    so a group can tell whether its lists were overwritten since (then it tallies again)."""

    def __init__(self, rows: int, heads: int):
        self.rows, self.heads, self.lease = rows, heads, 0
        self._array: np.ndarray | None = None

    def take(self, rows: int) -> tuple[np.ndarray, int]:
        """``(nxt int32 [rows, heads], lease)``: the buffer's first ``rows`` rows, lent anew."""
        if self._array is None or self._array.shape[0] < rows:
            self._array = fresh_rows((max(rows, self.rows), self.heads), np.int32)
        self.lease += 1
        return self._array[:rows], self.lease


def tally_group(kernel: Callable, which: int, width: int, keys: tuple, nxt: np.ndarray) -> GroupTally:
    """Run the layout's ``kernel`` on group ``which`` (its index in (order, layer) order) over the
    order's packed ``keys`` ``(gvals int64 [G], bounds int64 [G + 1], lo uint64 [U], counts int64
    [U])`` (the keys of group ``gvals[g]`` are ``lo[bounds[g]:bounds[g + 1]]``; their counts must
    fit :func:`count_shift`); ``width`` the group's largest prime; the lists go into ``nxt`` (int32
    ``[U, heads]``, e.g. from a :class:`ListBuffer`)."""
    gvals, bounds, lo, counts = keys
    u, heads = len(lo), nxt.shape[1]
    shift = count_shift(u, int(counts.sum()))
    assert shift is not None  # the caller checked
    out = GroupTally(
        np.zeros((heads, width), np.int64),
        shift,
        np.full((heads, width), -1, np.int32),
        nxt,
        fresh_rows((u,), np.int8),
        np.zeros(heads + 1, np.int64),
        np.zeros(heads + 1, np.int64),
    )
    kernel(which, shift, gvals, bounds, lo, counts, out.table, out.first, out.nxt, out.heads_shared,
           out.shared_keys, out.shared_positions)  # fmt: skip
    return out
