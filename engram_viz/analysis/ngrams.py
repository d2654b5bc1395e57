"""N-gram windows, keys and a vectorised hash over 1D token streams; the shared core of
``usage`` (row usage) and ``collisions`` (hash bucket collisions).

**Window.** For position t the hasher multiplies, per look-back s = 0..max_ngram-1, the compressed
id ``c[t - s]`` unless the window is *blocked*: blocking is sticky, so once a look-back reaches
before the start of its sequence or a DEAD (image, ``token_mask`` False) position, it and every
longer look-back read ``pad`` (= ``token_map[engram_pad_id]``). ``windows[t, s]`` is exactly the
id multiplied at look-back s (reference section 3), int64 ``[N, max_ngram]``. An image position
itself is DEAD at s = 0, so its window is all pad (it still hashes, its gate is shut).

**Key.** The n-gram of order n at t is ``(windows[t, n-1], ..., windows[t, 0])``: n compressed ids,
oldest first, pads included. Keys are the ids themselves, never their hash. They are packed into
``KEY_BITS`` (17) bits per id; a 2- or 3-gram fits one uint64, a 4-gram needs 68 bits, so keys are
stored as ``(group, lo)``: ``group`` = the bits above 64 (the top 4 bits of the oldest id),
``lo`` = the low 64 bits. Sorting by (group, lo) is sorting the tuples lexicographically.

**Rows.** Every row id is a function of the key: ``hash = XOR_s window[s] * multiplier[layer, s]``
over the n look-backs, ``row = hash % prime[layer, n-2, head] + offset``. ``rows_from_windows`` is
the vectorised hasher over a stream (equal to :class:`~engram_viz.core.hashing.NgramHasher` bit for bit,
tested); ``ngram_hashes`` hashes distinct keys, which is all the accumulators need.

:class:`StreamWindows` cuts a 1D stream of raw ids into windows chunk by chunk, carrying the last
``max_ngram - 1`` ids across chunk cuts, so a corpus of any length streams in bounded memory.
:class:`NgramCounts` is the accumulator: per order, the sorted distinct keys and how many counted
positions carry each; two shards merged equal the whole.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout

DEAD = -1  # compressed-id sentinel of masked (image) positions, as in hashing.DEAD
KEY_BITS = 17  # bits per compressed id in a packed key (the compressed vocab 99,092 < 2**17)
_LO_MASK = np.uint64(0xFFFF_FFFF_FFFF_FFFF)


def _as_int64(name: str, a, ndim: int | tuple[int, ...]) -> np.ndarray:
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        raise ValueError(
            f"{name} must have {' or '.join(str(d) for d in ndims)} dimensions, got shape {list(arr.shape)}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def _as_bool(name: str, a, shape: tuple[int, ...]) -> np.ndarray:
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.dtype != np.bool_:
        raise TypeError(f"{name} must be a bool array, got dtype {arr.dtype}")
    if arr.shape != shape:
        raise ValueError(f"{name} has shape {list(arr.shape)}, expected {list(shape)}")
    return arr


# ------------------------------------------------------------------------------------ windows


@dataclass
class WindowContext:
    """What a chunk needs from the stream before it: the last ``max_ngram - 1`` compressed ids
    (DEAD included; left-filled with pad at the very start) and ``run``, the position of the
    next token within its sequence (0 = the next token starts a sequence)."""

    tail: np.ndarray
    run: int = 0


def ngram_windows(
    compressed: np.ndarray,
    seq_start: np.ndarray | None,
    max_ngram: int,
    pad_id: int,
    context: WindowContext | None = None,
) -> tuple[np.ndarray, WindowContext]:
    """Windows of a 1D chunk of compressed ids.

    compressed: int64 ``[N]`` compressed ids, DEAD (-1) at masked positions.
    seq_start: bool ``[N]``, True where a new sequence (document) starts; None = no start inside
    the chunk (the first chunk of a stream always starts one).
    Returns ``(windows int64 [N, max_ngram], context for the next chunk)``.
    """
    c = np.asarray(compressed, dtype=np.int64)
    n = len(c)
    k = max_ngram - 1
    if context is None:
        context = WindowContext(np.full(k, pad_id, dtype=np.int64), 0)
    idx = np.arange(n, dtype=np.int64)
    if seq_start is not None and n:
        last = np.maximum.accumulate(np.where(seq_start, idx, -1))
        pos = np.where(last >= 0, idx - last, idx + context.run)
    else:
        pos = idx + context.run
    ext = np.concatenate([context.tail, c])
    windows = np.empty((n, max_ngram), dtype=np.int64)
    blocked = np.zeros(n, dtype=bool)
    for s in range(max_ngram):
        src = ext[k - s : k - s + n]
        blocked |= (pos < s) | (src == DEAD)
        windows[:, s] = np.where(blocked, pad_id, src)
    new_context = WindowContext(ext[len(ext) - k :].copy(), int(pos[-1]) + 1 if n else context.run)
    return windows, new_context


class StreamWindows:
    """Raw ids -> windows over a 1D stream cut into chunks; the cut points change nothing.

    ``token_map``: raw -> compressed, int64 ``[vocab]`` (``EngramTokenizer.token_map``).
    """

    def __init__(self, config: EngramConfig | str, token_map: np.ndarray):
        self.config = load_config(config)
        self.token_map = np.asarray(token_map, dtype=np.int64)
        if self.token_map.shape != (self.config.vocab_size,):
            raise ValueError(f"token_map must have shape [{self.config.vocab_size}], got {list(self.token_map.shape)}")
        self.pad_id = int(self.token_map[self.config.engram_pad_id])
        self.max_ngram = self.config.engram_max_ngram_size
        self.context: WindowContext | None = None

    def compress(self, raw_ids: np.ndarray, token_mask: np.ndarray | None = None) -> np.ndarray:
        """Compressed ids ``[N]`` with DEAD where ``token_mask`` is False (range-checked)."""
        raw = _as_int64("raw_ids", raw_ids, 1)
        if raw.size and (raw.min() < 0 or raw.max() >= len(self.token_map)):
            bad = raw[(raw < 0) | (raw >= len(self.token_map))][0]
            raise ValueError(f"raw_ids holds token id {int(bad)}; expected 0..{len(self.token_map) - 1}")
        c = self.token_map[raw]
        if token_mask is not None:
            c = np.where(_as_bool("token_mask", token_mask, raw.shape), c, DEAD)
        return c

    def __call__(
        self, raw_ids: np.ndarray, seq_start: np.ndarray | None = None, token_mask: np.ndarray | None = None
    ) -> np.ndarray:
        """Windows int64 ``[N, max_ngram]`` of the next ``N`` raw ids of the stream.
        seq_start / token_mask: bool ``[N]`` (a new document starts / False = image position)."""
        c = self.compress(raw_ids, token_mask)
        if seq_start is not None:
            seq_start = _as_bool("seq_start", seq_start, c.shape)
        windows, self.context = ngram_windows(c, seq_start, self.max_ngram, self.pad_id, self.context)
        return windows

    def reset(self) -> None:
        self.context = None


def sequence_windows(
    compressed: np.ndarray, pad_id: int, max_ngram: int, token_mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of a batch of sequences, each starting at position 0 (like ``hash_prompt``).

    compressed: int ``[B, T]`` or ``[T]`` compressed ids (DEAD allowed); token_mask: bool, same
    shape, False = image (DEAD) position. Returns ``(windows [B*T, max_ngram], mask [B*T])`` where
    mask is False at DEAD positions.
    """
    c = _as_int64("compressed", compressed, (1, 2))
    if token_mask is not None:
        c = np.where(_as_bool("token_mask", token_mask, c.shape), c, DEAD)
    if c.ndim == 1:
        c = c[None]
    b, t = c.shape
    flat = c.reshape(-1)
    starts = np.zeros(b * t, dtype=bool)
    if t:
        starts[::t] = True
    windows, _ = ngram_windows(flat, starts, max_ngram, pad_id)
    return windows, flat != DEAD


