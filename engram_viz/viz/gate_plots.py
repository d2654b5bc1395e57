"""matplotlib figures of gates: the stream x position heatmap, distributions per group, collision
exposure beside the gates, and the gate difference of two prompts.

Every function takes a tidy frame first (columns as ``Trace.to_frame("gates")`` and
``analysis.gates.comparison`` give them; see ``frames``), draws into ``ax`` when given or into a new
pyplot-free themed figure, returns its Axes either way (``ax.figure`` is the figure) and leaves saving
to ``engram_viz.viz.export``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from engram_viz.errors import FrameError
from engram_viz.viz.figure_axes import AxesArg, drawn, heatmap_width, legend, plot_axes, token_ticks
from engram_viz.viz.frames import (
    GATE_COLUMNS,
    gate_table,
    pick_layers,
    pick_one,
    reduce_streams,
    require_columns,
    stream_columns,
)
from engram_viz.viz.style import Theme
from engram_viz.viz.token_labels import token_label

DIFF_COLUMNS = ("pair", "kind", "token_a", "token_b", "layer", "stream", "diff")


def _gate_rows(
    gates: pd.DataFrame, prompt, layers: Sequence[int]
) -> tuple[np.ndarray, list[str], list[str], np.ndarray]:
    """``[layers * streams, T]`` gates with NaN at image positions, row labels, tokens, image mask."""
    blocks, labels, tokens, image = [], [], None, None
    for layer in layers:
        table = gate_table(gates, prompt, layer)
        if tokens is None:
            tokens, image = table["token"].tolist(), table["is_image"].to_numpy()
        elif len(table) != len(tokens):
            raise FrameError(f"prompt {prompt!r} has {len(table)} positions at layer {layer} but {len(tokens)} before")
        streams = stream_columns(table)
        values = np.array(table[streams], dtype=float).T
        values[:, image] = np.nan
        blocks.append(values)
        labels += [f"L{layer} s{int(s)}" for s in streams]
    return np.vstack(blocks), labels, tokens, image


def gate_heatmap(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    ax: Axes | None = None,
    theme: str | Theme = "light",
    width: float | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> Axes:
    """Stream x position heatmap of one prompt's gates; all layers stacked (all 8 gates on V4.1)
    unless ``layer`` picks some. Image positions are grey. Returns the Axes.

    gates: prompt, position, token, is_image, layer, stream, gate.
    """
    require_columns(gates, GATE_COLUMNS, "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    matrix, labels, tokens, _ = _gate_rows(gates, prompt, layers)
    height = 1.2 + 0.2 * len(labels) + 0.06 * max(len(token_label(s)) for s in tokens)
    size = (heatmap_width(len(tokens), width), min(height, 9.0))
    with plot_axes(ax, theme, size, 1, lambda fig: fig.add_subplot()) as (fig, t, (axes,)):
        im = axes.imshow(
            np.ma.masked_invalid(matrix), aspect="auto", cmap=t.heat_cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
        )
        axes.set_yticks(range(len(labels)), labels)
        n_streams = len(labels) // len(layers)
        for k in range(1, len(layers)):
            axes.axhline(k * n_streams - 0.5, color=t.background, linewidth=2.0)
        token_ticks(axes, tokens)
        axes.set_title(f"{prompt}: gate per stream and position", loc="left")
        for side in ("left", "bottom"):
            axes.spines[side].set_visible(False)
        fig.colorbar(im, ax=axes, label="gate", fraction=0.04, pad=0.01, aspect=15).outline.set_visible(False)
    return drawn(axes, ax, gates)


def _stream_boxes(ax: Axes, at: pd.DataFrame, by: str, groups: list, streams: list[int], t: Theme) -> None:
    """One box per (group, stream) of the gates ``at`` of one layer, streams side by side."""
    w = 0.8 / len(streams)
    for si, stream in enumerate(streams):
        data, pos = [], []
        for gi, group in enumerate(groups):
            vals = at.loc[(at[by] == group) & (at["stream"] == stream), "gate"].to_numpy(dtype=float)
            if len(vals):
                data.append(vals)
                pos.append(gi + (si - (len(streams) - 1) / 2) * w)
        if not data:
            continue
        colour = t.palette[si % len(t.palette)]
        ax.boxplot(
            data,
            positions=pos,
            widths=w * 0.85,
            patch_artist=True,
            showfliers=False,
            boxprops={"facecolor": colour, "edgecolor": colour, "alpha": 0.85},
            medianprops={"color": t.foreground, "linewidth": 1.0},
            whiskerprops={"color": colour},
            capprops={"color": colour},
        )


def gate_distributions(
    gates: pd.DataFrame,
    by: str = "category",
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float | None = None,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Box plots of gates per group of ``by`` (category, prompt, ...), one box per stream, one panel
    per layer (``ax``: one Axes per layer). Image positions are left out (their gates are 0 by
    construction). Returns the panels: an array of Axes, one per layer (the given ``ax`` as given).

    gates: prompt, position, token, is_image, layer, stream, gate, and the ``by`` column.
    """
    require_columns(gates, (*GATE_COLUMNS, by), "gates")
    layers = pick_layers(gates, layer, "gates")
    text = gates[~gates["is_image"].astype(bool)]
    if text.empty:
        raise FrameError("the gates frame holds only image positions; no gates to show")
    groups = list(pd.unique(text[by]))
    streams = sorted(int(s) for s in pd.unique(text["stream"]))
    fig_w = width if width is not None else float(np.clip(1.5 + 0.55 * len(groups) * len(layers), 4.0, 14.0))

    def make(fig: Figure):
        return fig.subplots(1, len(layers), sharey=True, squeeze=False)[0]

    with plot_axes(ax, theme, (fig_w, 2.8), len(layers), make) as (fig, t, axes):
        for panel, lay in zip(axes, layers):
            _stream_boxes(panel, text[text["layer"] == lay], by, groups, streams, t)
            panel.set_xticks(
                range(len(groups)),
                [str(g) for g in groups],
                rotation=30 if len(groups) > 3 else 0,
                ha="right" if len(groups) > 3 else "center",
            )
            panel.set_xlim(-0.6, len(groups) - 0.4)
            panel.set_ylim(0, 1)
            panel.set_title(f"layer {lay}", loc="left")
            panel.grid(axis="y")
            panel.set_axisbelow(True)
        axes[0].set_ylabel("gate")
        handles = [Patch(color=t.palette[i % len(t.palette)], label=f"stream {s}") for i, s in enumerate(streams)]
        legend(fig, axes, ax is None, handles, [h.get_label() for h in handles], len(streams))
        if ax is None:
            fig.suptitle(f"gate distributions by {by} (text positions)", x=0.01, ha="left", fontsize=9.5)
    return drawn(axes, ax, gates)


