"""The row-access trace: its row ids are the hasher's (NgramHasher via hash_prompt), in token and
column order; a prefill step holds its distinct rows in order of first access; batch cuts, the
Dask path and a Trace's rows frame give the same files."""

from __future__ import annotations

import importlib.util

import numpy as np
import pandas as pd
import pytest
import torch

from engram_viz.analysis.caches.corpus_trace import trace_corpus, trace_rows_frame, trace_texts, trace_token_ids
from engram_viz.analysis.caches.row_trace import RowTrace, TraceWriter
from engram_viz.analysis.caches.simulate import simulate_trace
from engram_viz.analysis.corpus.documents import DocumentSpec
from engram_viz.config import load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CacheSimError

pytestmark = pytest.mark.unit

TEXTS = ["The Great Wall of China is long.", "四大发明：造纸术、指南针、火药、印刷术。", "def f(x):\n    return x + 1"]


@pytest.fixture(scope="module")
def v41():
    cfg = load_config("v41-flash")
    return cfg, get_tokenizer(cfg)


def _hasher_rows(cfg, tok, texts) -> np.ndarray:
    """Row ids [T, n_layers, 24] of each text hashed alone with BOS, concatenated."""
    ids = [tok.encode(t, bos=True) for t in texts]
    return np.concatenate([hash_prompt(cfg, tok.token_map, torch.tensor([i]))[0].numpy() for i in ids])


def _distinct_per_step(rows: np.ndarray, chunk: int) -> list[int]:
    out = []
    for a in range(0, len(rows), chunk):
        seen: dict[int, None] = {}
        for r in rows[a : a + chunk].reshape(-1).tolist():
            seen.setdefault(r)
        out += list(seen)
    return out


def test_trace_rows_are_the_hashers_per_layer_order_and_chunk(v41, tmp_path):
    cfg, tok = v41
    trace = trace_texts(TEXTS, cfg, tok, chunk=5, folder=tmp_path / "t")
    ref = _hasher_rows(cfg, tok, TEXTS)
    assert trace.tokens == len(ref)
    for li, layer in enumerate(cfg.engram_layer_ids):
        assert np.array_equal(np.asarray(trace.rows(layer)).reshape(-1, 24), ref[:, li])
        for n in cfg.ngram_orders:
            cols = slice((n - 2) * 8, (n - 1) * 8)
            assert np.array_equal(np.asarray(trace.rows(layer, f"n{n}")).reshape(-1, 8), ref[:, li, cols])
            steps = _distinct_per_step(ref[:, li, cols], 5)
            assert np.asarray(trace.rows(layer, f"n{n}", "chunk5")).tolist() == steps
        chunked = _distinct_per_step(ref[:, li], 5)
        assert np.asarray(trace.rows(layer, "all", "chunk5")).tolist() == chunked
        assert trace.step_sizes(layer).sum() == len(chunked) and len(trace.step_sizes(layer)) == -(-len(ref) // 5)
        assert trace.distinct_rows(layer) == len(np.unique(ref[:, li]))
    again = RowTrace.open(trace.folder)  # a kept trace folder reopened
    assert (again.tokens, again.chunk, again.scopes, again.config) == (trace.tokens, 5, trace.scopes, cfg)


def test_a_corpus_file_traces_as_its_documents_and_batch_cuts_change_nothing(v41, tmp_path):
    cfg, tok = v41
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(TEXTS * 3) + "\n", encoding="utf-8")
    small = trace_corpus([corpus], cfg, tok, spec=DocumentSpec(batch_chars=40), chunk=7, folder=tmp_path / "a")
    whole = trace_corpus([corpus], cfg, tok, chunk=7, folder=tmp_path / "b", progress=False)
    ref = _hasher_rows(cfg, tok, TEXTS * 3)
    assert small.tokens == whole.tokens == len(ref)
    assert small.files[0]["documents"] == 9 and small.files[0]["tokens"] == len(ref)
    for a in sorted(p.name for p in (tmp_path / "a").glob("L*")):
        assert (tmp_path / "a" / a).read_bytes() == (tmp_path / "b" / a).read_bytes(), a
    assert np.array_equal(np.asarray(small.rows(14)).reshape(-1, 24), ref[:, 1])


