"""Trace: tidy frames, select/concat, and lossless save/load."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from engram_viz.analysis.row_stats.trace_ngrams import collision_exposure
from engram_viz.core.hooks import hook_name
from engram_viz.core.layout import EngramLayout
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.trace import Trace, TraceError
from engram_viz.weights.synthetic import synthetic_checkpoint

PROMPTS = [
    {"id": "en", "category": "english_entities", "text": "Alexander the Great tamed Bucephalus."},
    {"id": "zh", "category": "chinese_entities", "text": "张仲景是东汉末年的名医。"},
    {"id": "img", "category": "image", "text": "Look <image:3x2> at the Milky Way."},
    {"id": "rnd", "category": "random_token", "text": None, "seed": 7, "length": 9},
]


@pytest.fixture(scope="module")
def trace() -> Trace:
    pipe = Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu", batch_size=2)
    trace = pipe.run(PROMPTS, names=["engram.*.dot", "engram.L1.rows", "engram.L3.out", "engram.L1.value"])
    trace.extras["exposure"] = collision_exposure(trace, pipe.config)
    return trace


def test_contents(trace, tiny_config):
    assert trace.prompt_ids == ["en", "zh", "img", "rnd"]
    assert trace.categories == ["english_entities", "chinese_entities", "image", "random_token"]
    assert trace.layer_ids == tuple(tiny_config.engram_layer_ids)
    b, t = trace.batch_size, trace.seq_len
    assert trace.lengths.tolist() == [len(p) for p in trace.pieces]
    assert t == int(trace.lengths.max())
    assert trace.row_ids.shape == (b, t, 2, 24) and trace.row_ids.dtype == torch.int64
    assert trace.gates.shape == (b, t, 2, tiny_config.hc_mult) and trace.gates.dtype == torch.float32
    assert trace.tensors["engram.L1.rows"].shape == (b, t, 24, tiny_config.engram_head_dim)
    assert trace.tensors["engram.L3.out"].shape == (b, t, tiny_config.hc_mult, tiny_config.dim)
    assert trace.extras["exposure"].shape == (b, t, 2)
    assert "SYNTHETIC" in trace.model_label and trace.streams_label.startswith("embedding streams")
    assert trace.pieces[1][0] == "<｜begin▁of▁sentence｜>" and "张" in "".join(trace.pieces[1])
    img = trace.index("img")
    n = int(trace.lengths[img])
    assert trace.pieces[img][:n].count("<img>") == 6 and "<img:start>" in trace.pieces[img]
    assert (trace.compressed_ids[img, :n][trace.is_image[img, :n]] == -1).all()
    assert set(trace.captured("dot")) == {1, 3}
    with pytest.raises(KeyError, match="not in this trace"):
        trace.index("nope")


def test_gates_frame_is_tidy(trace, tiny_config):
    df = trace.to_frame("gates")
    assert list(df.columns[:10]) == [
        "prompt",
        "category",
        "position",
        "token",
        "raw_id",
        "compressed_id",
        "token_type",
        "is_image",
        "layer",
        "stream",
    ]
    assert {"gate", "dot", "exposure"} <= set(df.columns)
    hc = tiny_config.hc_mult
    assert len(df) == int(trace.lengths.sum()) * 2 * hc
    assert not df.duplicated(["prompt", "position", "layer", "stream"]).any()
    for pid in trace.prompt_ids:
        i = trace.index(pid)
        sub = df[df.prompt == pid]
        assert sub.position.max() == int(trace.lengths[i]) - 1
        for li, layer in enumerate(trace.layer_ids):
            got = sub[sub.layer == layer].sort_values(["position", "stream"]).gate.to_numpy()
            want = trace.gates[i, : int(trace.lengths[i]), li].numpy().reshape(-1)
            np.testing.assert_array_equal(got, want)
    assert (df.loc[df.is_image, "gate"] == 0).all()
    assert (df.loc[~df.is_image, "gate"] > 0).all()


def test_rows_frame(trace, tiny_config):
    df = trace.to_frame("rows")
    assert list(df.columns[:5]) == ["prompt", "category", "position", "token", "is_image"]
    assert {"layer", "order", "head", "column", "row"} <= set(df.columns)
    assert len(df) == int(trace.lengths.sum()) * 2 * 24
    assert (df["column"] == (df["order"] - 2) * 8 + df["head"]).all()
    layout = EngramLayout(tiny_config)
    for li, layer in enumerate(trace.layer_ids):
        sub = df[df.layer == layer]
        lo = layout.offsets[li][sub.column.to_numpy()]
        hi = lo + layout.column_primes[li][sub.column.to_numpy()]
        assert ((sub.row.to_numpy() >= lo) & (sub.row.to_numpy() < hi)).all()
    tokens = trace.to_frame("tokens")
    assert len(tokens) == int(trace.lengths.sum())
    with pytest.raises(ValueError, match="unknown table"):
        trace.to_frame("cols")


def test_save_load_is_lossless(trace, tmp_path):
    path = trace.save(tmp_path / "t")
    back = Trace.load(path)
    assert back.equals(trace)
    for name, t in trace.tensors.items():
        assert back.tensors[name].dtype == t.dtype
        assert torch.equal(
            back.tensors[name].view(torch.int16) if t.dtype == torch.bfloat16 else back.tensors[name],
            t.view(torch.int16) if t.dtype == torch.bfloat16 else t,
        )
    for kind in ("gates", "rows", "tokens"):
        pd.testing.assert_frame_equal(back.to_frame(kind), trace.to_frame(kind))
    # saving again over it works and stays equal; the JSON is plain UTF-8 text
    trace.save(path)
    assert Trace.load(path).equals(trace)
    doc = json.loads((path / "trace.json").read_text(encoding="utf-8"))
    assert doc["prompt_ids"] == trace.prompt_ids and "张" in "".join(doc["pieces"][1])


def test_load_errors(trace, tmp_path):
    path = trace.save(tmp_path / "t")
    with pytest.raises(TraceError, match="is missing"):
        Trace.load(tmp_path / "absent")
    other = trace.select(["en"]).save(tmp_path / "other")
    (path / "tensors.safetensors").write_bytes((other / "tensors.safetensors").read_bytes())
    with pytest.raises(TraceError, match="sha256 differs"):
        Trace.load(path)
    (path / "trace.json").write_text("{not json")
    with pytest.raises(TraceError, match="not valid JSON"):
        Trace.load(path)
    assert not list(tmp_path.rglob("*.tmp"))


def test_select_and_concat(trace):
    a, b = trace.select(["img", "en"]), trace.select(["rnd", "zh"])
    assert a.prompt_ids == ["img", "en"] and a.seq_len == int(trace.lengths[trace.index("img")])
    both = Trace.concat([a, b]).select(trace.prompt_ids)
    assert both.equals(trace)
    assert not a.equals(b)
    with pytest.raises(TraceError):
        Trace.concat([])


def test_validation(trace):
    tensors = dict(trace.tensors)
    del tensors[hook_name(3, "gate")]
    with pytest.raises(TraceError, match="needs engram.L3.gate"):
        Trace(
            trace.layer_ids,
            trace.prompt_ids,
            trace.categories,
            trace.texts,
            trace.input_ids,
            trace.compressed_ids,
            trace.token_types,
            trace.lengths,
            trace.pieces,
            tensors,
            "m",
            "s",
        )
    with pytest.raises(TraceError, match="one entry per prompt"):
        Trace(
            trace.layer_ids,
            trace.prompt_ids[:2],
            trace.categories,
            trace.texts,
            trace.input_ids,
            trace.compressed_ids,
            trace.token_types,
            trace.lengths,
            trace.pieces,
            trace.tensors,
            "m",
            "s",
        )


def test_gates_with_exposure_is_a_frame_not_a_mutation(trace):
    from engram_viz.analysis.row_stats.trace_ngrams import gates_with_exposure

    bare = trace.with_extras()
    bare.extras.pop("exposure")
    assert "exposure" in trace.extras  # with_extras gave a new Trace; this one is untouched
    assert "exposure" not in bare.to_frame("gates").columns
    merged = gates_with_exposure(bare, Pipeline(synthetic_checkpoint("tiny", 0), device="cpu").config)
    assert "exposure" not in bare.extras
    pd.testing.assert_frame_equal(merged, trace.to_frame("gates"))  # the same column, the same order
    with pytest.raises(TraceError, match="exposure must be"):
        bare.to_frame("gates", exposure=torch.zeros(1, 2, 3, dtype=torch.int64))
    with pytest.raises(TraceError, match="'gates' table"):
        bare.to_frame("rows", exposure=trace.extras["exposure"])


def test_frames_carry_the_provenance(trace):
    from engram_viz.run.provenance import provenance_of

    for name, df in trace.to_frames().items():
        prov = provenance_of(df)
        assert prov == trace.provenance, name
        assert prov.synthetic is True and prov.model == trace.model_label and prov.config == "tiny"
    sub = trace.to_frame("gates").query("prompt == 'en'")
    assert provenance_of(sub) == trace.provenance  # filtering keeps it
    assert provenance_of(pd.DataFrame({"a": [1]})) is None