def _exposure_panels(fig: Figure, top: Axes, bottom: Axes, lay: int, table: pd.DataFrame, t: Theme) -> None:
    """One layer: the stream x position gates in ``top``, each position's exposure as bars below."""
    streams = stream_columns(table)
    image = table["is_image"].to_numpy()
    values = np.array(table[streams], dtype=float).T
    values[:, image] = np.nan
    im = top.imshow(
        np.ma.masked_invalid(values), aspect="auto", cmap=t.heat_cmap, vmin=0, vmax=1, interpolation="nearest"
    )
    top.set_yticks(range(len(streams)), [f"s{int(s)}" for s in streams])
    exposure = table["exposure"].to_numpy(dtype=float)
    colours = [t.image if img else t.palette[1] for img in image]
    bottom.bar(np.arange(len(table)), exposure, width=0.85, color=colours)
    bottom.set_ylim(0, 24)
    bottom.set_yticks([0, 12, 24])
    bottom.set_ylabel("shared\nrows", fontsize=7)
    mean_gate = reduce_streams(table, "mean")[~image]
    r = np.nan
    if (~image).sum() > 2 and np.std(exposure[~image]) > 0 and np.std(mean_gate) > 0:
        r = float(np.corrcoef(exposure[~image], mean_gate)[0, 1])
    top.set_title(f"layer {lay}: gates; collision exposure below (r = {r:.2f})", loc="left")
    bar = fig.colorbar(im, ax=[top, bottom], fraction=0.04, pad=0.01, aspect=12, label="gate")
    bar.outline.set_visible(False)


