"""N-gram counts: per order, the sorted distinct keys and how many counted positions carry each.

:class:`NgramCounts` is the accumulator over windows (``windows``) with packed keys (``keys``);
two shards merged equal the whole, and it saves to / loads from one ``.npz``. With a
``memory_limit`` (bytes) it spills sorted runs to disk (``spill``) whenever its distinct keys
outgrow the budget, and merges them back (an external merge) when read: the same counts.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from engram_viz._files import read_npz, write_npz
from engram_viz.analysis.corpus.key_sort import distinct_counts
from engram_viz.analysis.corpus.keys import KEY_BITS, check_order, pack_ngrams, pack_windows, unpack_ngrams
from engram_viz.analysis.corpus.prefix_sort import chunk_runs
from engram_viz.analysis.corpus.spill import KEY_BYTES, SpillStore, merge_sorted, parse_memory_limit
from engram_viz.analysis.corpus.windows import StreamWindows, bool_mask, sequence_windows
from engram_viz.config import EngramConfig, load_config
from engram_viz.errors import CorpusError, InputError


def key_partition(group: int, lo: np.ndarray, parts: int) -> np.ndarray:
    """The partition ``0..parts-1`` of each packed key ``(group, lo uint64 [U])``: a stable hash of
    the compressed-id tuple (Fibonacci multiplicative hashing of the 68-bit key folded to 64
    bits, top 32 bits of the product), the same in every process: int64 ``[U]``."""
    folded = np.asarray(lo, dtype=np.uint64) ^ (np.uint64(group) << np.uint64(56))
    mixed = (folded * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(32)  # wraps mod 2**64 by design
    return (mixed % np.uint64(parts)).astype(np.int64)


class NgramCounts:
    """Accumulator: per n-gram order, the distinct keys seen at counted positions and how many
    positions carry each. Counted positions are the text positions (``token_mask`` True); image
    (DEAD) positions are left out. ``merge`` adds another accumulator's counts: shards merged
    equal the whole. Memory: 16 bytes per distinct n-gram (and order); with ``memory_limit``
    (bytes, or a size like ``"2GB"``) at most about that much, the rest spilled to sorted runs in
    a temporary folder under ``spill_dir`` (the system's by default), merged back when read."""

    FLUSH_MIN = 1 << 22  # pending keys buffered before a merge into the sorted store
    MERGE_PEAK = 4  # copies of the keys a merge holds at once (inputs, concatenated, order, gathered)

    def __init__(
        self,
        config: EngramConfig | str = "tiny",
        pad_id: int | None = None,
        memory_limit: int | str | None = None,
        spill_dir: str | Path | None = None,
        spill_prefix: str = "engram-spill-",
    ):
        self.config = load_config(config)
        # compressed pad id = token_map[engram_pad_id]; the V4 map keeps raw id 2 at 2
        self.pad_id = int(self.config.engram_pad_id if pad_id is None else pad_id)
        self.orders = self.config.ngram_orders
        for n in self.orders:
            check_order(n)
        self._store: dict[int, dict[int, tuple[np.ndarray, np.ndarray]]] = {n: {} for n in self.orders}
        self._pending: dict[int, dict[int, list[tuple[np.ndarray, np.ndarray]]]] = {n: {} for n in self.orders}
        self._pending_size = 0
        self.n_positions = 0  # counted (text) positions
        self.n_masked = 0  # image positions seen and left out
        self.version = 0  # bumped on every change; analyses cache against it
        self.memory_limit = parse_memory_limit(memory_limit)
        self._spill = SpillStore(spill_dir, spill_prefix, memory_limit=self.memory_limit)
        self.n_spills = 0  # times the store went to disk

    # -- adding
    def add_windows(self, windows: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Count the n-grams of windows ``[N, max_ngram]``; mask bool ``[N]`` (False = skip)."""
        w = np.asarray(windows)
        if w.ndim != 2 or w.shape[1] != self.config.engram_max_ngram_size:
            raise InputError(f"windows must have shape [N, {self.config.engram_max_ngram_size}], got {list(w.shape)}")
        if mask is not None:
            mask = bool_mask("mask", mask, (len(w),))
            self.n_masked += int(len(w) - mask.sum())
            w = w[mask]
        self.n_positions += len(w)
        self.version += 1
        if not len(w):
            return
        for n, (group, lo) in pack_windows(w, self.orders).items():
            spill = n * KEY_BITS - 64  # bits of the key in its group
            self._add_runs(n, distinct_counts(lo, group if spill > 0 else None, min(64, n * KEY_BITS), spill))
        self._settle()

    def add_tokens(
        self,
        stream: StreamWindows,
        raw_ids: np.ndarray,
        seq_start: np.ndarray | None = None,
        token_mask: np.ndarray | None = None,
    ) -> None:
        """Count the n-grams of the next raw ids of ``stream`` (inputs as :meth:`StreamWindows.__call__`):
        the counts of ``add_windows(stream(raw_ids, seq_start, token_mask), token_mask)``, image
        positions left out, by one compiled pass from ids to sorted keys where it can
        (``prefix_sort``; no windows)."""
        found = (
            chunk_runs(stream, raw_ids, seq_start, token_mask) if self.orders == stream.config.ngram_orders else None
        )
        if found is None:
            self.add_windows(stream(raw_ids, seq_start, token_mask), token_mask)
            return
        runs, counted = found
        self.n_positions += counted
        self.n_masked += len(raw_ids) - counted
        self.version += 1
        for n, parts in runs.items():
            self._add_runs(n, parts)
        self._settle()

    def _add_runs(self, order: int, parts: list[tuple[int, np.ndarray, np.ndarray]]) -> None:
        """Queue sorted unique ``[(group, lo, counts)]`` of one order for the next merge."""
        for g, keys, counts in parts:
            self._pending[order].setdefault(g, []).append((keys, counts))
            self._pending_size += len(keys)

    def _settle(self) -> None:
        """Merge the pending keys once they rival the store; past the memory limit, spill the
        store. The budget counts the merge's working copies (``MERGE_PEAK`` x 16 bytes a key)."""
        budget = None if self.memory_limit is None else self.memory_limit // (KEY_BYTES * self.MERGE_PEAK)
        held = self._pending_size + self.n_distinct_stored()
        if (budget is not None and held > budget) or self._pending_size >= max(
            self.FLUSH_MIN, held - self._pending_size
        ):
            self._flush()
        if budget is not None and self.n_distinct_stored() > budget:
            for n in self.orders:
                for g, (lo, c) in self._store[n].items():
                    self._spill.write(n, g, lo, c)
                self._store[n] = {}
            self.n_spills += 1

    def add_compressed(self, compressed, token_mask=None) -> None:
        """Count the n-grams of sequences of compressed ids ``[B, T]`` or ``[T]``, each starting at
        position 0 (as ``hash_prompt`` sees them); token_mask bool, same shape, False = image."""
        windows, mask = sequence_windows(compressed, self.pad_id, self.config.engram_max_ngram_size, token_mask)
        self.add_windows(windows, mask)

    def flush(self) -> None:
        """Merge the keys still pending into the sorted store now (reading does it anyway): the
        counting's last merge, done where the counting ends."""
        self._flush()

    def _flush(self) -> None:
        for n in self.orders:
            for g, parts in self._pending[n].items():
                stored = self._store[n].get(g)
                self._store[n][g] = merge_sorted(([stored] if stored is not None else []) + parts)
            self._pending[n] = {}
        self._pending_size = 0

    def add_sorted(self, order: int, group: int, lo: np.ndarray, counts: np.ndarray) -> None:
        """Add keys of one order and group, sorted and unique as :meth:`groups` yields them
        (``lo`` uint64 ``[U]``, ``counts`` int64 ``[U]``); positions are not counted here."""
        self._pending[order].setdefault(group, []).append((lo, counts))
        self._pending_size += len(lo)
        self.version += 1
        self._settle()

    def merge(self, other: NgramCounts) -> NgramCounts:
        """Add ``other``'s counts into this one (in place); returns self."""
        if other.config.engram_max_ngram_size != self.config.engram_max_ngram_size:
            raise InputError("cannot merge n-gram counts of different max n-gram sizes")
        for n in self.orders:
            for g, lo, c in other.groups(n):
                self.add_sorted(n, g, lo, c)
        self.n_positions += other.n_positions
        self.n_masked += other.n_masked
        self.version += 1
        self._flush()
        return self

    def split(self, parts: int) -> list[NgramCounts]:
        """``parts`` accumulators holding disjoint shares of the keys, chosen by
        :func:`key_partition` (stable across processes and runs); merged, they equal this one.
        The position totals go with part 0."""
        out = [NgramCounts(self.config, self.pad_id) for _ in range(parts)]
        out[0].n_positions, out[0].n_masked = self.n_positions, self.n_masked
        for n in self.orders:
            for g, lo, c in self.groups(n):
                which = key_partition(g, lo, parts)
                for i, part in enumerate(out):
                    sel = which == i
                    if sel.any():
                        part._store[n][g] = (lo[sel], c[sel])
        for part in out:
            part.version += 1
        return out

    def copy(self) -> NgramCounts:
        out = NgramCounts(self.config, self.pad_id)
        return out.merge(self)

    def close(self) -> None:
        """Drop the spilled runs from disk (the counts they held are gone with them)."""
        self._spill.close()

    def __getstate__(self) -> dict:
        """Pickled (to another process, maybe another machine): spilled runs travel as arrays,
        read for the copy only (this one stays as it was, its runs on disk)."""
        stored = None
        if self._spill:  # read first: groups() settles what is pending
            stored = {n: {g: (np.array(lo), np.array(c)) for g, lo, c in self.groups(n)} for n in self.orders}
        state = dict(self.__dict__)
        if stored is not None:
            state["_store"] = stored
        state["_spill"] = SpillStore(self._spill.parent, self._spill.prefix, memory_limit=self.memory_limit)
        return state

    # -- reading
    def n_distinct_stored(self) -> int:
        return sum(len(k) for n in self.orders for k, _ in self._store[n].values())

    def groups(self, order: int) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        """``(group, lo uint64 [U_g], counts int64 [U_g])`` of one order, sorted by (group, lo)."""
        self._flush()
        spilled = self._spill.groups(order)
        for g in sorted(set(self._store[order]) | spilled):
            if g in spilled:  # one external merge of its runs and the in-memory part
                lo, counts = self._spill.merged(order, g, self._store[order].pop(g, None))
            else:
                lo, counts = self._store[order][g]
            yield g, lo, counts

    def ngrams(self, order: int) -> tuple[np.ndarray, np.ndarray]:
        """All distinct n-grams of one order, sorted: ``(ids int64 [U, order] oldest first, counts int64 [U])``."""
        if order not in self.orders:
            raise InputError(f"n-gram order {order} out of range; expected one of {list(self.orders)}")
        parts = list(self.groups(order))
        total = sum(len(lo) for _, lo, _ in parts)
        ids, counts = np.empty((total, order), np.int64), np.empty(total, np.int64)
        at = 0
        for g, lo, c in parts:  # each group unpacked in place: no per-group copy to concatenate
            unpack_ngrams(g, lo, order, out=ids[at : at + len(lo)])
            counts[at : at + len(lo)] = c
            at += len(lo)
        return ids, counts

    def ngram_counts(self, order: int) -> np.ndarray:
        """The counts of :meth:`ngrams` alone, int64 ``[U]`` (no n-gram unpacked)."""
        parts = [c for _, _, c in self.groups(order)]
        return np.concatenate(parts) if parts else np.empty(0, np.int64)

    def ngrams_at(self, order: int, index: np.ndarray) -> np.ndarray:
        """Rows ``index`` of :meth:`ngrams`' n-grams, int64 ``[len(index), order]``, only those unpacked."""
        index = np.asarray(index, dtype=np.int64)
        groups = list(self.groups(order))
        bounds = np.cumsum([0] + [len(lo) for _, lo, _ in groups])
        out = np.empty((len(index), order), np.int64)
        which = np.searchsorted(bounds, index, side="right") - 1
        for k, (g, lo, _) in enumerate(groups):
            sel = np.flatnonzero(which == k)
            if len(sel):
                out[sel] = unpack_ngrams(g, lo[index[sel] - bounds[k]], order)
        return out

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
        write_npz(path, arrays)

    @classmethod
    def load(cls, path: str | Path, config: EngramConfig | str = "tiny") -> NgramCounts:
        out = cls(config)
        with read_npz(path, "n-gram counts", CorpusError) as (meta, data):
            if int(meta[2]) != out.config.engram_max_ngram_size:
                raise CorpusError(
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