def test_a_rows_frame_traces_like_the_texts(v41, tmp_path):
    cfg, tok = v41
    ref = _hasher_rows(cfg, tok, TEXTS[:2])
    lengths = [len(tok.encode(t, bos=True)) for t in TEXTS[:2]]
    records = []
    at = 0
    for p, n in enumerate(lengths):
        for t in range(n):
            for li, layer in enumerate(cfg.engram_layer_ids):
                for c in range(24):
                    records.append((f"p{p}", t, layer, 2 + c // 8, c % 8, int(ref[at + t, li, c])))
        at += n
    frame = pd.DataFrame(records, columns=["prompt", "position", "layer", "order", "head", "row"]).sample(
        frac=1, random_state=0
    )
    frame = frame.sort_values("prompt", kind="stable")  # prompts in order, positions shuffled
    got = trace_rows_frame(frame, cfg, chunk=4, folder=tmp_path / "f")
    want = trace_texts(TEXTS[:2], cfg, tok, chunk=4, folder=tmp_path / "w")
    assert got.tokens == want.tokens == sum(lengths)
    for name in sorted(p.name for p in want.folder.glob("L*")):
        assert (got.folder / name).read_bytes() == (want.folder / name).read_bytes(), name


def test_the_dask_trace_equals_the_one_process_trace(v41, tmp_path):
    pytest.importorskip("dask.distributed")
    from engram_viz.analysis.caches.dask_trace import trace_corpus_dask
    from engram_viz.analysis.corpus.dask_counting import dask_client

    cfg, tok = v41
    corpus = tmp_path / "c.txt"
    corpus.write_text("\n\n".join(TEXTS * 4) + "\n", encoding="utf-8")
    spec = DocumentSpec(batch_chars=60)
    one = trace_corpus([corpus], cfg, tok, spec=spec, chunk=6, folder=tmp_path / "one", progress=False)
    with dask_client(2, processes=False) as client:
        many = trace_corpus_dask(client, [corpus], cfg, tok, tmp_path / "many", spec, chunk=6, progress=False)
        part = trace_corpus_dask(
            client, [corpus], cfg, tok, tmp_path / "part", spec, 6, progress=False, layers=[14], scopes=["n3"]
        )
        if importlib.util.find_spec("libcachesim"):  # the simulations as tasks: the same tables
            on_dask = simulate_trace(many, "LRU,Belady", [100, 200], 264, windows=3, client=client)
            here = simulate_trace(one, "LRU,Belady", [100, 200], 264, windows=3)
            for a, b in zip(on_dask, here, strict=True):
                pd.testing.assert_frame_equal(a, b)
    assert many.tokens == one.tokens and many.files[0]["documents"] == 12
    part = RowTrace.open(part.folder)  # one layer, one scope: its files are the whole trace's
    assert part.layer_ids == (14,) and part.scopes == ("n3",) and part.tokens == one.tokens
    assert sorted(p.name for p in part.folder.glob("L*")) == [
        "L14-n3-chunk6.steps",
        "L14-n3-chunk6.u32",
        "L14-n3-token.u32",
    ]
    for name in ("L14-n3-chunk6.steps", "L14-n3-chunk6.u32", "L14-n3-token.u32"):
        assert (part.folder / name).read_bytes() == (one.folder / name).read_bytes(), name
    assert part.distinct_rows(14, "n3") == one.distinct_rows(14, "n3")
    for name in sorted(p.name for p in (tmp_path / "one").glob("L*")):
        assert (tmp_path / "many" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name


def test_bad_traces_are_refused(v41, tmp_path):
    cfg, tok = v41
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n", encoding="utf-8")
    with pytest.raises(CacheSimError, match="gave no tokens"):
        trace_corpus([empty], cfg, tok, folder=tmp_path / "e", progress=False)
    assert not (tmp_path / "e").exists()
    with pytest.raises(CacheSimError, match="prefill chunk"):
        TraceWriter(cfg, tmp_path / "w", chunk=0)
    with pytest.raises(CacheSimError, match="shape"):
        TraceWriter(cfg, tmp_path / "w").add(np.zeros((3, 2, 23), dtype=np.int64))
    for bad in ({"layers": [2]}, {"scopes": ["n5"]}):
        with pytest.raises(CacheSimError, match="has layers"):
            TraceWriter(cfg, tmp_path / "b", **bad)
    assert not (tmp_path / "b").exists()


def test_token_id_sequences_trace_like_the_hasher(v41, tmp_path):
    cfg, tok = v41
    rng = np.random.default_rng(0)
    seqs = [rng.integers(0, cfg.vocab_size, n).tolist() for n in (7, 1, 12)]
    trace = trace_token_ids(seqs, cfg, tok, chunk=3, folder=tmp_path / "r")
    ref = np.concatenate([hash_prompt(cfg, tok.token_map, torch.tensor([s]))[0].numpy() for s in seqs])
    assert np.array_equal(np.asarray(trace.rows(1)).reshape(-1, 24), ref[:, 0])
    assert np.asarray(trace.rows(14, "all", "chunk3")).tolist() == _distinct_per_step(ref[:, 1], 3)
