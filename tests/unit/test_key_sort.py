"""key_sort: the distinct keys of a batch and their counts, by the compiled radix sort and by
numpy, equal to ``np.unique`` per group for every key width the counting uses."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.analysis.corpus import key_sort
from engram_viz.analysis.corpus.keys import KEY_BITS, pack_ngrams


def _by_unique(lo: np.ndarray, group: np.ndarray | None) -> list[tuple[int, list[int], list[int]]]:
    groups = np.zeros(len(lo), np.uint8) if group is None else group
    out = []
    for g in sorted(set(groups.tolist())):
        keys, counts = np.unique(lo[groups == g], return_counts=True)
        out.append((g, keys.tolist(), counts.tolist()))
    return out


@pytest.mark.parametrize("radix_min", [1 << 40, 0], ids=["numpy", "compiled"])
@pytest.mark.parametrize("order", [2, 3, 4])
def test_distinct_counts_equal_np_unique_per_group(order, radix_min, monkeypatch):
    if radix_min == 0:
        pytest.importorskip("numba")
    monkeypatch.setattr(key_sort, "RADIX_MIN", radix_min)
    rng = np.random.default_rng(order)
    for size, top in ((0, 10), (1, 10), (5_000, 40), (20_000, 1 << KEY_BITS)):
        ngrams = rng.integers(0, top, (size, order))
        ngrams[: size // 10] = (1 << KEY_BITS) - 1  # the largest keys, in the last group
        group, lo = pack_ngrams(ngrams)
        spill = order * KEY_BITS - 64
        got = key_sort.distinct_counts(lo, group if spill > 0 else None, min(64, order * KEY_BITS), max(spill, 0))
        assert [(g, k.tolist(), c.tolist()) for g, k, c in got] == _by_unique(lo, group if spill > 0 else None)
        assert all(k.dtype == np.uint64 and c.dtype == np.int64 for _, k, c in got)
