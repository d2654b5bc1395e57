"""Attribution plots on hand-made frames (no model): they draw into given axes or a figure of
their own, return their axes either way, and name what is missing."""

from __future__ import annotations

import itertools

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from engram_viz.analysis.explain.explanation import GROUP_COLUMNS
from engram_viz.viz.attribution_plots import attribution_bars, attribution_bars_interactive, order_profile_plot

pytestmark = pytest.mark.unit


def _groups() -> pd.DataFrame:
    recs = []
    for kind, groups in (("order", (2, 3, 4)), ("head", range(8))):
        for g, s in itertools.product(groups, range(4)):
            shapley = 0.1 * g if kind == "order" else float("nan")
            recs.append(("p", 3, " Great", 1, kind, g, s, 0.7, 0.2 * g - s, 1.0, 0.5, 0.6, shapley))
    return pd.DataFrame(recs, columns=list(GROUP_COLUMNS))


def test_bars_draw_into_given_axes_and_into_a_figure_of_their_own():
    _fig, axes = plt.subplots(1, 2)
    assert list(attribution_bars(_groups(), 3, ax=axes)) == list(axes)
    assert len(axes[0].patches) == 3 * 4 and len(axes[1].patches) == 8 * 4
    (made,) = attribution_bars(_groups(), value="shapley")  # one panel: an array of one Axes
    assert len(made.figure.axes) == 1 and len(made.patches) == 3 * 4
    plt.close("all")


def test_bars_errors():
    with pytest.raises(ValueError, match="no attribution for position 9"):
        attribution_bars(_groups(), 9)
    with pytest.raises(ValueError, match="unknown"):
        attribution_bars(_groups(), value="nope")


def test_order_profile_plot_and_plotly():
    profile = pd.DataFrame(
        [("p", i, c, 1, o, 0.1 * o) for i, c in enumerate(["entity", "function"]) for o in (2, 3, 4)],
        columns=["prompt", "position", "token_class", "layer", "order", "shapley"],
    )
    ax = plt.subplots()[1]
    assert order_profile_plot(profile, ax=ax) is ax and len(ax.patches) == 6
    pytest.importorskip("plotly")
    fig = attribution_bars_interactive(_groups(), 3)
    assert len(fig.data) == 8
    plt.close("all")
