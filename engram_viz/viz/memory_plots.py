"""The gate-versus-memory figure: mean gate per memory group, and gate against training count.

Inputs are the tables of :mod:`engram_viz.analysis.gates.gate_memory`: the summary (layer, group,
n, mean_gate, ...) and the curve (layer, count_bin, n, mean_gate) with its Spearman per layer.
Draws into ``ax`` (two Axes) when given, else into a new themed figure; returns its two Axes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from engram_viz.viz.figure_axes import AxesArg, drawn, plot_axes
from engram_viz.viz.style import Theme

GROUP_LABELS = {"often": "seen >= 20x", "seldom": "seen 1-19x", "never": "never seen", "random": "random tokens"}


def gate_vs_memory(
    summary: pd.DataFrame,
    curve: pd.DataFrame,
    rho: dict[int, float],
    *,
    ax: AxesArg = None,
    theme: str | Theme = "light",
) -> np.ndarray | AxesArg:
    """Left: mean gate (over streams) per memory group, one bar per Engram layer. Right: mean gate
    per bin of the position's training n-gram count, one line per layer with the 95% interval of
    each mean, the bin's positions (n) under its label, Spearman in the legend; empty bins left off.
    Returns the panels: an array of the two Axes (left, right; the given ``ax`` as given)."""
    layers = sorted(int(x) for x in pd.unique(summary["layer"]))
    groups = [g for g in GROUP_LABELS if g in set(summary["group"].astype(str))]

    def make(fig: Figure):
        return fig.subplots(1, 2, gridspec_kw={"width_ratios": [1, 1.3]})

    with plot_axes(ax, theme, (9.0, 3.2), 2, make) as (_fig, t, (left, right)):
        width = 0.8 / max(1, len(layers))
        for i, layer in enumerate(layers):
            s = summary[summary["layer"] == layer].set_index(summary["group"].astype(str)[summary["layer"] == layer])
            vals = [float(s.loc[g, "mean_gate"]) if g in s.index else np.nan for g in groups]
            x = np.arange(len(groups)) + (i - (len(layers) - 1) / 2) * width
            left.bar(x, vals, width, color=t.palette[i % len(t.palette)], label=f"layer {layer}")
        left.set_xticks(range(len(groups)), [GROUP_LABELS[g] for g in groups], rotation=20, ha="right")
        left.set_ylim(0, 1)
        left.set_ylabel("mean gate")
        left.set_title("gate by memory group", loc="left")
        left.grid(axis="y")
        left.set_axisbelow(True)
        left.legend(fontsize=7)
        bins = list(curve["count_bin"].cat.categories) if hasattr(curve["count_bin"], "cat") else []
        bins = bins or list(pd.unique(curve["count_bin"]))
        bins = [b for b in bins if (curve["count_bin"] == b).any()]  # an empty bin has no point to draw
        for i, layer in enumerate(layers):
            c = curve[curve["layer"] == layer]
            xs = np.array([bins.index(b) for b in c["count_bin"]]) + (i - (len(layers) - 1) / 2) * 0.08
            colour = t.palette[i % len(t.palette)]
            label = f"layer {layer} (Spearman {rho.get(layer, float('nan')):.2f})"
            right.plot(xs, c["mean_gate"], "o-", ms=3, color=colour, label=label)
            if {"ci_low", "ci_high"} <= set(c.columns):  # the 95% interval of each bin's mean
                right.vlines(xs, c["ci_low"], c["ci_high"], color=colour, linewidth=1.0, alpha=0.7)
        n = curve.groupby("count_bin", observed=True)["n"].max()
        right.set_xticks(range(len(bins)), [f"{b}\nn={int(n[b]):,}" for b in bins], fontsize=7)
        right.set_xlabel("times the model read the position's trigram in training")
        right.set_ylim(0, 1)
        right.set_title("gate vs training count", loc="left")
        right.grid(alpha=0.3)
        right.legend(fontsize=7)
    return drawn([left, right], ax, summary)
