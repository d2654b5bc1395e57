"""explain() through a Pipeline on the checkpoint kinds the suite reads: the embedded default
(whatever it is) and synthetic Engram layers on embedding streams. The numbers are the
Pipeline's own, never pinned: gates equal the Trace's, a left-out row equals a run with that row
zeroed through the Pipeline's ``rows`` hook, frames carry owners and decoded n-grams."""

from __future__ import annotations

import html
import json

import numpy as np
import pytest
import torch

from engram_viz.analysis.explain.explanation import ROW_COLUMNS, AttributionError, explain
from engram_viz.cli import main
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.tokens import token_html
from engram_viz.weights.synthetic import synthetic_checkpoint

pytestmark = pytest.mark.integration
TEXT = "Only Alexander the Great could tame the horse."


@pytest.fixture(scope="module", params=["default", "synthetic"])
def pipe(request):
    if request.param == "default":
        return Pipeline(device="cpu")
    return Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu")


@pytest.fixture(scope="module")
def explained(pipe):
    return explain(pipe, TEXT)


def test_gates_are_the_pipelines(pipe, explained):
    trace = pipe.run([TEXT])
    for li, layer in enumerate(pipe.layer_ids):
        torch.testing.assert_close(explained.layers[layer].gate, trace.gates[0, :, li], atol=1e-6, rtol=0)
    assert np.array_equal(explained.row_ids, trace.row_ids[0].numpy())


def test_left_out_row_equals_a_pipeline_run_with_the_row_zeroed(pipe, explained):
    layer, col, pos = pipe.layer_ids[0], 13, 4

    def zero(t: torch.Tensor, name: str) -> torch.Tensor:
        t = t.clone()
        t[:, pos, col] = 0
        return t

    edited = pipe.run([TEXT], hooks={f"engram.L{layer}.rows": zero})
    got = explained.layers[layer].loo_row[pos, col]
    torch.testing.assert_close(got, edited.gates[0, pos, 0], atol=2e-3, rtol=0)


def test_rows_frame_owners_and_ngrams(pipe, explained):
    layer = pipe.layer_ids[-1]
    df = explained.rows_frame(position=-1, layer=layer)
    assert list(df.columns) == list(ROW_COLUMNS)
    hc = pipe.config.hc_mult
    assert len(df) == pipe.config.n_hash_cols * hc
    layout = EngramLayout(pipe.config)
    for rec in df.drop_duplicates("column").itertuples():
        owner = layout.owner(layer, int(rec.row))
        assert (owner.order, owner.head, owner.column) == (rec.order, rec.head, rec.column)
    # the decoded n-gram of order n ends with the position's token and has n pieces' worth of text
    last = explained.pieces[-1].strip().lower()
    assert all(last in g.lower() for g in df["ngram"])
    # per stream, the shares sum to the dot up to the key's rounding
    sums = df.groupby("stream")["dot_share"].sum()
    dot = df.groupby("stream")["dot"].first()
    assert np.allclose(sums, dot, atol=0.05 * max(1.0, float(dot.abs().max())))


def test_groups_frame(explained):
    g = explained.groups_frame(position=3)
    orders = g[g.kind == "order"]
    per_stream = orders.groupby(["layer", "stream"])
    eff = per_stream["shapley"].sum()
    layer_ids = list(explained.layers)
    for (layer, stream), total in eff.items():
        a = explained.layers[layer]
        i = explained.index(3)
        assert total == pytest.approx(float(a.gate[i, stream] - a.coalitions[i, 0, stream]), abs=1e-5)
    assert set(g.kind) == {"order", "head"} and set(g.layer) == set(layer_ids)


def test_selection_and_errors(pipe):
    part = explain(pipe, TEXT, positions=[2, -1], layers=[pipe.layer_ids[0]])
    assert list(part.layers) == [pipe.layer_ids[0]] and len(part.positions) == 2
    with pytest.raises(AttributionError, match="outside the prompt"):
        explain(pipe, TEXT, positions=[500])
    with pytest.raises(EngramVizError, match="not an Engram layer"):
        explain(pipe, TEXT, layers=[2])
    with pytest.raises(AttributionError, match="was not explained"):
        part.rows_frame(position=5)


