"""The inverse index of a corpus: table row -> the n-grams that land in it, with their counts.

Built from corpus n-gram counts (:class:`~engram_viz.analysis.corpus.ngram_counts.NgramCounts`) one column at
a time (``columns.iter_columns``: each (layer, order, head) column's distinct n-grams, bucketed by
one sort). Per layer it keeps, for every occupied row (sorted): how many distinct corpus n-grams
land there (``n_ngrams``; >= 2 is a *collision bucket*), how many positions carry them (``hits``),
and its members: up to ``max_per_row`` n-grams, the most frequent first (ties: smaller n-gram
first), each with its count.

Memory (bounded): per layer 24 bytes per occupied row plus 16 bytes per kept member, plus the kept
n-grams themselves (8 bytes per id); at most ``n_layers x 24 x min(U, ...)`` rows for U distinct
n-grams per order, and never a dense array of a table's size. While building, one column's sort at
a time. :meth:`RowIndex.save` / :meth:`RowIndex.load` write and read one ``.npz`` (``_files``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from engram_viz._files import read_npz, write_npz
from engram_viz.analysis.corpus.bucket_passes import ColumnView, iter_columns
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import RowIndexError

FORMAT = 1


@dataclass
class LayerIndex:
    """One layer: ``row``/``n_ngrams``/``hits`` int64 ``[R]`` (rows sorted), ``start`` int64
    ``[R + 1]`` (members of row i: ``start[i]:start[i + 1]``), ``member_order`` int64 ``[M]``,
    ``member_ngram`` int64 ``[M]`` (index into the index's n-grams of that order), ``member_count`` int64 ``[M]``."""

    row: np.ndarray
    n_ngrams: np.ndarray
    hits: np.ndarray
    start: np.ndarray
    member_order: np.ndarray
    member_ngram: np.ndarray
    member_count: np.ndarray

    def find(self, rows) -> tuple[np.ndarray, np.ndarray]:
        """``(at, found)`` for query rows ``[Q]``: position in ``row`` and whether it is occupied."""
        q = np.asarray(rows, dtype=np.int64)
        if not len(self.row):
            return np.zeros(q.shape, np.int64), np.zeros(q.shape, bool)
        at = np.minimum(np.searchsorted(self.row, q), len(self.row) - 1)
        return at, self.row[at] == q


def _column_part(view: ColumnView, max_per_row: int, min_count: int) -> dict[str, np.ndarray]:
    """Occupied rows of one column and their kept members (most frequent first)."""
    s = view.stats()
    members, starts = view.grouped()
    bucket_of = np.repeat(np.arange(len(s.occupied)), s.n_ngrams)
    counts = view.counts[members]
    by = np.lexsort((members, -counts, bucket_of))  # bucket, then count descending, then n-gram
    members, counts, bucket_of = members[by], counts[by], bucket_of[by]
    rank = np.arange(len(members)) - np.repeat(starts, s.n_ngrams)
    keep = (rank < max_per_row) & (counts >= min_count)
    kept_per_row = np.bincount(bucket_of[keep], minlength=len(s.occupied))
    return {
        "row": s.occupied + view.offset,
        "n_ngrams": s.n_ngrams,
        "hits": s.hits,
        "kept": kept_per_row,
        "member_ngram": members[keep],
        "member_count": counts[keep],
        "member_order": np.full(int(keep.sum()), view.order, np.int64),
    }


class RowIndex:
    """Row -> corpus n-grams, per Engram layer (module docstring). ``ngrams[order]`` int64
    ``[U', order]`` holds the kept n-grams (compressed ids, oldest first)."""

    def __init__(self, config: EngramConfig, layers: dict[int, LayerIndex], ngrams: dict[int, np.ndarray], meta: dict):
        self.config, self.layers, self.ngrams, self.meta = config, layers, ngrams, meta
        self.layout = EngramLayout(config)

    @classmethod
    def build(cls, counts: NgramCounts, max_per_row: int = 16, min_count: int = 1) -> RowIndex:
        """The index of ``counts`` (see the module docstring)."""
        if max_per_row < 1 or min_count < 1:
            raise RowIndexError(f"max_per_row and min_count must be >= 1, got {max_per_row} and {min_count}")
        layout = EngramLayout(counts.config)
        parts: dict[int, list] = {n: [] for n in layout.layer_ids}
        for view in iter_columns(layout, counts):
            parts[view.layer].append((view.column, _column_part(view, max_per_row, min_count)))
        used = {n: [] for n in counts.orders}
        for plist in parts.values():
            for _, p in plist:
                if len(p["member_order"]):
                    used[int(p["member_order"][0])].append(p["member_ngram"])
        kept = {n: np.unique(np.concatenate(u)) if u else np.empty(0, np.int64) for n, u in used.items()}
        ngrams = {n: counts.ngrams(n)[0][kept[n]] for n in counts.orders}
        layers = {}
        for layer, plist in parts.items():
            plist = [p for _, p in sorted(plist, key=lambda cp: cp[0])]  # column order = row order
            cat = {k: np.concatenate([p[k] for p in plist]) if plist else np.empty(0, np.int64) for k in plist[0]}
            remapped = cat["member_ngram"].copy()
            for n in counts.orders:
                sel = cat["member_order"] == n
                remapped[sel] = np.searchsorted(kept[n], cat["member_ngram"][sel])
            start = np.concatenate([[0], np.cumsum(cat["kept"])]).astype(np.int64)
            layers[layer] = LayerIndex(
                cat["row"], cat["n_ngrams"], cat["hits"], start, cat["member_order"], remapped, cat["member_count"]
            )
        meta = {"max_per_row": max_per_row, "min_count": min_count, "n_positions": counts.n_positions}
        return cls(counts.config, layers, ngrams, meta)

    # -- queries
    def _layer(self, layer: int) -> LayerIndex:
        if layer not in self.layers:
            raise RowIndexError(
                f"layer {layer} is not an Engram layer of this index; expected one of {list(self.layers)}"
            )
        return self.layers[layer]

    def n_ngrams(self, layer: int, rows) -> np.ndarray:
        """int64 ``[Q]``: distinct corpus n-grams in each row (0 where none lands)."""
        li = self._layer(layer)
        at, found = li.find(rows)
        return np.where(found, li.n_ngrams[at] if len(li.row) else 0, 0)

    def is_collision(self, layer: int, rows) -> np.ndarray:
        """bool ``[Q]``: the row holds two or more distinct corpus n-grams."""
        return self.n_ngrams(layer, rows) >= 2

    def members(self, layer: int, row: int) -> list[tuple[tuple[int, ...], int]]:
        """The kept n-grams of one row, most frequent first: ``[(compressed ids, count), ...]``."""
        li = self._layer(layer)
        at, found = li.find([row])
        if not found[0]:
            return []
        a, b = int(li.start[at[0]]), int(li.start[at[0] + 1])
        return [
            (tuple(int(x) for x in self.ngrams[int(o)][int(i)]), int(c))
            for o, i, c in zip(li.member_order[a:b], li.member_ngram[a:b], li.member_count[a:b])
        ]

    def row_frame(self, layer: int, rows, decoder=None) -> pd.DataFrame:
        """One row per (queried row, kept n-gram): layer, row, order, head, n_ngrams, collision,
        ngram (ids), text (when a ``decoder`` (``NgramDecoder``) is given), count."""
        recs = []
        for r in np.asarray(rows, dtype=np.int64).reshape(-1).tolist():
            owner = self.layout.owner(layer, r)
            n = int(self.n_ngrams(layer, [r])[0])
            for ids, c in self.members(layer, r):
                rec = {"layer": layer, "row": r, "order": owner.order, "head": owner.head, "n_ngrams": n}
                rec.update({"collision": n >= 2, "ngram": ids, "count": c})
                if decoder is not None:
                    rec["text"] = decoder.text(ids)
                recs.append(rec)
        cols = ["layer", "row", "order", "head", "n_ngrams", "collision", "ngram", "count"]
        return pd.DataFrame(recs, columns=cols + (["text"] if decoder is not None else []))

    # -- persistence
    def save(self, path: str | Path) -> Path:
        """One ``.npz``, written atomically."""
        arrays = {
            "meta": np.array([FORMAT, self.meta["max_per_row"], self.meta["min_count"], self.meta["n_positions"]])
        }
        for n, g in self.ngrams.items():
            arrays[f"ngrams_o{n}"] = g
        for layer, li in self.layers.items():
            for k, v in vars(li).items():
                arrays[f"L{layer}_{k}"] = v
        return write_npz(path, arrays)

    @classmethod
    def load(cls, path: str | Path, config: EngramConfig | str = "tiny") -> RowIndex:
        config = load_config(config)
        with read_npz(path, "row index", RowIndexError) as (meta, data):
            if int(meta[0]) != FORMAT:
                raise RowIndexError(f"{path}: row index format {int(meta[0])}; expected {FORMAT}")
            want = {f"L{n}_row" for n in config.engram_layer_ids}
            if not want <= set(data.files):
                raise RowIndexError(
                    f"{path} holds no index for layers {sorted(want - set(data.files))} of {config.name!r}"
                )
            ngrams = {n: data[f"ngrams_o{n}"] for n in config.ngram_orders}
            fields = LayerIndex.__dataclass_fields__
            layers = {n: LayerIndex(**{k: data[f"L{n}_{k}"] for k in fields}) for n in config.engram_layer_ids}
        m = {"max_per_row": int(meta[1]), "min_count": int(meta[2]), "n_positions": int(meta[3])}
        return cls(config, layers, ngrams, m)
