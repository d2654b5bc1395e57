"""engram_viz.weights.row_cache: a LazyTable with a hot-row cache returns the stored rows bit for
bit (hits, misses, slot conflicts, all-hit calls), counts its hits, and pickles empty."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from weights_kit import raw, write_tiny_table

from engram_viz.weights.row_cache import RowCache
from engram_viz.weights.tables import LazyTable


@pytest.fixture(scope="module")
def tiny_table_file(tmp_path_factory):
    return write_tiny_table(tmp_path_factory.mktemp("table"))


@pytest.mark.parametrize("cache_mb", [0.002, 0.05, 8])  # ~30 slots (constant conflicts), ~760, all rows
def test_cached_gathers_equal_the_stored_rows(tiny_table_file, cache_mb):
    path, w, s = tiny_table_file
    table = LazyTable.open(path, "t.weight", "t.scale", cache_mb=cache_mb)
    assert table.cache.slots > 0
    rng = np.random.default_rng(4)
    zipf = np.minimum(rng.zipf(1.3, 6000), 5000) - 1  # hot rows come back call after call
    for call in range(6):
        ids = torch.from_numpy(zipf[call * 1000 : (call + 1) * 1000].reshape(40, 25))
        gw, gs = table.gather_fp8(ids)
        assert torch.equal(raw(gw), raw(F.embedding(ids, w))) and torch.equal(raw(gs), raw(F.embedding(ids, s)))
    assert 0 < table.cache.hits < table.cache.lookups
    again = torch.from_numpy(zipf[:10])
    if cache_mb == 8:  # every row fits: a repeat is all hits
        hits = table.cache.hits
        assert torch.equal(raw(table.gather_fp8(again)[0]), raw(w[again]))
        assert table.cache.hits - hits == len(torch.unique(again))
    clone = pickle.loads(pickle.dumps(table))
    assert clone.cache.lookups == 0 and clone.cache.slots == table.cache.slots
    assert torch.equal(raw(clone.gather_fp8(again)[0]), raw(w[again]))


def test_off_and_second_chance():
    assert RowCache(0, 256, 8).slots == 0
    cache = RowCache(1 / 2**20 * 3 * (4 + 1 + 9), 4, 1)  # three slots of 4 + 1 bytes
    assert cache.slots == 3

    def read(ids):
        return np.repeat(ids[:, None], 4, 1).astype(np.uint8), ids[:, None].astype(np.uint8)

    hot = np.array([7])
    cache.gather(hot, read)
    cache.gather(hot, read)  # a hit marks the slot referenced
    rival = next(i for i in range(8, 10**4) if cache._slot(np.array([i]))[0] == cache._slot(hot)[0])
    cache.gather(np.array([rival]), read)  # the referenced resident keeps its slot, losing the mark
    assert cache.gather(hot, read)[0].tolist() == [[7] * 4] and cache.hits == 2