def test_cli_explain(capsys):
    assert main(["explain", TEXT, "--position", "-2", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    pipe = Pipeline(device="cpu")
    assert len(out["rows"]) == pipe.config.n_hash_cols * len(pipe.layer_ids)
    assert {"layer", "order", "head", "row", "ngram", "share_s0", "loo_s0"} <= set(out["rows"][0])
    assert set(out["layers"]) == {str(x) for x in pipe.layer_ids}
    assert main(["explain", TEXT, "--position", "3", "--layer", str(pipe.layer_ids[0])]) == 0
    text = capsys.readouterr().out
    assert "Shapley" in text and text.count("\n") >= pipe.config.n_hash_cols
    assert main(["explain", TEXT, "--position", "99"]) == 2
    assert "outside the prompt" in capsys.readouterr().err


def test_token_html_tooltips_from_an_explanation(pipe):
    layer = pipe.layer_ids[0]
    trace = pipe.run([TEXT])
    explained = explain(pipe, TEXT, layers=[layer])
    shares = explained.groups_frame(left_out=False)
    assert shares["loo_gate"].isna().all() and not explained.layers[layer]._done.any()  # nothing re-run
    page = token_html(trace.to_frame("gates"), layer=layer, stream=0, attribution=shares)
    assert "<script" not in page
    a = explained.layers[layer]
    orders = a.group(a.dot_share, "order")[2, :, 0]  # position 2, stream 0
    want = "  ".join(f"{o}-gram {100 * float(v / orders.sum()):+.0f}%" for o, v in zip(a.order_ids, orders))
    assert f"order shares of dot (stream 0): {want}" in html.unescape(page)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"positions": [1.0]}, r"positions must be integers, got 1\.0 \(float\)"),
        ({"positions": [2.7]}, r"positions must be integers, got 2\.7"),
        ({"positions": [True]}, r"positions must be integers, got True \(bool\)"),
        ({"positions": np.array([1.5])}, "positions must be integers"),
        ({"positions": ["3"]}, r"positions must be integers, got '3' \(str\)"),
        ({"positions": 3}, r"positions must be a list of integers or None, got 3 \(int\)"),
        ({"positions": "3"}, "positions must be a list of integers or None"),
        ({"positions": []}, "positions is empty; give at least one, or None for all"),
        ({"positions": np.array([], np.int64)}, "positions is empty"),
        ({"layers": [1.0]}, r"layers must be integers, got 1\.0 \(float\)"),
        ({"layers": [False]}, r"layers must be integers, got False \(bool\)"),
        ({"layers": []}, "layers is empty"),
    ],
)
def test_positions_and_layers_that_are_not_integers_are_refused(pipe, kwargs, match):
    with pytest.raises(AttributionError, match=match):
        explain(pipe, TEXT, **kwargs)


def test_integer_positions_of_any_integer_type_are_accepted(pipe):
    ex = explain(pipe, TEXT, positions=np.array([1, -1]), layers=(np.int64(pipe.layer_ids[0]),))
    assert ex.positions.tolist() == [1, len(ex.pieces) - 1]
    with pytest.raises(AttributionError, match=r"position must be integers, got 1\.0"):
        ex.rows_frame(position=1.0)
    with pytest.raises(AttributionError, match=r"layer must be integers, got True"):
        ex.rows_frame(layer=True)


def test_a_position_outside_the_prompt_names_the_position_given(pipe, capsys):
    n = len(pipe.run([TEXT]).pieces[0])
    with pytest.raises(AttributionError, match=rf"position -99 is outside the prompt; it has {n} tokens .*-{n}\.\.-1"):
        explain(pipe, TEXT, positions=[-99])
    with pytest.raises(AttributionError, match=r"position 10000000000000000000000 is outside"):
        explain(pipe, TEXT, positions=[10**22])
    assert main(["explain", TEXT, "--position", "-99"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "position -99 is outside the prompt" in err, err
