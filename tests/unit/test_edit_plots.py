"""engram_viz.viz.edit_plots on hand-made frames: data first, draws into a given Axes or a new
figure and returns the Axes either way; missing columns and unknown prompts are named."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engram_viz.viz.edit_plots import gate_change_vs_colliding_heads, loss_change_by_token

LOSS = pd.DataFrame(
    {
        "prompt": "entity",
        "position": [0, 1, 2],
        "next_token": ["a", " b", " c"],
        "loss": [1.0, 2.0, 3.0],
        "loss_ablated": [1.0, 4.0, 3.5],
        "loss_engram_off": [1.5, 3.0, 3.0],
    }
)
ORDERS = pd.DataFrame({"layer": 1, "order": [2, 2, 3, 4], "n_colliding": [0, 3, 3, 8], "d_gate": [0.0, 0.1, 0.2, 0.3]})


def test_loss_change_by_token():
    _fig, ax = plt.subplots()
    assert loss_change_by_token(LOSS, "entity", highlight=[1], ax=ax) is ax
    bars = [p.get_height() for p in ax.patches if p.get_width() < 0.5]
    assert sorted(bars) == sorted([0.0, 2.0, 0.5, 0.5, 1.0, 0.0])
    made = loss_change_by_token(LOSS, "entity")
    assert isinstance(made, Axes) and isinstance(made.figure, Figure) and made is not ax
    with pytest.raises(ValueError, match="nope"):
        loss_change_by_token(LOSS, "nope")
    with pytest.raises(ValueError, match="loss_ablated"):
        loss_change_by_token(LOSS.drop(columns="loss_ablated"), "entity")
    plt.close("all")


def test_gate_change_vs_colliding_heads():
    _fig, ax = plt.subplots()
    assert gate_change_vs_colliding_heads(ORDERS, ax=ax) is ax
    mean_line = ax.lines[-1]
    assert list(mean_line.get_xdata()) == [0, 3, 8]
    assert list(mean_line.get_ydata()) == pytest.approx([0.0, 0.15, 0.3])
    made = gate_change_vs_colliding_heads(ORDERS, layer=1)
    assert isinstance(made, Axes) and isinstance(made.figure, Figure) and made is not ax
    with pytest.raises(ValueError, match="layer 5"):
        gate_change_vs_colliding_heads(ORDERS, layer=5)
    plt.close("all")
