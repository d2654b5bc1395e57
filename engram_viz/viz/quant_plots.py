"""The quantisation figure: quality against bits per weight, one point per candidate table.

Input is ``analysis.quant.study.QuantStudy.summary`` (candidate, bits_per_weight, table_gb, kl,
gate_change_p99, ...). Left: KL divergence of the next-token distribution from the reference's
(nats, log scale); right: the 99th percentile of the largest gate change per position. Each point
is labelled with its candidate and the size of one V4.1-Flash table stored so (GB). Draws into
``ax`` (two Axes) when given; returns the two Axes.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from engram_viz.viz.figure_axes import AxesArg, drawn, plot_axes
from engram_viz.viz.style import Theme

FLOOR = 1e-9  # KL shown at least this (log axis): the lossless candidates land on it


def quality_vs_bits(summary: pd.DataFrame, *, ax: AxesArg = None, theme: str | Theme = "light") -> np.ndarray | AxesArg:
    """KL (left) and gate change p99 (right) against bits per weight, one labelled point per candidate."""

    def make(fig: Figure):
        return fig.subplots(1, 2)

    with plot_axes(ax, theme, (9.0, 3.4), 2, make) as (_fig, t, (left, right)):
        for i, row in enumerate(summary.itertuples(index=False)):
            color = t.palette[i % len(t.palette)]
            label = f"{row.candidate} ({row.table_gb:.0f} GB)"
            for panel, y in ((left, max(float(row.kl), FLOOR)), (right, float(row.gate_change_p99))):
                panel.plot([row.bits_per_weight], [y], "o", color=color, label=label)
                panel.annotate(
                    str(row.candidate), (row.bits_per_weight, y), fontsize=7, xytext=(4, 3), textcoords="offset points"
                )
        left.set_yscale("log")
        left.set_ylabel("KL from the fp8 table (nats / token)")
        right.set_ylabel("gate change, p99 of max over streams")
        for panel in (left, right):
            panel.set_xlabel("bits per weight (one V4.1-Flash table: GB in the legend)")
            panel.grid(True)
            panel.set_axisbelow(True)
        left.set_title("next-token KL", loc="left")
        right.set_title("gate change", loc="left")
        right.legend(fontsize=7)
    return drawn(np.array([left, right], dtype=object), ax, summary)
