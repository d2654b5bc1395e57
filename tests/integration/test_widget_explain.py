"""Explaining a token of the gate view (apps/widget_explain.py) on the embedded default, driven
as the browser drives it (the view's ``selected`` and ``ablate_request`` traits) and from Python:
a token's 24 rows with decoded n-grams and shares of the gate, one row ablated through the row-edit
overlay, the gate change beside the button and the difference view. Numbers are the model's own,
never pinned: the ablated run's gate equals the explanation's left-out gate."""

from __future__ import annotations

import html

import numpy as np
import pytest

from engram_viz.apps.widget import PromptComparison
from engram_viz.apps.widget_explain import ROW_VIEW_COLUMNS
from engram_viz.viz.token_labels import token_label

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cmp():
    return PromptComparison()


def test_click_a_token_see_its_rows_ablate_one(cmp):
    e, w = cmp.explainer, cmp.widget
    assert e.position is None and "click a token" in e.rows_html and w.explanation == {}
    a = cmp.results["A"]
    pos = 3
    w.selected = {"slot": "A", "position": pos}  # a click on token 3 of prompt A
    assert (e.slot, e.position) == ("A", pos)
    rows = e.rows_frame()
    assert list(rows.columns) == list(ROW_VIEW_COLUMNS) and len(rows) == cmp.pipeline.config.n_hash_cols
    assert all(a.pieces[pos].strip().lower() in g.lower() for g in rows["ngram"])  # the n-grams end at the token
    li = cmp.layer_ids.index(cmp.layer)
    assert rows["gate"].iloc[0] == pytest.approx(float(a.gates[pos, li].mean()), abs=1e-6)
    assert rows["share"].sum() == pytest.approx(1.0, abs=0.05)  # shares of dot, up to the key's rounding
    assert e.rows_html.count('class="ev-row"') == len(rows)
    # what the browser draws: every layer's 24 rows, per-stream shares that agree with the table
    sent = w.explanation["layers"][str(cmp.layer)]
    assert len(sent["rows"]) == len(rows) and set(w.explanation["layers"]) == {str(x) for x in cmp.layer_ids}
    shares = np.array([r["share"] for r in sent["rows"]]).mean(axis=1)
    np.testing.assert_allclose(shares, rows["share"].to_numpy(), atol=1e-3)
    np.testing.assert_allclose(sent["gate"], a.gates[pos, li], atol=1e-4)

    col = int(rows["share"].abs().idxmax())
    column = int(rows["column"].iloc[col])
    w.ablate_request = {"slot": "A", "position": pos, "layer": cmp.layer, "column": column, "nonce": "1"}
    summary, answer = e.summary, w.ablation
    assert summary["changed"] >= 1 and summary["max_abs_diff"] > 0
    assert "zeroed" in e.diff_html and "aligned tokens" in e.diff_html and answer["html"] == e.diff_html
    assert (answer["column"], answer["row"], answer["nonce"]) == (column, int(rows["row"].iloc[col]), "1")
    # the ablated run at that position and layer is the left-out gate of the explanation (exact, per stream mean)
    got = float(e.edited.gates[pos, li].mean())
    assert got == pytest.approx(float(rows["loo_gate"].iloc[col]), abs=2e-3)
    assert np.mean(answer["after"]) == pytest.approx(got, abs=1e-4)  # what the view shows beside the button
    assert np.mean(answer["before"]) == pytest.approx(float(a.gates[pos, li].mean()), abs=1e-4)
    # the comparison's own results are untouched by the overlay
    assert np.array_equal(cmp.results["A"].gates, a.gates)
    edited = e.edited
    cmp.stream = 0  # a new stream redraws rows and difference without running again
    assert "stream 0" in e.rows_html and e.summary is not None and e.edited is edited
    w.ablate_request = {"restore": True, "nonce": "2"}
    assert e.diff_html == "" and e.ablated is None and w.ablation == {}


def test_a_new_prompt_resets_and_bad_selections_say_so(cmp):
    e = cmp.explainer
    cmp.set_prompts("The Great Wall of China.", "The Small Wall of China.")
    e.select(2, "B")
    assert cmp.widget.explanation["slot"] == "B"
    cmp.set_prompts("The Great Wall of China.", "The Tall Wall of China.")  # B's text changed: cleared
    assert e.position is None and e.ablated is None and cmp.widget.selected == {}
    with pytest.raises(ValueError, match="not a text token"):
        e.select(10_000)
    cmp.widget.selected = {"slot": "A", "position": 10_000}  # from the browser: a message, not a traceback
    assert "not a text token" in cmp.widget.status
    cmp.set_prompts("", "The Small Wall of China.")
    with pytest.raises(ValueError, match="does not run"):
        e.select(1, "A")


def test_the_rows_header_names_a_special_token_by_its_short_label(cmp):
    cmp.set_prompts("The Great Wall of China.", "The Small Wall of China.")
    a = cmp.results["A"]
    cmp.widget.selected = {"slot": "A", "position": 0}  # BOS
    shown = html.unescape(cmp.explainer.rows_html)
    assert repr(token_label(a.pieces[0])) in shown and a.pieces[0] not in shown
