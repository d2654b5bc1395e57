"""matplotlib figures of counterfactual row edits: the loss per token under an ablation, and the
gate change a shared row makes against the number of colliding heads.

Each takes the frame its analysis gives first (``analysis.edits.localisation.Localisation.loss``,
``analysis.interference.collision_interference``'s orders frame), draws into ``ax`` when given
or into a new themed figure, and returns its Axes either way (``ax.figure`` is the figure).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from engram_viz.errors import FrameError
from engram_viz.viz.figure_axes import drawn, plot_axes, token_ticks
from engram_viz.viz.frames import require_columns
from engram_viz.viz.style import Theme

LOSS_COLUMNS = ("prompt", "position", "next_token", "loss")
INTERFERENCE_COLUMNS = ("layer", "order", "n_colliding", "d_gate")
SERIES = {"loss_ablated": "entity rows ablated", "loss_engram_off": "Engram off (all gates 0)"}


def loss_change_by_token(
    loss: pd.DataFrame,
    prompt: str,
    *,
    series: Sequence[str] = ("loss_ablated", "loss_engram_off"),
    highlight: Sequence[int] = (),
    ax: Axes | None = None,
    theme: str | Theme = "light",
    width: float = 7.0,
    title: str | None = None,
) -> Axes:
    """Change in next-token loss (nats) at every position of ``prompt``, one bar series per column of
    ``series`` (minus ``loss``); x labels are the predicted tokens; ``highlight`` positions (e.g. the
    entity continuation) get a shaded band. loss: prompt, position, next_token, loss and ``series``.
    Returns the Axes."""
    require_columns(loss, (*LOSS_COLUMNS, *series), "loss")
    at = loss[loss["prompt"] == prompt].sort_values("position")
    if at.empty:
        raise FrameError(f"prompt {prompt!r} not in the loss frame; it has {sorted(set(loss['prompt']))}")

    with plot_axes(ax, theme, (width, 2.6), 1, lambda fig: fig.subplots()) as (_fig, t, axes):
        panel = axes[0]
        x = np.arange(len(at))
        w = 0.8 / max(len(series), 1)
        for i, col in enumerate(series):
            panel.bar(
                x + (i - (len(series) - 1) / 2) * w,
                at[col] - at["loss"],
                width=w,
                color=t.palette[i % len(t.palette)],
                label=SERIES.get(col, col),
            )
        where = at["position"].to_numpy()
        for j in np.flatnonzero(np.isin(where, list(highlight))):
            panel.axvspan(j - 0.5, j + 0.5, color=t.muted, alpha=0.15, lw=0)
        panel.axhline(0, color=t.foreground, lw=0.6)
        token_ticks(panel, list(at["next_token"]))
        panel.set_ylabel("\u0394 loss (nats)")
        panel.set_xlabel("predicted token", fontsize=7)
        panel.set_title(title or f"next-token loss change, prompt {prompt!r}", loc="left")
        panel.legend(fontsize=7, loc="upper left")
    return drawn(panel, ax, loss)


def gate_change_vs_colliding_heads(
    orders: pd.DataFrame,
    *,
    layer: int | None = None,
    ax: Axes | None = None,
    theme: str | Theme = "light",
    width: float = 4.5,
) -> Axes:
    """Mean ``|gate change|`` over the streams when an order's colliding heads (their rows shared with
    other corpus n-grams) are taken out, against how many of its heads collide: one dot per
    (position, order), jittered, and the mean per count. orders: layer, order, n_colliding, d_gate.
    Returns the Axes."""
    require_columns(orders, INTERFERENCE_COLUMNS, "orders")
    at = orders if layer is None else orders[orders["layer"] == layer]
    if at.empty:
        raise FrameError(f"no rows for layer {layer}; the frame has layers {sorted(set(orders['layer']))}")
    rng = np.random.default_rng(0)

    with plot_axes(ax, theme, (width, 3.0), 1, lambda fig: fig.subplots()) as (_fig, t, axes):
        panel = axes[0]
        for i, (order, g) in enumerate(at.groupby("order")):
            x = g["n_colliding"].to_numpy(float) + (i - 1) * 0.18 + rng.uniform(-0.06, 0.06, len(g))
            panel.scatter(x, g["d_gate"], s=6, alpha=0.45, color=t.palette[i % len(t.palette)], label=f"{order}-gram")
        mean = at.groupby("n_colliding")["d_gate"].mean()
        panel.plot(mean.index, mean.to_numpy(), color=t.foreground, marker="o", ms=3, lw=1.2, label="mean")
        panel.set_xlabel("heads of the order in a collision bucket")
        panel.set_ylabel("|\u0394 gate| with them out")
        panel.set_title("what shared rows do to a gate" + (f", layer {layer}" if layer is not None else ""), loc="left")
        panel.legend(fontsize=7)
        panel.grid(axis="y")
        panel.set_axisbelow(True)
    return drawn(panel, ax, orders)
