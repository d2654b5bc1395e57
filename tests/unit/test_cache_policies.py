"""libCacheSim's policies, as the suite runs them, against brute-force caches written in the test:
the hit count of every window (and so of the whole trace) for LRU, LFU, SIEVE and Belady; Belady's
future pass; the miss stream; sizes and names refused."""

from __future__ import annotations

import numpy as np
import pytest
from _brute_caches import belady, lfu, lru, next_uses, sieve

from engram_viz.analysis.caches import simulate
from engram_viz.analysis.caches.cache_sizes import parse_size, parse_sizes
from engram_viz.analysis.caches.future_access import NEVER, write_future_trace
from engram_viz.analysis.caches.page_io import miss_stream
from engram_viz.analysis.caches.policies import POLICIES, make_cache, parse_policies
from engram_viz.analysis.caches.simulate import SimJob, run_job
from engram_viz.errors import CacheSimError

pytestmark = pytest.mark.unit
pytest.importorskip("libcachesim")

BRUTE = {"LRU": lru, "LFU": lfu, "SIEVE": sieve, "Belady": belady}


def _trace(seed: int, n: int = 600, alphabet: int = 40) -> list[int]:
    """A skewed trace: a few hot rows, a long tail (row ids spread like a table's)."""
    rng = np.random.default_rng(seed)
    ranks = np.minimum(rng.zipf(1.3, n), alphabet) - 1
    return (ranks * 9_999_991 % 384_000_000).tolist()


def _files(tmp_path, trace: list[int]):
    path = tmp_path / "t.u32"
    np.asarray(trace, dtype="<u4").tofile(path)
    return path, write_future_trace(path, tmp_path / "t.future", block=37)  # many blocks: the merge is used


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("policy", sorted(BRUTE))
def test_hits_match_a_brute_force_cache_window_by_window(tmp_path, policy, seed):
    trace = _trace(seed)
    path, future = _files(tmp_path, trace)
    for size in (1, 2, 5, 17, 60):
        outcome = BRUTE[policy](trace, size)
        job = SimJob(str(future if policy == "Belady" else path), 1, "all", "token", policy, size, windows=7)
        windows = run_job(job)
        assert sum(w["accesses"] for w in windows) == len(trace)
        for w in windows:
            a = w["first_access"]
            assert w["hits"] == sum(outcome[a : a + w["accesses"]]), (policy, size, w)


@pytest.mark.parametrize("policy", ["LRU", "Belady"])
def test_reading_in_segments_changes_no_count(tmp_path, monkeypatch, policy):
    trace = _trace(2)
    path, future = _files(tmp_path, trace)
    outcome = BRUTE[policy](trace, 17)
    monkeypatch.setattr(simulate, "SEGMENT", 13)  # a fresh reader every 13 requests, windows cut across them
    windows = run_job(SimJob(str(future if policy == "Belady" else path), 1, "all", "token", policy, 17, windows=7))
    assert [w["hits"] for w in windows] == [sum(outcome[w["first_access"] :][: w["accesses"]]) for w in windows]


def test_belady_bounds_every_policy(tmp_path):
    trace = _trace(3, n=3000, alphabet=2000)
    path, future = _files(tmp_path, trace)
    for size in (100, 300):
        hits = {p: sum(w["hits"] for w in run_job(SimJob(str(path), 1, "all", "token", p, size))) for p in POLICIES}
        hits["Belady"] = sum(w["hits"] for w in run_job(SimJob(str(future), 1, "all", "token", "Belady", size)))
        assert max(hits.values()) == hits["Belady"], hits


def test_the_future_pass_matches_a_scan(tmp_path):
    trace = _trace(4, n=300)
    _, future = _files(tmp_path, trace)
    records = np.fromfile(future, dtype=[("row", "<u4"), ("next", "<i8")])
    assert records["row"].tolist() == trace
    assert records["next"].tolist() == [NEVER if j is None else j for j in next_uses(trace)]


@pytest.mark.parametrize("policy", ["LRU", "Belady"])
def test_the_miss_stream_is_the_brute_force_outcome_after_warm_up(tmp_path, policy):
    trace = _trace(5)
    path, future = _files(tmp_path, trace)
    outcome = BRUTE[policy](trace, 8)
    missed = miss_stream(str(future if policy == "Belady" else path), policy, 8, 250, len(trace))
    assert (~missed).tolist() == outcome[250:]


def test_policy_names_and_sizes_are_read_or_refused():
    assert parse_policies("lru, s3fifo,W_TinyLFU,belady") == ["LRU", "S3-FIFO", "W-TinyLFU", "Belady"]
    assert parse_policies(None) == list(POLICIES)
    with pytest.raises(CacheSimError, match="unknown cache policy 'MRU'"):
        parse_policies("LRU,MRU")
    assert parse_size("16384", 264, 10**9) == 16384
    assert parse_size("4MiB", 264, 10**9) == 4 * 2**20 // 264
    assert parse_size("25GB", 264, 10**9) == 25 * 10**9 // 264
    assert parse_size("10%", 264, 1000) == 100
    assert parse_size("table", 264, 1000) == 1000
    assert parse_sizes("1MB,16384,16384", 264, 10**9) == [3787, 16384]
    for bad in ("0", "-1", "abc", "1.5", "1e3", "", "100B", "200%", "nan"):
        with pytest.raises(CacheSimError):
            parse_sizes(bad, 264, 10**9)
    with pytest.raises(CacheSimError, match="S3-FIFO needs a cache of at least 10 rows"):
        make_cache("S3-FIFO", 9)  # libCacheSim would abort the process
