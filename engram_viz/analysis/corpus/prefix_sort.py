"""Every order's distinct n-grams of a stream chunk and their counts, from ONE sort: the counting's
compiled path from compressed ids to sorted keys (no ``[N, max_ngram]`` windows, no sort per order).

**Why one sort is enough.** Where position t + 1 continues position t's sequence (not a start,
not DEAD), its window is t's shifted by one (``windows.py``: the blocked-window rule): look-back s
at t + 1 is look-back s - 1 at t. So the m-gram of t + 1 (m = max_ngram) is t's (m-1)-gram with
``c[t + 1]`` appended, and t's (m-1)-gram ends with the (m-2)-gram of t - 1, and so on: one
*entry* per position, the m fields ``(w[t, m-2], ..., w[t, 0], c[t + 1])`` (oldest first),
holds the n-gram of position ``t + n + 1 - m`` as its first n fields, for every order n. Sorted
as integers, entries sort every such prefix too, and one run-length pass per order reads the
distinct n-grams and their counts off the prefixes. Each entry carries one flag bit per order (the
lowest bits, not sorted on) saying whether its prefix of that order is a counted n-gram; an n-gram
whose chain of positions breaks (a sequence start, a DEAD position, the chunk's ends) gets an
entry of its own (its n-gram first, zeros after, only its order's flag).

**Dense ids.** A chunk's compressed ids are renumbered 0..R-1 in id order (ranks keep the order),
so m fields of ``b = bits(R - 1)`` bits plus the flags fit one uint64 (m = 4: R <= 2**15; a chunk
with more distinct ids is counted in shorter pieces). The run pass maps ranks back to ids and
packs the keys as ``keys.pack_ngrams`` does.

The sort is a least-significant-digit radix sort of ``DIGIT_BITS``-bit digits over the fields
(the flags are not sorted on), every digit's histogram counted in one read before the passes, a
pass whose digit is the same everywhere skipped. A sort for every order (``key_sort``, after
windows and ``keys.pack_windows``) moved each position three times through 15 passes, 17-bit ids
and a group byte; this moves an entry about once through 6 (dense ids of 14-15 bits, 10-bit
digits, on the mixed corpus's batches of about a million tokens). With numba the kernels
are compiled once per machine (``_compiled``); without it (or for a chunk under ``PREFIX_MIN``
positions) :func:`chunk_runs` returns None and the caller takes the numpy path (windows, then a
sort per order), which gives the same counts (tested).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from engram_viz._compiled import compiled_kernel
from engram_viz.analysis.corpus.key_sort import by_group
from engram_viz.analysis.corpus.keys import KEY_BITS
from engram_viz.analysis.corpus.windows import StreamWindows, bool_mask, int64_ids, open_before

PREFIX_MIN = 1 << 18  # positions from which a chunk takes the compiled path (past numba's load cost)
DIGIT_BITS = 10  # most bits per radix pass: 1,024 buckets keep the scatter's write streams cached (fastest measured)
Runs = dict[int, list[tuple[int, np.ndarray, np.ndarray]]]  # order -> [(group, lo uint64, counts int64)]


def _dense_ranks(tail, raw, mask, token_map, pad, size):  # pragma: no cover - compiled by numba
    """Dense ids of a chunk: the compressed ids ``tail`` int64 [k] before it, then ``token_map[raw]``
    (``raw`` int64 [N]; DEAD where ``mask`` bool [N] is False, an empty mask masking nothing),
    ranked among themselves and ``pad`` in id order (ids and ``token_map`` in 0..size-1):
    ``(ranks int32 [k + N], -1 = DEAD; ids int64 [R] ascending)``. Empty ranks when a raw id lies
    outside the map."""
    k, n, masked = tail.shape[0], raw.shape[0], mask.shape[0] > 0
    rank = np.zeros(size, np.int32)
    rank[pad] = 1
    for i in range(k):
        if tail[i] >= 0:
            rank[tail[i]] = 1
    for i in range(n):
        if raw[i] < 0 or raw[i] >= token_map.shape[0]:
            return np.empty(0, np.int32), np.empty(0, np.int64)
        if not masked or mask[i]:
            rank[token_map[raw[i]]] = 1
    ids = np.empty(rank.sum(), np.int64)
    r = 0
    for v in range(size):
        if rank[v]:
            ids[r], rank[v] = v, r
            r += 1
    ranks = np.empty(k + n, np.int32)
    for i in range(k):
        ranks[i] = rank[tail[i]] if tail[i] >= 0 else -1
    for i in range(n):
        ranks[k + i] = rank[token_map[raw[i]]] if not masked or mask[i] else -1
    return ranks, ids


def _entries(ranks, starts, open0, m, b, pad_rank):  # pragma: no cover - compiled by numba
    """The sort's entries of a chunk: uint64 [E], each its m fields of b bits (oldest highest)
    above m - 1 flag bits (bit n - 2: its first n fields are a counted n-gram).

    ranks: int32 [m - 1 + N], the dense ids of the m - 1 positions before the chunk, then the
    chunk's (-1 = DEAD); starts: bool [N]; open0: look-backs open at the position before the
    chunk (-1: none); pad_rank: the pad's dense id."""
    n_pos, k = starts.shape[0], m - 1
    opens, links = np.empty(n_pos, np.int8), np.empty(n_pos, np.int8)
    o, link, breaks = open0, 0, 0
    for t in range(n_pos):  # opens: look-backs read at t; links: positions before t that t continues (to m)
        if ranks[k + t] < 0:
            o, link = -1, 0
        elif starts[t]:
            o, link = 0, 0
        else:
            o, link = min(o + 1, k), (min(link + 1, m) if t else 0)
        opens[t], links[t] = o, link
        breaks += link == 0
    out = np.empty(n_pos + (breaks + 1) * m * m, np.uint64)  # entries of their own only near breaks
    ub, e, window = np.uint64(b), 0, np.uint64(0)
    flag_bits, fields = np.uint64(m - 1), np.uint64((1 << (b * (m - 1))) - 1)
    for t in range(n_pos):
        if links[t] >= 1:  # window[t, s] = window[t - 1, s - 1]: shift in the new id
            window = (window << ub) | np.uint64(ranks[k + t])
        else:  # its m look-backs, newest in the lowest field
            window = np.uint64(0)
            for s in range(m - 1, -1, -1):
                window = (window << ub) | np.uint64(ranks[k + t - s] if s <= opens[t] else pad_rank)
        key, flags = (window & fields) << ub, 0
        if t + 1 < n_pos and links[t + 1] >= 1:  # t + 1 continues t: field m is its id, the m-gram its
            key |= np.uint64(ranks[k + t + 1])
            flags |= 1 << (m - 2)
        for n in range(2, m):  # the n-gram of u = t - (m - 1 - n), when t continues u
            u = t - (m - 1 - n)
            if u >= 0 and opens[u] >= 0 and links[t] >= t - u:
                flags |= 1 << (n - 2)
        if flags:
            out[e] = (key << flag_bits) | np.uint64(flags)
            e += 1
        if opens[t] < 0:  # DEAD: no n-gram of its own
            continue
        for n in range(2, m + 1):  # t's n-grams that no position's entry holds get their own
            d = m - 1 - n
            if (links[t] >= 1) if n == m else (t + d < n_pos and links[t + d] >= d):
                continue
            own = (window & np.uint64((1 << (b * n)) - 1)) << np.uint64(b * (m - n))
            out[e] = (own << flag_bits) | np.uint64(1 << (n - 2))
            e += 1
    return out[:e]


