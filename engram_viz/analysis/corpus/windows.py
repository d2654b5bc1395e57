"""N-gram windows over 1D streams of compressed ids: the blocked-window rule, numpy side.

**Window.** For position t the hasher multiplies, per look-back s = 0..max_ngram-1, the compressed
id ``c[t - s]`` unless the window is *blocked*: blocking is sticky, so once a look-back reaches
before the start of its sequence or a DEAD (image, ``token_mask`` False) position, it and every
longer look-back read ``pad`` (= ``token_map[engram_pad_id]``). ``windows[t, s]`` is exactly the
id multiplied at look-back s (reference section 3), int64 ``[N, max_ngram]``. An image position
itself is DEAD at s = 0, so its window is all pad (it still hashes, its gate is shut).

This is the one numpy statement of the rule (:func:`_slots`, with :func:`_near_start`); the torch statement, used by the
forward, is :class:`~engram_viz.core.hashing.NgramHasher` (the two are tested equal).

The n-gram of order n at t is ``(windows[t, n-1], ..., windows[t, 0])`` (:func:`window_ngrams`):
n compressed ids, oldest first, pads included.

:class:`StreamWindows` cuts a 1D stream of raw ids into windows chunk by chunk, carrying the last
``max_ngram - 1`` ids across chunk cuts, so a corpus of any length streams in bounded memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engram_viz.config import EngramConfig, load_config
from engram_viz.errors import InputError, InputTypeError

DEAD = -1  # compressed-id sentinel of masked (image) positions, as in hashing.DEAD


def int64_ids(name: str, a, ndim: int | tuple[int, ...]) -> np.ndarray:
    """``a`` (array or torch tensor) as int64, checked to have ``ndim`` dimensions and integer ids."""
    if hasattr(a, "detach"):  # torch tensor
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    ndims = (ndim,) if isinstance(ndim, int) else ndim
    if arr.ndim not in ndims:
        raise InputError(
            f"{name} must have {' or '.join(str(d) for d in ndims)} dimensions, got shape {list(arr.shape)}"
        )
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise InputTypeError(f"{name} must hold integer ids, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def bool_mask(name: str, a, shape: tuple[int, ...]) -> np.ndarray:
    """``a`` (array or torch tensor), checked to be bool of ``shape``."""
    if hasattr(a, "detach"):
        a = a.detach().cpu().numpy()
    arr = np.asarray(a)
    if arr.dtype != np.bool_:
        raise InputTypeError(f"{name} must be a bool array, got dtype {arr.dtype}")
    if arr.shape != shape:
        raise InputError(f"{name} has shape {list(arr.shape)}, expected {list(shape)}")
    return arr


@dataclass
class WindowContext:
    """What a chunk needs from the stream before it: the last ``max_ngram - 1`` compressed ids
    (DEAD included; left-filled with pad at the very start) and ``run``, the position of the
    next token within its sequence (0 = the next token starts a sequence)."""

    tail: np.ndarray
    run: int = 0

    @classmethod
    def first(cls, max_ngram: int, pad_id: int) -> WindowContext:
        """The context of a stream's first chunk: pads before it, a sequence starting."""
        return cls(np.full(max_ngram - 1, pad_id, dtype=np.int64), 0)

    def advanced(self, last: np.ndarray, n: int, seq_start: np.ndarray | None) -> WindowContext:
        """The context after a chunk of ``n`` positions whose last ``min(n, max_ngram - 1)``
        compressed ids are ``last`` (seq_start bool [n] as in :func:`ngram_windows`)."""
        k = len(self.tail)
        tail = last[len(last) - k :].copy() if n >= k else np.concatenate([self.tail[n:], last])
        starts = np.flatnonzero(seq_start) if seq_start is not None else np.empty(0, dtype=np.int64)
        return WindowContext(tail, n - int(starts[-1]) if len(starts) else self.run + n)


