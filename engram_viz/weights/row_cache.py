"""A small bounded cache of table rows (weight and scale bytes) keyed by row id, for ``LazyTable``.

Real text reads a table unevenly (frequent n-grams hash to the same rows prompt after prompt), so
rows read once are often asked for again. ``RowCache`` keeps up to ``capacity_mb`` of them so that
a later gather reads from disk only the rows it misses.

The cache is set-associative with one way (direct-mapped: row id -> slot by a multiplicative hash,
mapped onto the slots by a multiply-shift, no division)
and second-chance replacement: a hit marks its slot referenced; a missed row whose slot holds a
referenced row clears the mark instead of replacing it (a row asked for once does not push out a
hot one), and replaces it otherwise. Every step is one vectorised numpy operation over the ids of a
call, never a Python loop per row. ``hits`` / ``lookups`` count rows (sorted unique ids per call).

Rows are stored bit for bit as read (they were checked for NaN bytes then); memory is allocated on
first use and a slot's pages are touched only when a row lands in it, so resident memory grows by
at most ``capacity_mb``. A file changed on disk after its rows were cached is not seen again:
tables are read-only checkpoints.
"""

from __future__ import annotations

import threading

import numpy as np

_MIX = np.uint64(0x9E3779B97F4A7C15)  # Fibonacci hashing: spreads nearby row ids over the slots


class RowCache:
    """Up to ``capacity_mb`` MiB of rows ``weight [row_bytes]`` + ``scale [scale_bytes]`` by row id."""

    def __init__(self, capacity_mb: float, row_bytes: int, scale_bytes: int):
        per_slot = row_bytes + scale_bytes + 9  # + the id tag (8) and the referenced mark (1)
        self.capacity_mb = float(capacity_mb)
        self.slots = min(2**31, max(0, int(self.capacity_mb * 2**20) // per_slot))
        self.row_bytes, self.scale_bytes = int(row_bytes), int(scale_bytes)
        self.hits = self.lookups = 0
        self._arrays: tuple[np.ndarray, ...] | None = None
        self._lock = threading.Lock()

    def __getstate__(self) -> dict:  # a pickled table starts with an empty cache
        return {"capacity_mb": self.capacity_mb, "row_bytes": self.row_bytes, "scale_bytes": self.scale_bytes}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["capacity_mb"], state["row_bytes"], state["scale_bytes"])

    @property
    def hit_rate(self) -> float:
        return self.hits / self.lookups if self.lookups else 0.0

    def stats(self) -> dict:
        return {"capacity_mb": self.capacity_mb, "slots": self.slots, "hits": self.hits, "lookups": self.lookups}

    def _slot(self, ids: np.ndarray) -> np.ndarray:
        high = (ids.astype(np.uint64) * _MIX) >> np.uint64(32)  # the well-mixed high half of the hash
        return ((high * np.uint64(self.slots)) >> np.uint64(32)).astype(np.int64)

    def _storage(self) -> tuple[np.ndarray, ...]:
        if self._arrays is None:
            tags = np.full(self.slots, -1, dtype=np.int64)
            ref = np.zeros(self.slots, dtype=bool)
            w = np.empty((self.slots, self.row_bytes), dtype=np.uint8)
            s = np.empty((self.slots, self.scale_bytes), dtype=np.uint8)
            self._arrays = (tags, ref, w, s)
        return self._arrays

    def gather(self, ids: np.ndarray, read) -> tuple[np.ndarray, np.ndarray]:
        """Rows of sorted unique ids ``[n]`` -> weight bytes ``[n, row_bytes]``, scale bytes
        ``[n, scale_bytes]``; ``read(missed_ids)`` returns the same for the ids not cached."""
        if not self.slots or not len(ids):
            return read(ids)
        with self._lock:
            tags, ref, w, s = self._storage()
            slot = self._slot(ids)
            hit = tags[slot] == ids
            hit_slot = slot[hit]
            ref[hit_slot] = True
            self.hits += int(np.count_nonzero(hit))
            self.lookups += len(ids)
            if hit.all():
                return w[hit_slot], s[hit_slot]
            out_w = np.empty((len(ids), self.row_bytes), dtype=np.uint8)
            out_s = np.empty((len(ids), self.scale_bytes), dtype=np.uint8)
            out_w[hit], out_s[hit] = w[hit_slot], s[hit_slot]
        miss = ~hit
        missed, miss_slot = ids[miss], slot[miss]
        got_w, got_s = read(missed)  # outside the lock: other threads' hits need not wait for the disk
        out_w[miss], out_s[miss] = got_w, got_s
        with self._lock:
            self._insert(missed, miss_slot, got_w, got_s)
        return out_w, out_s

    def _insert(self, ids: np.ndarray, slot: np.ndarray, got_w: np.ndarray, got_s: np.ndarray) -> None:
        """Second chance: a referenced resident keeps its slot (and loses the mark); others are replaced.
        Several new rows for one slot: the tag assignment picks one, and only that row's bytes are copied."""
        tags, ref, w, s = self._arrays
        keep = ref[slot]
        ref[slot[keep]] = False
        free = ~keep
        slot, ids = slot[free], ids[free]
        tags[slot] = ids
        won = tags[slot] == ids
        dst = slot[won]
        src = np.nonzero(free)[0][won]
        w[dst], s[dst] = got_w[src], got_s[src]
