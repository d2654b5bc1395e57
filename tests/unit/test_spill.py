"""spill: the external merge of sorted runs, and NgramCounts under a memory limit equal to none."""

from __future__ import annotations

import contextlib
import functools
import os
import pickle
import resource
import signal

import numpy as np
import pytest
from _brute import random_sequences

from engram_viz.analysis.corpus import spill
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.spill import (
    FileArray,
    MemoryLimitError,
    SpillStore,
    external_merge,
    merge_sorted,
    parse_memory_limit,
)
from engram_viz.config import load_config
from engram_viz.errors import WriteError


def _run(rng, n, high):
    keys = np.unique(rng.integers(0, high, n).astype(np.uint64))
    return keys, rng.integers(1, 9, len(keys)).astype(np.int64)


@pytest.mark.parametrize("merge_min", [1 << 60, 0], ids=["numpy", "compiled"])
def test_merge_sorted_sums_equal_keys_like_a_dict(merge_min, monkeypatch):
    """Both merges of two runs (insertion points, or the compiled linear merge) give every key
    once, ascending, with its counts summed, as a dict over all the runs does."""
    if merge_min == 0:
        pytest.importorskip("numba")
    else:  # the numpy merge, although another test may have loaded the compiled one
        monkeypatch.setattr(spill, "_merge_kernel", functools.lru_cache(maxsize=1)(lambda: None))
    monkeypatch.setattr(spill, "MERGE_MIN", merge_min)
    rng = np.random.default_rng(11)
    for sizes, high in (((), 10), ((0, 5), 10), ((1, 1, 1), 3), ((40, 300, 700, 2), 500), ((3000, 20), 1 << 63)):
        runs = [_run(rng, n, high) for n in sizes] + [(np.array([2**64 - 1], np.uint64), np.array([5]))]
        want: dict[int, int] = {}
        for keys, counts in runs:
            for k, c in zip(keys.tolist(), counts.tolist()):
                want[k] = want.get(k, 0) + c
        keys, counts = merge_sorted(runs)
        assert keys.dtype == np.uint64 and counts.dtype == np.int64
        assert list(zip(keys.tolist(), counts.tolist())) == sorted(want.items())


@pytest.mark.parametrize("chunk", [1, 3, 64, 10_000])
def test_external_merge_equals_in_memory_merge(chunk):
    rng = np.random.default_rng(chunk)
    runs = [_run(rng, n, 500) for n in (0, 1, 40, 300, 700)] + [(np.array([2**64 - 1], np.uint64), np.array([5]))]
    out = []
    total = external_merge(runs, chunk, lambda k, c: out.append((k, c)))
    keys, counts = np.concatenate([k for k, _ in out]), np.concatenate([c for _, c in out])
    want_keys, want_counts = merge_sorted(runs)
    assert total == len(want_keys)
    assert np.array_equal(keys, want_keys) and np.array_equal(counts, want_counts)
    assert np.all(keys[1:] > keys[:-1])  # each key once, in order


def _on_disk(tmp_path, i, keys, counts):
    """A run written as raw files and read back as ``FileArray`` pairs."""
    keys.tofile(tmp_path / f"{i}.keys")
    counts.tofile(tmp_path / f"{i}.counts")
    return FileArray(tmp_path / f"{i}.keys", np.uint64, len(keys)), FileArray(
        tmp_path / f"{i}.counts", np.int64, len(keys)
    )


def test_file_array_reads_like_the_array(tmp_path):
    a = np.arange(10, 30, dtype=np.int64) * 3
    a.tofile(tmp_path / "a.bin")
    f = FileArray(tmp_path / "a.bin", np.int64, len(a))
    assert len(f) == 20 and f[0] == 30 and f[-1] == a[-1] and f[7] == a[7]
    for sl in (slice(0, 20), slice(3, 9), slice(15, 40), slice(5, 5), slice(-4, None), slice(None, 2)):
        got = f[sl]
        assert got.dtype == np.int64 and np.array_equal(got, a[sl])
    with pytest.raises(IndexError):
        f[20]
    with pytest.raises(ValueError, match="contiguous"):
        f[::2]