def _radix_sort(keys, shift, width, passes):  # pragma: no cover - compiled by numba
    """``keys`` uint64 [E] sorted by their bits from ``shift`` up (``passes`` digits of ``width``
    bits; the bits below ``shift`` are not sorted on), in ``keys`` or a new array (returned). Every digit's histogram is
    counted in one read; a pass whose digit is the same everywhere is skipped."""
    n = keys.shape[0]
    mask = np.uint64((1 << width) - 1)
    hist = np.zeros((passes, (1 << width) + 1), np.int64)
    for i in range(n):
        x = keys[i] >> np.uint64(shift)
        for p in range(passes):
            hist[p, ((x >> np.uint64(p * width)) & mask) + 1] += 1
    a, tmp = keys, np.empty_like(keys)  # keys is overwritten
    for p in range(passes):
        h = hist[p]
        if h.max() == n:
            continue
        for j in range(1, h.shape[0]):
            h[j] += h[j - 1]
        at = np.uint64(shift + p * width)
        for i in range(n):
            d = (a[i] >> at) & mask
            tmp[h[d]] = a[i]
            h[d] += 1
        a, tmp = tmp, a
    return a


def _prefix_runs(entries, n, m, b, ids, key_bits):  # pragma: no cover - compiled by numba
    """The order-n runs of sorted ``entries``: ``(lo uint64 [U], group uint8 [U], counts int64
    [U])``, the distinct counted n-grams (first n fields; ``ids`` int64 [R] maps the dense ids
    back) packed as ``keys.pack_ngrams`` packs them (``key_bits`` a field), ascending, and how
    many entries flag each. Two reads: the runs counted, then written."""
    drop, flag = np.uint64(m - 1 + b * (m - n)), np.uint64(n - 2)
    runs, current, counted = 0, np.uint64(0), np.uint64(0)
    for i in range(entries.shape[0]):  # without branches: a new prefix is as likely as not
        prefix = entries[i] >> drop
        new = np.uint64(prefix != current)
        runs += counted & new
        counted = (counted & (new ^ np.uint64(1))) | ((entries[i] >> flag) & np.uint64(1))
        current = prefix
    runs += counted
    lo, group, counts = np.empty(runs, np.uint64), np.empty(runs, np.uint8), np.zeros(runs, np.int64)
    field, u = np.uint64((1 << b) - 1), -1
    for i in range(entries.shape[0]):
        prefix = entries[i] >> drop
        if (entries[i] >> flag) & np.uint64(1) == 0:
            continue
        if u < 0 or prefix != current:
            current, packed, top = prefix, np.uint64(0), np.uint64(0)
            for j in range(n):  # j = 0: the oldest id, highest
                v = np.uint64(ids[(prefix >> np.uint64(b * (n - 1 - j))) & field])
                shift = key_bits * (n - 1 - j)
                packed |= v << np.uint64(shift)  # bits past 64 dropped: the group holds them
                if shift + key_bits > 64:
                    top = v >> np.uint64(64 - shift)
            u += 1
            lo[u], group[u] = packed, np.uint8(top)
        counts[u] += 1
    return lo, group, counts