def rows_from_windows(layout: EngramLayout, windows: np.ndarray) -> np.ndarray:
    """The vectorised hash: windows ``[N, max_ngram]`` -> row ids int64 ``[N, n_layers, n_hash_cols]``,
    bit for bit those of ``NgramHasher``."""
    w = np.asarray(windows, dtype=np.int64)
    n = len(w)
    out = np.empty((n, len(layout.layer_ids), layout.n_hash_cols), dtype=np.int64)
    heads = layout.n_heads
    product = np.empty(n, dtype=np.int64)
    for li in range(len(layout.layer_ids)):
        mult = layout.multipliers[li]
        rolling = w[:, 0] * mult[0]
        for s in range(1, layout.max_ngram_size):
            np.multiply(w[:, s], mult[s], out=product)
            np.bitwise_xor(rolling, product, out=rolling)
            for head in range(heads):
                col = (s - 1) * heads + head
                view = out[:, li, col]
                np.remainder(rolling, layout.column_primes[li, col], out=view)
                view += layout.offsets[li, col]
    return out


def ngram_hashes(layout: EngramLayout, layer_index: int, ngrams: np.ndarray) -> np.ndarray:
    """Pre-modulo hashes int64 ``[U]`` of n-grams ``[U, n]`` (compressed ids, oldest first)."""
    g = np.asarray(ngrams, dtype=np.int64)
    n = g.shape[1]
    mult = layout.multipliers[layer_index]
    h = g[:, n - 1] * mult[0]
    for s in range(1, n):
        h = h ^ (g[:, n - 1 - s] * mult[s])
    return h


