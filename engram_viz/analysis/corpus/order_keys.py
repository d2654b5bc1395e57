"""The distinct keys of one n-gram order as one sorted array, unpacked only where asked.

:class:`OrderKeys` lays an order's ``(group, lo)`` keys and counts from
:class:`~engram_viz.analysis.corpus.ngram_counts.NgramCounts` end to end (key ``i`` is row ``i``
of ``NgramCounts.ngrams(order)``), for the compiled tally (``group_tally``), and unpacks the
n-grams (``[U, order]`` ids, oldest first) all at once only when a caller asks for them all;
a few rows, or the keys made only of some ids, are read from the packed keys.
"""

from __future__ import annotations

import numpy as np

from engram_viz.analysis.corpus.keys import KEY_BITS, unpack_ngrams
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.row_ids import fresh_rows


class OrderKeys:
    """An order's keys: ``gvals`` int64 ``[G]`` and ``bounds`` int64 ``[G + 1]`` (the keys of group
    ``gvals[g]`` are ``lo[bounds[g]:bounds[g + 1]]``), ``lo`` uint64 ``[U]`` and ``counts`` int64
    ``[U]`` (positions carrying each key), sorted by (group, lo), i.e. by n-gram."""

    def __init__(self, counts: NgramCounts, order: int):
        parts = list(counts.groups(order))
        self.order = order
        self.gvals = np.array([g for g, _, _ in parts], dtype=np.int64)
        self.bounds = np.cumsum([0] + [len(lo) for _, lo, _ in parts]).astype(np.int64)
        if len(parts) == 1:  # one group (orders up to 3): the stored arrays, no copy
            self.lo, self.counts = parts[0][1], parts[0][2]
        else:  # into arrays with their pages populated up front (row_ids.fresh_rows)
            u = int(self.bounds[-1])
            self.lo = (
                np.concatenate([lo for _, lo, _ in parts], out=fresh_rows((u,), np.uint64))
                if parts
                else np.empty(0, np.uint64)
            )
            self.counts = (
                np.concatenate([c for _, _, c in parts], out=fresh_rows((u,), np.int64))
                if parts
                else np.empty(0, np.int64)
            )
        self.positions = int(self.counts.sum())
        self._ngrams: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lo)

    def ngrams(self) -> np.ndarray:
        """All n-grams, int64 ``[U, order]`` oldest first (unpacked on the first call, then kept)."""
        if self._ngrams is None:
            out = np.empty((len(self.lo), self.order), np.int64)
            for g, a, b in zip(self.gvals, self.bounds[:-1], self.bounds[1:]):
                unpack_ngrams(int(g), self.lo[a:b], self.order, out=out[a:b])
            self._ngrams = out
        return self._ngrams

    def ngrams_at(self, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` (int64 ``[Q]``) of :meth:`ngrams`, int64 ``[Q, order]``: only those unpacked."""
        index = np.asarray(index, dtype=np.int64)
        if self._ngrams is not None:
            return self._ngrams[index]
        out = np.empty((len(index), self.order), np.int64)
        which = np.searchsorted(self.bounds, index, side="right") - 1
        for k, g in enumerate(self.gvals):
            sel = np.flatnonzero(which == k)
            if len(sel):
                out[sel] = unpack_ngrams(int(g), self.lo[index[sel]], self.order)
        return out

    def made_of(self, ids: np.ndarray) -> np.ndarray:
        """Sorted indices (int64) of the keys whose every id is one of ``ids`` (int, >= 0). Keys are
        sorted by their oldest id, so only the prefix whose oldest id is at most ``max(ids)`` is
        unpacked (BOS, EOS and pad: the sequence starts)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids) or not len(self.lo):
            return np.empty(0, np.int64)
        bound = (int(ids.max()) + 1) << (KEY_BITS * (self.order - 1))  # the packed keys below it
        bound_group, bound_lo = bound >> 64, bound & ((1 << 64) - 1)
        at = int(np.searchsorted(self.gvals, bound_group))
        end = int(self.bounds[at])
        if at < len(self.gvals) and self.gvals[at] == bound_group:
            end += int(np.searchsorted(self.lo[end : self.bounds[at + 1]], np.uint64(bound_lo)))
        prefix = np.arange(end, dtype=np.int64)
        grams = self.ngrams_at(prefix)
        return prefix[np.isin(grams, ids).all(axis=1)]