def exposure_beside_gates(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float | None = None,
) -> np.ndarray | Sequence[Axes]:
    """Per layer, the stream x position gate heatmap above a bar chart of each position's collision
    exposure (0..24 of its rows shared with another n-gram); r is the Pearson correlation of
    exposure with the mean gate over text positions. ``ax``: two Axes per layer (gates, bars).
    Returns the panels: an array of Axes, gates and bars of each layer in turn (the given ``ax``
    as given).

    gates: prompt, position, token, is_image, layer, stream, gate, exposure.
    """
    require_columns(gates, (*GATE_COLUMNS, "exposure"), "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    tables = [gate_table(gates, prompt, lay) for lay in layers]
    tokens = tables[0]["token"].tolist()
    ratios = [r for _ in layers for r in (4, 1.8)]
    height = min(1.0 + 1.5 * len(layers) + 0.06 * max(len(token_label(s)) for s in tokens), 10.0)
    size = (width if width is not None else max(heatmap_width(len(tokens), None), 5.0), height)

    def make(fig: Figure):
        return fig.subplots(2 * len(layers), 1, sharex=True, height_ratios=ratios)

    with plot_axes(ax, theme, size, 2 * len(layers), make) as (fig, t, axes):
        for k, (lay, table) in enumerate(zip(layers, tables)):
            _exposure_panels(fig, axes[2 * k], axes[2 * k + 1], lay, table, t)
        token_ticks(axes[-1], tokens)
        if ax is None:
            fig.suptitle(str(prompt), x=0.01, ha="left", fontsize=9.5)
    return drawn(axes, ax, gates)


def diff_matrix(diff: pd.DataFrame) -> tuple[np.ndarray, list[str], list[str], float]:
    """``[layers * streams, pairs]`` differences (NaN where a side has no partner), row labels,
    x labels (B's token; A's token struck as '-tok' for deletions) and the symmetric scale."""
    require_columns(diff, DIFF_COLUMNS, "difference")
    wide = diff.pivot_table(index=["layer", "stream"], columns="pair", values="diff", aggfunc="first", dropna=False)
    wide = wide.reindex(columns=sorted(pd.unique(diff["pair"])))
    first = diff.drop_duplicates("pair").set_index("pair").loc[wide.columns]
    labels = [
        token_label(tb) if kind != "delete" else "-" + token_label(ta)
        for ta, tb, kind in zip(first["token_a"], first["token_b"], first["kind"])
    ]
    matrix = wide.to_numpy(dtype=float)
    finite = np.abs(matrix[np.isfinite(matrix)])
    scale = max(0.05, float(finite.max()) if finite.size else 0.0)
    rows = [f"L{int(lay)} s{int(s)}" for lay, s in wide.index]
    return matrix, rows, labels, scale


def gate_difference_heatmap(
    diff: pd.DataFrame,
    *,
    ax: Axes | None = None,
    theme: str | Theme = "light",
    width: float | None = None,
    title: str | None = None,
) -> Axes:
    """Gate of prompt B minus prompt A per aligned token (x) and (layer, stream) (y), on a
    diverging, colour-blind-safe map scaled to the largest absolute difference (at least 0.05).
    Tokens only in one prompt are grey; x labels are B's tokens ('-tok' for A's deleted ones).
    Returns the Axes.

    diff: pair, kind, token_a, token_b, layer, stream, diff (``engram_viz.analysis.gates.comparison.gate_difference``).
    """
    matrix, rows, labels, scale = diff_matrix(diff)
    a, b = diff.attrs.get("prompts", ("A", "B"))
    height = 1.2 + 0.2 * len(rows) + 0.06 * max((len(s) for s in labels), default=1)
    size = (heatmap_width(len(labels), width), min(height, 9.0))
    with plot_axes(ax, theme, size, 1, lambda fig: fig.add_subplot()) as (fig, t, (axes,)):
        cmap = colormaps["berlin" if t.name == "dark" and "berlin" in colormaps else "RdBu_r"].with_extremes(
            bad=t.image
        )
        im = axes.imshow(
            np.ma.masked_invalid(matrix), aspect="auto", cmap=cmap, vmin=-scale, vmax=scale, interpolation="nearest"
        )
        axes.set_yticks(range(len(rows)), rows)
        token_ticks(axes, labels)
        axes.set_title(title or f"gate {b} - gate {a} per aligned token (grey: no partner)", loc="left")
        for side in ("left", "bottom"):
            axes.spines[side].set_visible(False)
        bar = fig.colorbar(im, ax=axes, label=f"gate {b} - {a}", fraction=0.04, pad=0.01, aspect=15)
        bar.outline.set_visible(False)
    return drawn(axes, ax, diff)