@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_external_merge_of_runs_on_disk_equals_in_memory_merge(tmp_path, chunk):
    rng = np.random.default_rng(chunk)
    runs = [_run(rng, n, 900) for n in (0, 5, 300, 800)]
    on_disk = [_on_disk(tmp_path, i, k, c) for i, (k, c) in enumerate(runs[:3])] + runs[3:]  # mixed, as merged() does
    out = []
    total = external_merge(on_disk, chunk, lambda k, c: out.append((k, c)))
    want_keys, want_counts = merge_sorted(runs)
    assert total == len(want_keys)
    assert np.array_equal(np.concatenate([k for k, _ in out]), want_keys)
    assert np.array_equal(np.concatenate([c for _, c in out]), want_counts)


def test_spill_store_merges_runs_and_cleans_up(tmp_path):
    rng = np.random.default_rng(0)
    store = SpillStore(tmp_path, prefix="t-", chunk_bytes=64)
    runs = [_run(rng, 200, 300) for _ in range(4)]
    for k, c in runs[:3]:
        store.write(2, 0, k, c)
    keys, counts = store.merged(2, 0, runs[3])
    want = merge_sorted(runs)
    assert np.array_equal(keys, want[0]) and np.array_equal(counts, want[1])
    assert len(store.runs[(2, 0)]) == 1 and len(list(tmp_path.glob("t-*.tmp/*"))) == 2  # the merged run only
    store.close()
    assert not list(tmp_path.iterdir())


def test_counts_with_a_tiny_memory_limit_equal_counts_without(tmp_path):
    cfg = load_config("tiny")
    seqs, masks = random_sequences(3, n_seq=30, max_len=60, alphabet=500)
    free, bounded = NgramCounts(cfg), NgramCounts(cfg, memory_limit=256, spill_dir=tmp_path)
    for s, m in zip(seqs, masks):
        free.add_compressed(np.array(s), np.array(m))
        bounded.add_compressed(np.array(s), np.array(m))
    assert bounded.n_spills > 5 and any(tmp_path.iterdir())
    assert bounded == free
    assert bounded.n_distinct(3) == free.n_distinct(3)
    bounded.add_compressed(np.array(seqs[0]))  # adding after a read merges again
    free.add_compressed(np.array(seqs[0]))
    assert bounded == free
    merged = NgramCounts(cfg, memory_limit="1k", spill_dir=tmp_path).merge(bounded)
    assert merged == free
    bounded.add_compressed(np.array(seqs[1]))  # something pending when it is pickled
    free.add_compressed(np.array(seqs[1]))
    travelled = pickle.loads(pickle.dumps(bounded))  # spilled runs travel as arrays ...
    assert travelled == free and not travelled._spill
    assert bounded._spill and bounded.n_distinct_stored() == 0  # ... read for the copy: the original stays on disk
    assert bounded == free
    bounded.close()
    merged.close()
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("text", "size"), [("2GB", 2 * 10**9), ("512MiB", 512 * 2**20), ("64k", 64_000), (7, 7)])
def test_parse_memory_limit(text, size):
    assert parse_memory_limit(text) == size


@pytest.mark.parametrize("bad", ["lots", "2XB", "0", -1, "-5MB"])
def test_parse_memory_limit_refuses(bad):
    with pytest.raises(MemoryLimitError, match="memory limit"):
        parse_memory_limit(bad)


@contextlib.contextmanager
def _file_size_limit(size: int):
    """Writes past ``size`` bytes of a file fail (EFBIG), as on a full disk: a real short write."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails instead of killing the process
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


def test_a_spill_that_cannot_be_written_names_the_folder_the_disk_and_the_memory_limit(tmp_path):
    """A spill onto a full disk once ended with numpy's "90740 requested and 30208 written"."""
    cfg = load_config("tiny")
    counts = NgramCounts(cfg, memory_limit=4000, spill_dir=tmp_path, spill_prefix="t-")
    ids = np.random.default_rng(0).integers(0, 500, 3000)  # one spill of about 24,000 bytes of keys
    with _file_size_limit(2000), pytest.raises(WriteError) as err:
        counts.add_compressed(ids)
    message = str(err.value)
    assert "\n" not in message
    assert f"in {tmp_path}{os.sep}t-" in message  # the spill folder
    assert "the disk mounted at /" in message and "bytes free" in message
    assert "the memory limit of 4,000 bytes (--memory-limit)" in message
    assert "File too large" in message  # the system's reason, not numpy's byte counts
    store = SpillStore(tmp_path / "none", memory_limit=None)
    with _file_size_limit(10), pytest.raises(WriteError, match=r"none.*past no memory limit"):
        store.write(2, 0, np.arange(100, dtype=np.uint64), np.ones(100, np.int64))
