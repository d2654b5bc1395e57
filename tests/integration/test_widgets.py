"""The prompt-comparison widget, driven from Python: state in, HTML / figures / tables out."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from engram_viz.apps.widget import PromptComparison
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.export import check_offline_html
from engram_viz.viz.token_labels import image_spans

A = "Only Alexander the Great could tame the horse Bucephalus."
B = "Only Alexander the Small could tame the horse Bucephalus."


@pytest.fixture(scope="module")
def pipe():
    return Pipeline()


@pytest.fixture()
def cmp(pipe):
    return PromptComparison((A, B), pipeline=pipe)


def _first_diff(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def test_default_state_shows_both_prompts_and_the_difference(cmp, pipe):
    assert cmp.prompts == [A, B]
    assert cmp.messages == {"A": None, "B": None}
    assert set(cmp.panels) == {"header", "A", "B", "diff B-A"}
    assert cmp.layer == pipe.layer_ids[0] and cmp.stream == "mean" and cmp.view == "tokens"
    page = cmp.html
    assert pipe.model_label in page  # every view says which model and weights made it
    assert "<script" not in page.lower()
    check_offline_html(page, "widget html")
    assert "prompt A" in cmp.panels["A"] and "prompt B" in cmp.panels["B"]
    assert "ev-tok" in cmp.panels["A"]  # the token-coloured text of plots.token_html
    assert set(cmp.traces) == {"A", "B"}
    assert cmp.traces["A"].texts == [A]


def test_gates_match_a_direct_pipeline_run(cmp, pipe):
    direct = pipe.run([A, B])
    for k, slot in enumerate("AB"):
        n = int(direct.lengths[k])
        # equal up to float rounding: the widget may run its forward on another number of threads
        np.testing.assert_allclose(cmp.results[slot].gates, direct.gates[k, :n].numpy(), rtol=0, atol=1e-6)


def test_difference_is_b_minus_a_and_causal(cmp, pipe):
    diff = cmp.difference
    assert {
        "compare",
        "pair",
        "kind",
        "position_a",
        "position_b",
        "layer",
        "stream",
        "gate_a",
        "gate_b",
        "diff",
    } <= set(diff.columns)
    np.testing.assert_allclose(diff["diff"], diff["gate_b"] - diff["gate_a"])
    a, b = cmp.results["A"], cmp.results["B"]
    first = _first_diff(a.input_ids, b.input_ids)
    before = diff[(diff["position_b"] < first) & (diff["position_b"] >= 0)]
    # a gate never depends on later tokens (equal up to float rounding: the two rows of one batch
    # may take different matmul tile paths)
    assert len(before) and (before["diff"].abs() < 1e-6).all()
    changed = diff[diff["position_b"] == first]
    assert (changed["kind"] == "replace").all() and (changed["diff"].abs() > 0).any()
    if pipe.streams_mode == "embedding":  # a gate reads its own token's stream and <= 4-token n-grams
        far = diff[diff["position_b"] >= first + 4]
        assert len(far) and (far["diff"].abs() < 1e-6).all()
    summary = cmp.summaries["diff B-A"]
    assert summary["aligned"] == len(a.input_ids) == len(b.input_ids)
    assert summary["replace"] >= 1 and summary["insert"] == summary["delete"] == 0
    assert summary["changed"] >= 1 and summary["max_abs_diff"] > 0


def test_identical_prompts_differ_nowhere(cmp):
    cmp.set_prompts(A, A)
    assert (cmp.difference["diff"] == 0).all()  # one cached run serves both boxes
    assert cmp.summaries["diff B-A"]["changed"] == 0
    assert cmp.summaries["diff B-A"]["scale"] == pytest.approx(0.05)


def test_insertions_and_deletions_are_marked(cmp):
    cmp.set_prompts("The cat sat on the mat.", "The cat sat on the red mat today.")
    diff = cmp.difference
    inserted = diff[diff["kind"] == "insert"]
    assert len(inserted) and inserted["diff"].isna().all() and (inserted["position_a"] == -1).all()
    assert cmp.summaries["diff B-A"]["insert"] == inserted["pair"].nunique()
    assert "ev-ins" in cmp.panels["diff B-A"]
    cmp.set_prompts("The cat sat on the red mat.", "The cat sat on the mat.")
    assert "ev-del" in cmp.panels["diff B-A"] and cmp.summaries["diff B-A"]["delete"] >= 1


def test_layer_stream_view_and_theme_switch_without_rerunning(cmp, pipe, monkeypatch):
    calls = []
    real = pipe.run
    monkeypatch.setattr(pipe, "run", lambda *a, **k: calls.append(1) or real(*a, **k))
    before = cmp.html
    cmp.layer = pipe.layer_ids[-1]
    assert f"layer {pipe.layer_ids[-1]}" in cmp.panels["A"] and cmp.html != before
    cmp.stream = 0
    assert "stream 0" in cmp.panels["A"]
    cmp.stream = "max"
    assert "max of streams" in cmp.panels["A"]
    cmp.theme = "dark"
    assert "#16181d" in cmp.panels["A"]  # the dark theme's background
    cmp.view = "all gates"
    assert "all gates" in cmp.panels["A"]
    assert calls == []  # nothing reran: only redrawn
    cmp.set_prompts(A, B + " And more.")
    assert len(calls) == 1  # only the edited prompt ran (A was cached)
    with pytest.raises(ValueError, match="Engram layer"):
        cmp.layer = 999
    with pytest.raises(ValueError, match="stream"):
        cmp.stream = pipe.config.hc_mult
    with pytest.raises(ValueError, match="view"):
        cmp.view = "bars"
    with pytest.raises(ValueError, match="theme"):
        cmp.theme = "sepia"


def test_all_gates_view_shows_every_layer_and_stream_per_token(cmp, pipe):
    cmp.view = "all gates"
    a = cmp.results["A"]
    panel = cmp.panels["A"]
    n_layers, hc = len(pipe.layer_ids), pipe.config.hc_mult
    n_cells = int((~np.asarray(a.is_image)).sum()) + len(image_spans(a.is_image))  # an image span is one cell
    assert panel.count('class="ev-cell"') == n_cells
    cells = panel.count("display:inline-block;width:9px;height:9px")
    assert cells == n_cells * n_layers * hc
    for layer in pipe.layer_ids:
        assert f"layer {layer}: s0 " in panel
    # the difference view shows all layers x streams too
    assert "all layers x streams" in cmp.panels["diff B-A"]


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "empty"),
        ("x" * 100_000, "100,000 characters"),
        ("broken \ud83d text", "lone surrogate"),
        (b"caf\xe9", "not valid UTF-8"),
        ("A picture <image:40x40> here", "1600 image tokens"),
        ("an unterminated <image:16x12", "unterminated image placeholder"),
    ],
)
def test_bad_prompt_shows_a_message_and_the_app_keeps_working(cmp, bad, says):
    cmp.set_prompts(bad, B)
    assert cmp.messages["A"] is not None and says in cmp.messages["A"]
    assert cmp.messages["B"] is None
    assert "ev-message" in cmp.panels["A"] and "ev-tok" in cmp.panels["B"]
    assert "fix prompt A" in cmp.panels["diff B-A"]
    assert cmp.difference.empty
    assert "<script" not in cmp.html.lower()
    cmp.set_prompts(A, B)  # and it recovers
    assert cmp.messages == {"A": None, "B": None} and "ev-tok" in cmp.panels["diff B-A"]


def test_too_many_tokens_is_a_message(pipe):
    cmp = PromptComparison((A, B), pipeline=pipe, max_tokens=64)
    cmp.set_prompts(A, "<image:31x31>")  # 31 * 32 + 2 positions (a span within the model's cap of 1,024) + BOS
    assert "995 tokens" in cmp.messages["B"] and "at most 64" in cmp.messages["B"]
    assert cmp.messages["A"] is None


def test_typing_in_a_box_updates_live(cmp):
    n = cmp.n_updates
    cmp.widget.prompts = [A, "Only Alexander the Great could ride the horse Bucephalus."]  # as the browser sends it
    assert cmp.n_updates == n + 1
    assert cmp.prompts[1].endswith("ride the horse Bucephalus.")
    assert "ride" in cmp.panels["B"]
    # editing a box that was set from bytes checks the new text, not the old bytes
    cmp.set_prompts(A, b"caf\xe9")
    assert cmp.messages["B"] is not None
    cmp.widget.prompts = [cmp.prompts[0], "cafe"]
    assert cmp.messages["B"] is None


def test_insert_image_adds_a_span_with_shut_gates(cmp, pipe):
    assert cmp.insert_image("B", "4x3") == "<image:4x3>"
    assert cmp.prompts[1].endswith("<image:4x3> ")
    res = cmp.results["B"]
    assert res.is_image.sum() == 3 * (4 + 1) + 2
    assert (res.gates[res.is_image] == 0).all()
    assert "[image \u00d717]" in cmp.panels["B"]
    assert cmp.insert_image("A", "640x480px") == "<image:640x480px>"
    assert cmp.messages["A"] is None and cmp.results["A"].is_image.any()
    before = cmp.prompts
    assert cmp.insert_image("A", "50x50") is None  # over the limit: nothing inserted
    assert cmp.prompts == before
    assert "2500 image tokens" in cmp.widget.image_info
    with pytest.raises(ValueError, match="slot"):
        cmp.insert_image("Z", "4x3")


def test_three_prompts_each_compared_with_a(cmp):
    cmp.add_prompt("Only Alexander the Great could tame the wild horse Bucephalus.")
    assert cmp.slots == ["A", "B", "C"]
    assert {"C", "diff C-A"} <= set(cmp.panels)
    assert set(cmp.difference["compare"]) == {"B-A", "C-A"}
    cmp.set_prompts(A, B)
    assert cmp.slots == ["A", "B"] and "diff C-A" not in cmp.panels
    with pytest.raises(ValueError, match="at least 2"):
        cmp.set_prompts(A)


def test_figures_of_the_current_state(cmp):
    import plotly.graph_objects as go
    from matplotlib.figure import Figure

    from engram_viz.viz import TokenView

    figs = cmp.figures
    assert {"tokens", "gates A", "gates B", "diff B-A", "diff B-A (paper)"} <= set(figs)
    assert isinstance(figs["tokens"], TokenView)
    assert isinstance(figs["gates A"], go.Figure) and isinstance(figs["diff B-A"], go.Figure)
    assert isinstance(figs["diff B-A (paper)"], Figure)
    assert cmp.figures is figs  # built once per state
    page = figs["tokens"].html()
    assert "A \u00b7 layer" in page and "B \u00b7 layer" in page and "<script" not in page
    z = np.array(figs["diff B-A"].data[0].z, dtype=float)
    diff = cmp.difference
    assert np.nanmax(np.abs(z)) == pytest.approx(diff["diff"].abs().max())
    cmp.stream = 1
    assert cmp.figures is not figs  # rebuilt after an update


def test_widget_and_notebook_display(cmp):
    from engram_viz.apps.gate_view import GateView

    assert isinstance(cmp.widget, GateView)
    bundle = cmp._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert "text/html" in bundle and "PromptComparison(" in bundle["text/plain"]


def test_gates_frame_uses_slot_names(cmp):
    frame = cmp.gates_frame()
    assert set(frame["prompt"]) == {"A", "B"}
    assert isinstance(frame, pd.DataFrame) and not math.isnan(frame["gate"].sum())


def test_difference_view_collapses_image_spans(cmp):
    cmp.set_prompts("A photo <image:4x3> of a cat.", "A photo <image:4x3> of a dog.")
    panel = cmp.panels["diff B-A"]
    assert panel.count('class="ev-img"') == 1 and "[image \u00d717]" in panel
    assert "&lt;img" not in panel.split("ev-img", 1)[1].split("</span>", 1)[1][:200]
    assert cmp.summaries["diff B-A"]["aligned"] == len(cmp.results["B"].input_ids)
