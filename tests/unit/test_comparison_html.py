"""The comparison's HTML views on hand-made prompts (no model): the difference view marks replaced,
inserted and deleted tokens, collapses image spans and sums up what changed."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.analysis.gates.comparison import PromptResult, aligned_difference
from engram_viz.viz.comparison_html import DIFF_FLOOR, difference_html, gate_grid_html, message_html

LAYERS = (1, 3)


def _result(ids: list[int], gates: list[float], image: list[bool] | None = None) -> PromptResult:
    """A prompt of len(ids) tokens; gate g of each token on every layer and stream (2 layers x 2 streams)."""
    g = np.repeat(np.asarray(gates, dtype=np.float32)[:, None, None], 2, axis=1).repeat(2, axis=2)
    return PromptResult(
        text="x",
        gates=g,
        input_ids=np.asarray(ids, dtype=np.int64),
        pieces=[f"t{i}" for i in ids],
        is_image=np.asarray(image if image is not None else [False] * len(ids)),
    )


def test_difference_marks_each_kind_and_sums_up():
    a = _result([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4])
    b = _result([1, 9, 3, 5, 6], [0.1, 0.7, 0.3, 0.4, 0.5])  # 2 -> 9 replaced, 4 -> 5 replaced, 6 inserted
    page, summary = difference_html(a, b, LAYERS, layer=3, stream="mean")
    assert summary["aligned"] == 4 and summary["insert"] == 1 and summary["delete"] == 0
    assert summary["changed"] == 1 and summary["max_at"] == (1, 1)
    assert summary["max_abs_diff"] == summary["scale"] == pytest.approx(0.5)
    assert page.count('class="ev-tok"') == 4 and page.count('class="ev-ins"') == 1
    assert "<script" not in page and "largest |diff| 0.500 at B position 1 &#x27;t9&#x27;" in page
    _, summary = difference_html(b, a, LAYERS, layer=1, stream=0, labels=("B", "A"))
    assert summary["delete"] == 1 and summary["insert"] == 0


def test_identical_prompts_keep_the_floor_scale_and_all_gates_grids():
    a = _result([1, 2], [0.1, 0.2])
    page, summary = difference_html(a, a, LAYERS, layer=1, all_gates=True)
    assert summary["changed"] == 0 and summary["scale"] == DIFF_FLOOR and summary["max_at"] is None
    assert page.count('class="ev-cell"') == 2 and "all layers x streams" in page
    d = aligned_difference(a, a, LAYERS, layer=1, all_gates=True)
    assert d.diff.shape == (2, 2, 2) and d.counts()["equal"] == 2


def test_an_image_span_is_one_chip():
    a = _result([1, 7, 7, 2], [0.1, 0.0, 0.0, 0.2], [False, True, True, False])
    b = _result([1, 7, 7, 7, 2], [0.1, 0.0, 0.0, 0.0, 0.6], [False, True, True, True, False])  # one image token more
    page, summary = difference_html(a, b, LAYERS, layer=1)
    assert page.count('class="ev-img"') == 1 and "[image \u00d73]" in page
    assert summary["changed"] == 1


def test_an_image_span_only_in_a_is_one_chip_not_struck_tokens():
    a = _result([1, *[7] * 56, 2], [0.1, *[0.0] * 56, 0.2], [False, *[True] * 56, False])
    b = _result([1, 2], [0.1, 0.3])
    page, summary = difference_html(a, b, LAYERS, layer=1)
    assert page.count('class="ev-img"') == 1 and "[image \u00d756]" in page and 'class="ev-del"' not in page
    assert "image span (only in A): A positions 1-56 (56 tokens)" in page
    assert summary["delete"] == 56 and summary["changed"] == 1


def test_gate_grid_and_message_boxes():
    a = _result([1, 7, 7, 7], [0.5, 0.0, 0.0, 0.0], [False, True, True, True])
    grid = gate_grid_html(a, LAYERS, label="prompt A - all gates")
    assert grid.count('class="ev-cell"') == 2 and "layer 3: s0 0.500" in grid  # the image span is one cell
    assert "[image \u00d73]" in grid and "image span: positions 1-3 (3 tokens)" in grid
    assert 'class="ev-message"' in message_html("prompt A is empty <b>", title="prompt A")
    assert "&lt;b&gt;" in message_html("<b>")
