"""matplotlib figure of a real picture beside its placeholder twin: the gate difference per text position.

Takes the frame of :func:`engram_viz.analysis.gates.picture_twin.prompt_vs_placeholder` (or
``picture_twins``): prompt, position, k_after_image, token, layer, stream, difference. One panel per
Engram layer; x: the text positions after the picture (their tokens), y: gate of the prompt with the
picture minus gate of its placeholder twin, one thin line per stream and the mean over streams bold.
Draws into ``ax`` when given, else into a new themed figure, and returns its Axes either way.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engram_viz.viz.figure_axes import AxesArg, drawn, legend, plot_axes, token_ticks
from engram_viz.viz.frames import pick_layers, pick_one, require_columns
from engram_viz.viz.style import Theme

PICTURE_TWIN_COLUMNS = ["prompt", "position", "token", "layer", "stream", "difference"]


def picture_twin_plot(
    twins: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Gate difference (picture - placeholder twin) of each text position after the picture of
    ``prompt`` (the frame's only prompt when None), one panel per layer (all when None)."""
    require_columns(twins, PICTURE_TWIN_COLUMNS, "picture twins")
    prompt = pick_one(twins, "prompt", prompt, "picture twins")
    sel = twins[twins["prompt"] == prompt]
    layers = pick_layers(sel, layer, "picture twins")

    def make(fig: Figure):
        return fig.subplots(len(layers), 1, squeeze=False, sharex=True)[:, 0]

    with plot_axes(ax, theme, (width, 1.2 + 1.6 * len(layers)), len(layers), make) as (fig, t, axes):
        handles, labels = [], []
        for panel, lay in zip(axes, layers):
            table = sel[sel["layer"] == lay].pivot_table(index="position", columns="stream", values="difference")
            x = np.arange(len(table))
            panel.axhline(0, color=t.grid, linewidth=1)
            for k, stream in enumerate(table.columns):
                (h,) = panel.plot(x, table[stream], color=t.palette[k % len(t.palette)], linewidth=0.8, alpha=0.7)
                if lay == layers[0]:
                    handles.append(h)
                    labels.append(f"stream {stream}")
            (h,) = panel.plot(x, table.mean(axis=1), color=t.foreground, linewidth=1.8, marker="o", markersize=2.5)
            if lay == layers[0]:
                handles.append(h)
                labels.append("mean of streams")
            panel.set_title(f"layer {lay}", loc="left")
            panel.set_ylabel("gate picture - twin")
        tokens = sel[sel["layer"] == layers[0]].drop_duplicates("position").sort_values("position")["token"]
        token_ticks(axes[-1], list(tokens))
        axes[-1].set_xlabel(f"text after the picture ({prompt})")
        legend(fig, axes, ax is None, handles, labels, ncols=min(len(labels), 5))
    return drawn(axes[0] if len(axes) == 1 else np.asarray(axes, dtype=object), ax, sel)