class _Kernels(NamedTuple):
    ranks: Callable
    entries: Callable
    sort: Callable
    runs: Callable


@functools.lru_cache(maxsize=1)
def _kernels() -> _Kernels | None:
    functions = (_dense_ranks, _entries, _radix_sort, _prefix_runs)
    source = "import numpy as np\n\n\n" + "\n\n".join(inspect.getsource(f) for f in functions)
    signatures = (
        "Tuple((int32[::1], int64[::1]))(int64[::1], int64[::1], bool_[::1], int64[::1], int64, int64)",
        "uint64[::1](int32[::1], bool_[::1], int64, int64, int64, int64)",
        "uint64[::1](uint64[::1], int64, int64, int64)",
        "Tuple((uint64[::1], uint8[::1], int64[::1]))(uint64[::1], int64, int64, int64, int64[::1], int64)",
    )
    compiled = []
    for f, signature in zip(functions, signatures):
        kernel = compiled_kernel(source, "prefix_sort", f.__name__, signature, nogil=True, boundscheck=False)
        if kernel is None:
            return None
        compiled.append(kernel)
    return _Kernels(*compiled)


def _piece_runs(
    kernels: _Kernels, ranks: np.ndarray, ids: np.ndarray, starts: np.ndarray, open0: int, pad: int, m: int
) -> Runs:
    """The runs of every order of one piece whose dense ids fit the entries."""
    b = max(1, int(len(ids) - 1).bit_length())
    entries = kernels.entries(ranks, starts, open0, m, b, int(np.searchsorted(ids, pad)))
    passes = -(-(m * b) // DIGIT_BITS)
    ordered = kernels.sort(entries, m - 1, -(-(m * b) // passes), passes)
    return {n: by_group(*kernels.runs(ordered, n, m, b, ids, KEY_BITS)) for n in range(2, m + 1)}


def chunk_runs(
    stream: StreamWindows,
    raw_ids: np.ndarray,
    seq_start: np.ndarray | None = None,
    token_mask: np.ndarray | None = None,
) -> tuple[Runs, int] | None:
    """The next raw ids of ``stream`` (inputs as :meth:`StreamWindows.__call__`) counted: ``({n:
    [(group, distinct lo uint64 ascending, counts int64)]}, positions counted)``, the counted
    positions being the text ones (``token_mask`` True), as ``NgramCounts.add_windows(stream(raw_ids,
    seq_start, token_mask), token_mask)`` counts them; the stream's context advances as there.
    None (nothing done) without numba or under ``PREFIX_MIN`` positions: the caller takes that path."""
    kernels = _kernels() if len(raw_ids) >= max(PREFIX_MIN, 1) else None
    token_map, pad, m = stream.token_map, stream.pad_id, stream.max_ngram
    if kernels is None or m < 2 or not 0 <= token_map.min() <= token_map.max() < 1 << KEY_BITS:
        return None  # (ids that do not pack: the numpy path says so)
    line = np.ascontiguousarray  # the kernels take contiguous arrays
    raw, token_map = line(int64_ids("raw_ids", raw_ids, 1)), line(token_map)
    mask = np.zeros(0, bool) if token_mask is None else line(bool_mask("token_mask", token_mask, raw.shape))
    starts = np.zeros(len(raw), bool) if seq_start is None else line(bool_mask("seq_start", seq_start, raw.shape))
    most = 1 << ((64 - (m - 1)) // m)  # dense ids that fit m fields and the flags in 64 bits
    runs: Runs = {n: [] for n in range(2, m + 1)}
    at = 0
    while at < len(raw):
        stop = len(raw)
        while True:
            context = stream.start_context()
            piece = mask[at:stop] if len(mask) else mask
            ranks, ids = kernels.ranks(context.tail, raw[at:stop], piece, token_map, pad, 1 << KEY_BITS)
            if len(ranks) != len(context.tail) + stop - at:  # a raw id off the map: the numpy path says so
                return None
            if len(ids) <= most or stop - at == 1:
                break
            stop = at + (stop - at) // 2
        for n, found in _piece_runs(kernels, ranks, ids, starts[at:stop], open_before(context), pad, m).items():
            runs[n].extend(found)
        last = max(at, stop - len(context.tail))
        stream.context = context.advanced(
            stream.compress(raw[last:stop], mask[last:stop] if len(mask) else None), stop - at, starts[at:stop]
        )
        at = stop
    return runs, int(mask.sum()) if len(mask) else len(raw)
