"""The front every n-gram-derived row statistic shares: one config, its layout, one n-gram count.

:class:`RowUsage` and :class:`CollisionStats` both accumulate distinct n-grams with their
position counts (:class:`NgramCounts`) and derive their tables from them in one pass over the
(layer, order, head) columns (``bucket_passes.run_column_pass``). :class:`NgramAccumulator` is
that common front: adding windows or compressed sequences, merging shards, and keeping the last
pass until the counts change. ``counts`` lets several analyses share one :class:`NgramCounts` (no
copy: add data once, through any of them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Self

import numpy as np

from engram_viz.analysis.corpus.bucket_passes import run_column_pass
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError


class NgramAccumulator:
    """Accumulator of n-grams under one Engram config; subclasses say what a pass computes.

    A subclass gives ``_what`` (named in errors), a consumer of column views with ``result`` and
    ``params`` (the pass's options), and ``_sort(result)``. ``merge(other)`` adds another shard in
    place; shards merged equal the whole.
    """

    _what = "n-gram statistics"

    def __init__(
        self, config: EngramConfig | str = "tiny", counts: NgramCounts | None = None, pad_id: int | None = None
    ):
        self.config = load_config(config)
        self.layout = EngramLayout(self.config)
        self.counts = counts if counts is not None else NgramCounts(self.config, pad_id)
        self._cache: tuple[int, tuple, Any] | None = None  # (counts version, pass params, pass result)

    # -- accumulation
    def add_windows(self, windows: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Count windows ``[N, max_ngram]`` (``windows.StreamWindows``); mask bool ``[N]``, False = skip."""
        self.counts.add_windows(windows, mask)

    def add_compressed(self, compressed, token_mask=None) -> None:
        """Count sequences of compressed ids ``[B, T]`` or ``[T]`` (each from position 0);
        token_mask bool, same shape, False at image positions (and padding)."""
        self.counts.add_compressed(compressed, token_mask)

    def merge(self, other: Self) -> Self:
        """Add ``other`` into this accumulator (in place); returns self."""
        if other.config.engram_layer_ids != self.config.engram_layer_ids:
            raise InputError(f"cannot merge {self._what} of different Engram layouts")
        self.counts.merge(other.counts)
        return self

    @property
    def n_positions(self) -> int:
        return self.counts.n_positions

    # -- one pass over the columns
    def _cached(self, fits: Callable[[tuple], bool]) -> Any | None:
        """The kept pass result when the counts did not change since and ``fits(its params)``."""
        cached = self._cache
        if cached is not None and cached[0] == self.counts.version and fits(cached[1]):
            return cached[2]
        return None

    def _run(self, consumer: Any) -> Any:
        """One pass of ``consumer`` alone over the columns; its result, kept."""
        run_column_pass(self.layout, self.counts, [consumer])
        return self._finish(consumer)

    def _finish(self, consumer: Any) -> Any:
        """Sort a finished pass's result (``_sort``) and keep it with the pass's params."""
        result = consumer.result
        self._sort(result)
        self._cache = (self.counts.version, consumer.params, result)
        return result

    def _sort(self, result: Any) -> None:
        result.columns.sort(key=lambda r: (r["layer"], r["column"]))