def open_before(context: WindowContext) -> int:
    """How many look-backs (s >= 1) the window of the position just before a chunk reads, -1
    when that position is DEAD or there is none: the rule's state carried into the chunk (a
    position continuing it reads one more, up to max_ngram - 1)."""
    tail, k = context.tail, len(context.tail)
    if context.run == 0 or not k or tail[-1] == DEAD:
        return -1
    opened = 0
    while opened < min(context.run - 1, k - 1) and tail[k - 2 - opened] != DEAD:
        opened += 1
    return opened


def _near_start(n: int, seq_start: np.ndarray | None, k: int, run: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows of a chunk of ``n`` positions whose position within their sequence is below ``k``
    (only their look-backs can reach before a sequence start): ``(rows int64 [M] ascending, their
    positions int64 [M])``; ``run`` is the first row's position when no sequence starts there.
    Costs O(starts), not O(n)."""
    starts = np.flatnonzero(seq_start) if seq_start is not None else np.empty(0, dtype=np.int64)
    head = np.arange(min(n, max(k - run, 0)), dtype=np.int64)  # still near the stream's sequence start
    near = (starts[:, None] + np.arange(k)).ravel()
    rows = np.unique(np.concatenate([head, near[near < n]]))
    if len(starts):
        at = np.searchsorted(starts, rows, side="right") - 1  # the last start at or before each row
        pos = np.where(at >= 0, rows - starts[np.maximum(at, 0)], rows + run)
    else:
        pos = rows + run
    return rows, pos


def _slots(
    c: np.ndarray, seq_start: np.ndarray | None, max_ngram: int, pad_id: int, context: WindowContext | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, WindowContext]:
    """The blocked-window rule. c: int64 ``[N]`` (DEAD at masked positions). Returns
    ``(sources int64 [N, max_ngram]`` = ``c[t - s]`` (the context's tail before the chunk),
    ``rows int64 [M]`` and ``blocked bool [M, max_ngram]`` (the rows with a blocked look-back and
    which; every other look-back is open), the context for the next chunk)."""
    n = len(c)
    k = max_ngram - 1
    if context is None:
        context = WindowContext.first(max_ngram, pad_id)
    sources = np.empty((n, max_ngram), dtype=np.int64)
    sources[:, 0] = c
    for s in range(1, max_ngram):
        sources[s:, s] = c[: max(n - s, 0)]
        m = min(s, n)
        sources[:m, s] = context.tail[k - s : k - s + m]  # look-backs before the chunk
    # sticky: blocked at s when s reaches before the start (pos < s, itself sticky in s) or onto DEAD
    # at any look-back up to s
    rows, pos = _near_start(n, seq_start, k, context.run)
    blocked = pos[:, None] < np.arange(max_ngram)
    if n and (c.min() < 0 or (k and context.tail.min() < 0)):  # DEAD somewhere: every row is checked
        full = np.zeros((n, max_ngram), dtype=bool)
        full[rows] = blocked
        rows, blocked = np.arange(n, dtype=np.int64), full | np.logical_or.accumulate(sources == DEAD, axis=1)
    return sources, rows, blocked, context.advanced(c[max(n - k, 0) :], n, seq_start)


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
    windows, rows, blocked, new_context = _slots(c, seq_start, max_ngram, pad_id, context)
    near = windows[rows]
    near[blocked] = pad_id
    windows[rows] = near  # the sources array is _slots' own: padded in place
    return windows, new_context


class StreamWindows:
    """Raw ids -> windows over a 1D stream cut into chunks; the cut points change nothing.

    ``token_map``: raw -> compressed, int64 ``[vocab]`` (``EngramTokenizer.token_map``).
    """

    def __init__(self, config: EngramConfig | str, token_map: np.ndarray):
        self.config = load_config(config)
        self.token_map = np.asarray(token_map, dtype=np.int64)
        if self.token_map.shape != (self.config.vocab_size,):
            raise InputError(f"token_map must have shape [{self.config.vocab_size}], got {list(self.token_map.shape)}")
        self.pad_id = int(self.token_map[self.config.engram_pad_id])
        self.max_ngram = self.config.engram_max_ngram_size
        self.context: WindowContext | None = None

    def compress(self, raw_ids: np.ndarray, token_mask: np.ndarray | None = None) -> np.ndarray:
        """Compressed ids ``[N]`` with DEAD where ``token_mask`` is False (range-checked)."""
        raw = int64_ids("raw_ids", raw_ids, 1)
        if raw.size and (raw.min() < 0 or raw.max() >= len(self.token_map)):
            bad = raw[(raw < 0) | (raw >= len(self.token_map))][0]
            raise InputError(f"raw_ids holds token id {int(bad)}; expected 0..{len(self.token_map) - 1}")
        c = self.token_map[raw]
        if token_mask is not None:
            c = np.where(bool_mask("token_mask", token_mask, raw.shape), c, DEAD)
        return c

    def __call__(
        self, raw_ids: np.ndarray, seq_start: np.ndarray | None = None, token_mask: np.ndarray | None = None
    ) -> np.ndarray:
        """Windows int64 ``[N, max_ngram]`` of the next ``N`` raw ids of the stream.
        seq_start / token_mask: bool ``[N]`` (a new document starts / False = image position)."""
        c = self.compress(raw_ids, token_mask)
        if seq_start is not None:
            seq_start = bool_mask("seq_start", seq_start, c.shape)
        windows, self.context = ngram_windows(c, seq_start, self.max_ngram, self.pad_id, self.context)
        return windows

    def start_context(self) -> WindowContext:
        """The context the next chunk starts from."""
        return self.context if self.context is not None else WindowContext.first(self.max_ngram, self.pad_id)

    def reset(self) -> None:
        self.context = None


def _sequences(compressed: np.ndarray, token_mask: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """A batch ``[B, T]`` or ``[T]`` as one stream: ``(compressed int64 [B*T]`` with DEAD where
    ``token_mask`` is False, ``seq_start bool [B*T]`` True at each sequence's position 0)."""
    c = int64_ids("compressed", compressed, (1, 2))
    if token_mask is not None:
        c = np.where(bool_mask("token_mask", token_mask, c.shape), c, DEAD)
    if c.ndim == 1:
        c = c[None]
    b, t = c.shape
    starts = np.zeros(b * t, dtype=bool)
    if t:
        starts[::t] = True
    return c.reshape(-1), starts


def sequence_windows(
    compressed: np.ndarray, pad_id: int, max_ngram: int, token_mask: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Windows of a batch of sequences, each starting at position 0 (like ``hash_prompt``).

    compressed: int ``[B, T]`` or ``[T]`` compressed ids (DEAD allowed); token_mask: bool, same
    shape, False = image (DEAD) position. Returns ``(windows [B*T, max_ngram], mask [B*T])`` where
    mask is False at DEAD positions.
    """
    flat, starts = _sequences(compressed, token_mask)
    windows, _ = ngram_windows(flat, starts, max_ngram, pad_id)
    return windows, flat != DEAD


def sequence_blocked(compressed: np.ndarray, max_ngram: int, token_mask: np.ndarray | None = None) -> np.ndarray:
    """Which look-backs of a batch of sequences are blocked (inputs as :func:`sequence_windows`):
    bool ``[B*T, max_ngram]``, True at ``[t, s]`` when look-back s of position t reads pad. The
    n-gram of order n at t is blocked when ``[t, n - 1]`` is (the rule is sticky)."""
    flat, starts = _sequences(compressed, token_mask)
    _, rows, blocked, _ = _slots(flat, starts, max_ngram, DEAD, None)
    out = np.zeros((len(flat), max_ngram), dtype=bool)
    out[rows] = blocked
    return out


def window_ngrams(windows: np.ndarray, order: int) -> np.ndarray:
    """The n-grams of order ``order`` of windows ``[N, max_ngram]``: ``[N, order]``, oldest first."""
    return np.asarray(windows)[:, order - 1 :: -1]
