"""The comparison widget's 'explain a token' section (apps/widget_explain.py) on the embedded
default, driven from Python: a token's 24 rows with decoded n-grams and shares of the gate, one
row ablated through the row-edit overlay, the difference view reporting the change. Numbers are
the model's own, never pinned: the ablated run's gate equals the explanation's left-out gate."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.apps.widget import PromptComparison
from engram_viz.apps.widget_explain import ROW_VIEW_COLUMNS

pytestmark = pytest.mark.integration
pytest.importorskip("ipywidgets")


@pytest.fixture(scope="module")
def cmp():
    return PromptComparison()


def test_pick_a_token_see_its_rows_ablate_one(cmp):
    e = cmp.explainer
    assert e.position.value is None and "pick a token" in e.rows_html.value
    a = cmp.results["A"]
    pos = 3
    e.select(pos)
    rows = e.rows_frame()
    assert list(rows.columns) == list(ROW_VIEW_COLUMNS) and len(rows) == cmp.pipeline.config.n_hash_cols
    assert all(a.pieces[pos].strip().lower() in g.lower() for g in rows["ngram"])  # the n-grams end at the token
    li = cmp.layer_ids.index(cmp.layer)
    assert rows["gate"].iloc[0] == pytest.approx(float(a.gates[pos, li].mean()), abs=1e-6)
    assert rows["share"].sum() == pytest.approx(1.0, abs=0.05)  # shares of dot, up to the key's rounding
    assert e.rows_html.value.count('class="ev-row"') == len(rows) and len(e.row.options) == len(rows)

    col = int(rows["share"].abs().idxmax())
    summary = e.ablate(int(rows["column"].iloc[col]))
    assert summary["changed"] >= 1 and summary["max_abs_diff"] > 0
    assert "zeroed" in e.diff_html.value and "aligned tokens" in e.diff_html.value
    # the ablated run at that position and layer is the left-out gate of the explanation (exact, per stream mean)
    got = float(e.edited.gates[pos, li].mean())
    assert got == pytest.approx(float(rows["loo_gate"].iloc[col]), abs=2e-3)
    # the comparison's own results are untouched by the overlay
    assert np.array_equal(cmp.results["A"].gates, a.gates)
    cmp.stream = 0  # a new stream redraws rows and difference
    assert "stream 0" in e.rows_html.value and e.summary is not None
    e.restore()
    assert e.diff_html.value == "" and e.ablated is None


def test_a_new_prompt_a_resets_and_a_bad_one_says_so(cmp):
    e = cmp.explainer
    cmp.set_prompts("The Great Wall of China.", "The Small Wall of China.")
    assert e.position.value is None and e.ablated is None
    with pytest.raises(ValueError, match="not a text token"):
        e.select(10_000)
    cmp.set_prompts("", "The Small Wall of China.")
    assert "fix prompt A" in e.rows_html.value and e.position.options[1:] == ()