# ---------------------------------------------------------------------------------------- keys


def _check_order(order: int) -> None:
    if order * KEY_BITS - 64 > KEY_BITS:
        raise ValueError(
            f"n-gram keys of order {order} need {order * KEY_BITS} bits; at most {64 + KEY_BITS} supported"
        )


def pack_ngrams(ngrams: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """n-grams int ``[N, n]`` (compressed ids in 0..2**17-1, oldest first) -> ``(group uint8 [N], lo uint64 [N])``."""
    g = np.asarray(ngrams, dtype=np.int64)
    n = g.shape[1]
    _check_order(n)
    if g.size and (g.min() < 0 or g.max() >= 1 << KEY_BITS):
        raise ValueError(f"n-gram ids must lie in 0..{(1 << KEY_BITS) - 1} (pad, never DEAD)")
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


def unpack_ngrams(group: int | np.ndarray, lo: np.ndarray, order: int) -> np.ndarray:
    """Inverse of :func:`pack_ngrams`: int64 ``[N, order]``, oldest first."""
    _check_order(order)
    lo = np.asarray(lo, dtype=np.uint64)
    out = np.empty((len(lo), order), dtype=np.int64)
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


def window_ngrams(windows: np.ndarray, order: int) -> np.ndarray:
    """The n-grams of order ``order`` of windows ``[N, max_ngram]``: ``[N, order]``, oldest first."""
    return np.asarray(windows)[:, order - 1 :: -1]


def _merge_sorted(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge sorted unique (keys, counts) runs: sum the counts of equal keys."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.empty(0, np.uint64), np.empty(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    keys = np.concatenate([p[0] for p in parts])
    counts = np.concatenate([p[1] for p in parts])
    order = np.argsort(keys, kind="stable")  # timsort: linear-ish on a few sorted runs
    keys, counts = keys[order], counts[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    starts = np.flatnonzero(first)
    return keys[starts], np.add.reduceat(counts, starts)


class NgramCounts:
    """Accumulator: per n-gram order, the distinct keys seen at counted positions and how many
    positions carry each. Counted positions are the text positions (``token_mask`` True); image
    (DEAD) positions are left out. ``merge`` adds another accumulator's counts: shards merged
    equal the whole. Memory: 16 bytes per distinct n-gram (and order)."""

    FLUSH_MIN = 1 << 22  # pending keys buffered before a merge into the sorted store

    def __init__(self, config: EngramConfig | str = "tiny", pad_id: int | None = None):
        self.config = load_config(config)
        # compressed pad id = token_map[engram_pad_id]; the V4 map keeps raw id 2 at 2
        self.pad_id = int(self.config.engram_pad_id if pad_id is None else pad_id)
        self.orders = self.config.ngram_orders
        for n in self.orders:
            _check_order(n)
        self._store: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {n: {} for n in self.orders}
        self._pending: dict[int, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = {n: {} for n in self.orders}
        self._pending_size = 0
        self.n_positions = 0  # counted (text) positions
        self.n_masked = 0  # image positions seen and left out
        self.version = 0  # bumped on every change; analyses cache against it

    # -- adding
    def add_windows(self, windows: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Count the n-grams of windows ``[N, max_ngram]``; mask bool ``[N]`` (False = skip)."""
        w = np.asarray(windows)
        if w.ndim != 2 or w.shape[1] != self.config.engram_max_ngram_size:
            raise ValueError(f"windows must have shape [N, {self.config.engram_max_ngram_size}], got {list(w.shape)}")
        if mask is not None:
            mask = _as_bool("mask", mask, (len(w),))
            self.n_masked += int(len(w) - mask.sum())
            w = w[mask]
        self.n_positions += len(w)
        self.version += 1
        if not len(w):
            return
        for n in self.orders:
            group, lo = pack_ngrams(window_ngrams(w, n))
            groups = np.unique(group) if n * KEY_BITS > 64 else np.zeros(1, np.uint8)
            for g in groups:
                sel = lo if len(groups) == 1 else lo[group == g]
                keys, counts = np.unique(sel, return_counts=True)
                self._pending[n].setdefault(int(g), []).append((keys, counts.astype(np.int64)))
                self._pending_size += len(keys)
        if self._pending_size >= max(self.FLUSH_MIN, self.n_distinct_stored()):
            self._flush()

    def add_compressed(self, compressed, token_mask=None) -> None:
        """Count the n-grams of sequences of compressed ids ``[B, T]`` or ``[T]``, each starting at
        position 0 (as ``hash_prompt`` sees them); token_mask bool, same shape, False = image."""
        windows, mask = sequence_windows(compressed, self.pad_id, self.config.engram_max_ngram_size, token_mask)
        self.add_windows(windows, mask)

    def _flush(self) -> None:
        for n in self.orders:
            for g, parts in self._pending[n].items():
                stored = self._store[n].get(g)
                self._store[n][g] = _merge_sorted(([stored] if stored is not None else []) + parts)
            self._pending[n] = {}
        self._pending_size = 0

    def merge(self, other: NgramCounts) -> NgramCounts:
        """Add ``other``'s counts into this one (in place); returns self."""
        if other.config.engram_max_ngram_size != self.config.engram_max_ngram_size:
            raise ValueError("cannot merge n-gram counts of different max n-gram sizes")
        other._flush()
        for n in self.orders:
            for g, part in other._store[n].items():
                self._pending[n].setdefault(g, []).append(part)
        self.n_positions += other.n_positions
        self.n_masked += other.n_masked
        self.version += 1
        self._flush()
        return self

    def copy(self) -> NgramCounts:
        out = NgramCounts(self.config, self.pad_id)
        return out.merge(self)

    # -- reading
    def n_distinct_stored(self) -> int:
        return sum(len(k) for n in self.orders for k, _ in self._store[n].values())

    def groups(self, order: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(group, lo uint64 [U_g], counts int64 [U_g])`` of one order, sorted by (group, lo)."""
        self._flush()
        for g in sorted(self._store[order]):
            lo, counts = self._store[order][g]
            yield g, lo, counts

    def ngrams(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """All distinct n-grams of one order, sorted: ``(ids int64 [U, order] oldest first, counts int64 [U])``."""
        if order not in self.orders:
            raise ValueError(f"n-gram order {order} out of range; expected one of {list(self.orders)}")
        parts = [(unpack_ngrams(g, lo, order), c) for g, lo, c in self.groups(order)]
        if not parts:
            return np.empty((0, order), np.int64), np.empty(0, np.int64)
        return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])

    def n_distinct(self, order: int) -> int:
        return sum(len(lo) for _, lo, _ in self.groups(order))

    def count_of(self, ngrams: np.ndarray) -> np.ndarray:
        """Positions counted for each n-gram ``[Q, n]`` (0 if never seen): int64 ``[Q]``."""
        q = np.asarray(ngrams, dtype=np.int64)
        order = q.shape[1]
        group, lo = pack_ngrams(q)
        out = np.zeros(len(q), dtype=np.int64)
        for g, keys, counts in self.groups(order):
            sel = np.flatnonzero(group == g)
            if not len(sel) or not len(keys):
                continue
            at = np.minimum(np.searchsorted(keys, lo[sel]), len(keys) - 1)
            hit = keys[at] == lo[sel]
            out[sel[hit]] = counts[at[hit]]
        return out

    def as_dict(self) -> dict[tuple[int, ...], int]:
        """{n-gram tuple: count} over all orders (for tests and small inputs only)."""
        out = {}
        for n in self.orders:
            ids, counts = self.ngrams(n)
            out.update({tuple(int(x) for x in row): int(c) for row, c in zip(ids, counts)})
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, NgramCounts) or other.orders != self.orders:
            return NotImplemented
        if (self.n_positions, self.n_masked) != (other.n_positions, other.n_masked):
            return False
        for n in self.orders:
            a, b = list(self.groups(n)), list(other.groups(n))
            if len(a) != len(b):
                return False
            for (ga, la, ca), (gb, lb, cb) in zip(a, b):
                if ga != gb or not np.array_equal(la, lb) or not np.array_equal(ca, cb):
                    return False
        return True

    __hash__ = None  # mutable

    # -- persistence
    def save(self, path: str | Path) -> None:
        """Write an ``.npz`` atomically (keys, counts per order and group, plus totals)."""
        path = Path(path)
        arrays = {"meta": np.array([self.n_positions, self.n_masked, self.config.engram_max_ngram_size], np.int64)}
        for n in self.orders:
            for g, lo, c in self.groups(n):
                arrays[f"o{n}_g{g}_keys"], arrays[f"o{n}_g{g}_counts"] = lo, c
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | Path, config: EngramConfig | str = "tiny") -> NgramCounts:
        out = cls(config)
        try:
            data = np.load(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"n-gram counts file {path} is unreadable: {err}") from None
        with data:
            meta = data["meta"]
            if int(meta[2]) != out.config.engram_max_ngram_size:
                raise ValueError(
                    f"{path} holds n-grams up to order {int(meta[2])}; config {out.config.name!r} expects "
                    f"{out.config.engram_max_ngram_size}"
                )
            out.n_positions, out.n_masked = int(meta[0]), int(meta[1])
            for name in data.files:
                if name.endswith("_keys"):
                    o, g = name.split("_")[:2]
                    out._store[int(o[1:])][int(g[1:])] = (data[name], data[name.replace("_keys", "_counts")])
        out.version += 1
        return out


def poisson_binomial(probs: np.ndarray) -> np.ndarray:
    """P(exactly j successes), j = 0..len(probs), of independent trials with success ``probs``."""
    dist = np.zeros(len(probs) + 1)
    dist[0] = 1.0
    for p in probs:
        dist[1:] = dist[1:] * (1 - p) + dist[:-1] * p
        dist[0] *= 1 - p
    return dist


# ---------------------------------------------------------------------------- column passes


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

    def distinct_per_key(self) -> np.ndarray:
        """int64 ``[U]``: how many distinct n-grams share each n-gram's bucket (itself included)."""
        return self.stats().per_key

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
        raise ValueError(f"query buckets must lie in 0..{prime - 1}")
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


class NgramDecoder:
    """Readable text of compressed n-grams: each compressed id shows as the text of one raw
    member - the most frequent one in ``raw_counts`` (int ``[vocab]``, e.g. counted over a
    corpus) when given, else the lowest raw id. ``The``/`` the``/``THE`` share an id, so case
    and a leading space may differ from the source. The compressed pad id shows as ``<pad>``: a
    blocked look-back (sequence start or image) - or the pad token itself, which the key cannot
    tell apart."""

    def __init__(self, tokenizer, pad_id: int | None = None, raw_counts: np.ndarray | None = None):
        self.tokenizer = tokenizer
        token_map = np.asarray(tokenizer.token_map)
        self.pad_id = int(token_map[tokenizer.config.engram_pad_id]) if pad_id is None else int(pad_id)
        raw = np.arange(len(token_map), dtype=np.int64)
        if raw_counts is None:
            order = raw[::-1]  # the last write wins: the lowest raw id
        else:
            rc = np.asarray(raw_counts)
            if rc.shape != token_map.shape:
                raise ValueError(f"raw_counts must have shape {list(token_map.shape)}, got {list(rc.shape)}")
            order = np.lexsort((-raw, rc))  # ascending count, ties: higher id first -> most frequent, lowest id last
        first = np.full(int(token_map.max()) + 1, -1, dtype=np.int64)
        first[token_map[order]] = order
        self._first = first
        self._cache: dict[int, str] = {}

    def pieces(self, ids) -> list[str]:
        ids = [int(i) for i in ids]
        todo = sorted({i for i in ids if i not in self._cache})
        if todo:
            bad = [i for i in todo if not (i == DEAD or 0 <= i < len(self._first))]
            if bad:
                raise ValueError(f"compressed id {bad[0]} out of range; expected 0..{len(self._first) - 1}")
            raw = [int(self._first[i]) for i in todo if i not in (DEAD, self.pad_id)]
            texts = iter(self.tokenizer.pieces(raw))
            for i in todo:
                self._cache[i] = "<DEAD>" if i == DEAD else "<pad>" if i == self.pad_id else next(texts)
        return [self._cache[i] for i in ids]

    def text(self, ids) -> str:
        return "".join(self.pieces(ids))


def make_decoder(config: EngramConfig, tokenizer, pad_id: int) -> NgramDecoder | None:
    """A decoder over ``tokenizer`` (None: the bundled V4 tokenizer; an NgramDecoder is reused;
    False: no decoding, tables get empty text)."""
    if tokenizer is False:
        return None
    if isinstance(tokenizer, NgramDecoder):
        return tokenizer
    if tokenizer is None:
        from engram_viz.core.tokenizer import get_tokenizer

        tokenizer = get_tokenizer(config)
    return NgramDecoder(tokenizer, pad_id)


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
