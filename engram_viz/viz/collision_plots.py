"""matplotlib figures of hash collisions against an ideal uniform hash: colliding buckets per
(order, head) column, and how many heads an n-gram shares its bucket on.

Each takes the frame ``engram_viz.analysis.row_stats.collisions.CollisionStats`` gives (``columns()``,
``heads_shared()``) first, draws into ``ax`` when given (one Axes per panel) or into a new themed
figure, and returns its panels either way (``ax.figure`` is the figure).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engram_viz.viz.figure_axes import AxesArg, column_axis, column_index, drawn, legend, plot_axes
from engram_viz.viz.frames import COLLISION_COLUMNS, HEADS_SHARED_COLUMNS, pick_layers, require_columns
from engram_viz.viz.style import Theme


def collisions_vs_expected(
    collisions: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Observed colliding buckets (bars) against those an ideal uniform hash of the same prime size
    would give (markers), per (n-gram order, head) column, one panel per layer. Returns the panels:
    an array of Axes, one per layer (the given ``ax`` as given).

    collisions: layer, order, head, prime, distinct_ngrams, occupied, shared_buckets,
    expected_occupied, expected_shared_buckets (``CollisionStats.columns()``).
    """
    require_columns(collisions, COLLISION_COLUMNS, "collisions")
    layers = pick_layers(collisions, layer, "collisions")

    with plot_axes(ax, theme, (width, 0.6 + 1.9 * len(layers)), len(layers)) as (fig, t, axes):
        for panel, lay in zip(axes, layers):
            at = collisions[collisions["layer"] == lay].sort_values(["order", "head"])
            x, orders, n_heads = column_index(at)
            panel.bar(x, at["shared_buckets"], width=0.75, color=t.palette[0], label="observed")
            panel.scatter(
                x,
                at["expected_shared_buckets"],
                marker="_",
                s=90,
                linewidths=1.6,
                color=t.foreground,
                zorder=3,
                label="expected (uniform hash)",
            )
            column_axis(panel, orders, n_heads, t)
            obs, exp = int(at["shared_buckets"].sum()), float(at["expected_shared_buckets"].sum())
            distinct = int(at.groupby("order")["distinct_ngrams"].max().sum())  # each n-gram once, not once a head
            panel.set_title(
                f"layer {lay}: {obs:,} colliding buckets observed, {exp:,.1f} expected; {distinct:,} distinct n-grams",
                loc="left",
            )
            panel.set_ylabel("buckets with\n\u2265 2 n-grams", fontsize=7)
            panel.grid(axis="y")
            panel.set_axisbelow(True)
        legend(fig, axes, ax is None, *axes[0].get_legend_handles_labels(), 2)
    return drawn(axes, ax, collisions)


def _sharing_panel(ax: Axes, at: pd.DataFrame, colour, t: Theme) -> None:
    """Bars of observed n-grams per number of shared heads, markers for the uniform hash."""
    at = at.sort_values("heads_shared")
    x = at["heads_shared"].to_numpy()
    ax.bar(x, at["ngrams"].to_numpy(dtype=float), width=0.75, color=colour, label="observed")
    exp = at["expected_ngrams"].to_numpy(dtype=float)
    keep = exp >= 1e-3
    ax.scatter(
        x[keep],
        exp[keep],
        marker="_",
        s=80,
        linewidths=1.5,
        color=t.foreground,
        zorder=3,
        label="expected (uniform hash)",
    )
    ax.set_yscale("log")
    ax.set_ylim(bottom=0.5)
    ax.set_xticks(x)
    ax.grid(axis="y")
    ax.set_axisbelow(True)


def heads_shared_vs_expected(
    heads_shared: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Multi-head sharing: how many distinct n-grams share a bucket on 0, 1, ..., 8 of their heads
    (bars, log scale) against a uniform hash (markers; Poisson-binomial over the heads), one panel
    per (layer, order) (``ax``: one Axes per panel, layer-major). An n-gram's table read is
    ambiguous only on the heads where it shares. Returns the panels: an array of Axes
    ``[layers, orders]`` (the given ``ax`` as given).

    heads_shared: layer, order, heads_shared, ngrams, expected_ngrams (``CollisionStats.heads_shared()``).
    """
    require_columns(heads_shared, HEADS_SHARED_COLUMNS, "heads_shared")
    layers = pick_layers(heads_shared, layer, "heads_shared")
    orders = sorted(int(o) for o in pd.unique(heads_shared["order"]))

    def make(fig: Figure):
        return fig.subplots(len(layers), len(orders), squeeze=False, sharey=True)

    size, n = (width, 0.7 + 1.7 * len(layers)), len(layers) * len(orders)
    with plot_axes(ax, theme, size, n, make) as (fig, t, flat):
        axes = np.asarray(flat, dtype=object).reshape(len(layers), len(orders))
        for r, lay in enumerate(layers):
            for c, order in enumerate(orders):
                at = heads_shared[(heads_shared["layer"] == lay) & (heads_shared["order"] == order)]
                _sharing_panel(axes[r, c], at, t.palette[c % len(t.palette)], t)
                axes[r, c].set_title(f"layer {lay}, {order}-grams", loc="left")
            axes[r, 0].set_ylabel("distinct n-grams")
        if ax is None:
            fig.supxlabel("heads (of 8) on which the n-gram shares its bucket", fontsize=8)
        legend(fig, flat, ax is None, *axes[0, 0].get_legend_handles_labels(), 2, side="upper")  # supxlabel below
    return drawn(axes, ax, heads_shared)
