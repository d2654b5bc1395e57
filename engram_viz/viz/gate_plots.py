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
from engram_viz.viz.figure_axes import AxesArg, drawn, legend, plot_axes
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
from engram_viz.viz.token_heatmap import (
    TICK_PT,
    TITLE_IN,
    WIDTH_IN,
    TokenAxis,
    draw_token_heatmap,
    heatmap_size,
    token_axis,
)
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


def _panel_count(ax: AxesArg, panels: int) -> int:
    """Panels to draw: as many as the prompt needs in a new figure, else as many Axes as given."""
    return panels if ax is None else 1 if isinstance(ax, Axes) else len(list(ax))


def gate_heatmap(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> Axes | np.ndarray | Sequence[Axes]:
    """Stream x position heatmap of one prompt's gates; all layers stacked (all 8 gates on V4.1)
    unless ``layer`` picks some. Cells and fonts have one size on every prompt
    (``viz.token_heatmap``): a long prompt wraps onto further panels below, at most ``width``
    inches wide (default 7); an image span is one grey column. Returns the Axes (the panels, an
    array, when the prompt wraps; ``ax``: one Axes, or a sequence to wrap into).

    gates: prompt, position, token, is_image, layer, stream, gate.
    """
    require_columns(gates, GATE_COLUMNS, "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    matrix, labels, tokens, image = _gate_rows(gates, prompt, layers)
    axis = token_axis(tokens, image)
    size, panels = heatmap_size(len(labels), axis, width)
    n = _panel_count(ax, panels)

    with plot_axes(ax, theme, size, n) as (fig, t, axes):
        draw_token_heatmap(
            fig,
            axes,
            axis.values(matrix),
            labels,
            axis,
            cmap=t.heat_cmap,
            vmin=vmin,
            vmax=vmax,
            t=t,
            group_rows=len(labels) // len(layers),
            colorbar="gate",
        )
        axes[0].set_title(f"{prompt}: gate per stream and position", loc="left")
    return drawn(axes[0] if n == 1 else axes, ax, gates)


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


def _exposure_panels(
    fig: Figure, top: Axes, bottom: Axes, lay: int, table: pd.DataFrame, axis: TokenAxis, t: Theme
) -> None:
    """One layer: the stream x token gates in ``top``, each token's exposure as bars below; when
    exposure is the same at every text position the bars say so in words (nothing to correlate)."""
    streams = stream_columns(table)
    image = table["is_image"].to_numpy()
    values = axis.values(np.array(table[streams], dtype=float).T)
    im = top.imshow(
        np.ma.masked_invalid(values),
        aspect="auto",
        cmap=t.heat_cmap.with_extremes(bad=t.image),
        vmin=0,
        vmax=1,
        interpolation="nearest",
    )
    top.set_yticks(range(len(streams)), [f"s{int(s)}" for s in streams])
    exposure = table["exposure"].to_numpy(dtype=float)
    text_exposure, mean_gate = exposure[~image], reduce_streams(table, "mean")[~image]
    bottom.set_ylim(0, 24)
    bottom.set_yticks([0, 12, 24])
    bottom.set_ylabel("shared\nrows", fontsize=7)
    if len(text_exposure) and np.ptp(text_exposure) == 0:
        top.set_title(f"layer {lay}: gates", loc="left")
        why = "\n(every row shared: a table small against its corpus)" if text_exposure[0] == 24 else ""
        bottom.text(
            0.0,
            0.5,
            f"collision exposure is {int(text_exposure[0])}/24 at every text position: nothing varies{why}",
            transform=bottom.transAxes,
            ha="left",
            va="center",
            fontsize=7,
            color=t.muted,
        )
        bottom.set_yticks([])
        bottom.set_ylabel("")
        for side in ("left", "top", "right"):
            bottom.spines[side].set_visible(False)
    else:
        bar_values = axis.values(exposure[None, :])[0]
        bottom.bar(np.arange(len(axis)), np.nan_to_num(bar_values), width=0.85, color=t.palette[1])
        r = float(np.corrcoef(text_exposure, mean_gate)[0, 1]) if len(mean_gate) > 2 and np.ptp(mean_gate) else None
        shown = "r undefined: the gate is constant" if r is None else f"r = {r:.2f}"
        top.set_title(f"layer {lay}: gates; collision exposure below ({shown})", loc="left")
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
    """Per layer, the stream x token gate heatmap above a bar chart of each token's collision
    exposure (0..24 of its rows shared with another n-gram); r is the Pearson correlation of
    exposure with the mean gate over text positions. Where exposure is the same at every text
    position (a small table against a large corpus: 24/24) the bars give way to a sentence saying
    so. An image span is one grey column. ``ax``: two Axes per layer (gates, bars). Returns the
    panels: an array of Axes, gates and bars of each layer in turn (the given ``ax`` as given).

    gates: prompt, position, token, is_image, layer, stream, gate, exposure.
    """
    require_columns(gates, (*GATE_COLUMNS, "exposure"), "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    tables = [gate_table(gates, prompt, lay) for lay in layers]
    axis = token_axis(tables[0]["token"].tolist(), tables[0]["is_image"].to_numpy())
    ratios = [r for _ in layers for r in (4, 1.8)]
    one, _ = heatmap_size(4, axis, None)
    size = (
        width if width is not None else float(np.clip(one[0], 5.0, WIDTH_IN)),
        TITLE_IN + 1.6 * len(layers) + one[1] - 1.1,
    )

    def make(fig: Figure):
        return fig.subplots(2 * len(layers), 1, sharex=True, height_ratios=ratios)

    with plot_axes(ax, theme, size, 2 * len(layers), make) as (fig, t, axes):
        for k, (lay, table) in enumerate(zip(layers, tables)):
            _exposure_panels(fig, axes[2 * k], axes[2 * k + 1], lay, table, axis, t)
        axes[-1].set_xticks(range(len(axis)), axis.labels, rotation=90, fontsize=TICK_PT)
        for label in axes[-1].get_xticklabels():
            label.set_parse_math(False)
        axes[-1].tick_params(axis="x", length=0, pad=2)
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


def _diff_axis(diff: pd.DataFrame, labels: list[str]) -> TokenAxis:
    """The difference's columns: one per aligned pair, one per run of image pairs (``is_image``)."""
    first = diff.drop_duplicates("pair").sort_values("pair")
    image = first["is_image"].to_numpy(dtype=bool) if "is_image" in first.columns else np.zeros(len(first), bool)
    return token_axis(labels, image)  # the labels are token labels already: shown as they are


def gate_difference_heatmap(
    diff: pd.DataFrame,
    *,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float | None = None,
    title: str | None = None,
) -> Axes | np.ndarray | Sequence[Axes]:
    """Gate of prompt B minus prompt A per aligned token (x) and (layer, stream) (y), on a
    diverging, colour-blind-safe map scaled to the largest absolute difference (at least 0.05).
    Tokens only in one prompt are grey; x labels are B's tokens ('-tok' for A's deleted ones); an
    image span is one grey column; cells and fonts as in :func:`gate_heatmap` (long pairs wrap).
    Returns the Axes (the panels when it wraps).

    diff: pair, kind, token_a, token_b, layer, stream, diff [, is_image]
    (``engram_viz.analysis.gates.comparison.gate_difference``).
    """
    matrix, rows, labels, scale = diff_matrix(diff)
    a, b = diff.attrs.get("prompts", ("A", "B"))
    axis = _diff_axis(diff, labels)
    size, panels = heatmap_size(len(rows), axis, width)
    n = _panel_count(ax, panels)

    with plot_axes(ax, theme, size, n) as (fig, t, axes):
        cmap = colormaps["berlin" if t.name == "dark" and "berlin" in colormaps else "RdBu_r"]
        draw_token_heatmap(
            fig,
            axes,
            axis.values(matrix),
            rows,
            axis,
            cmap=cmap,
            vmin=-scale,
            vmax=scale,
            t=t,
            group_rows=int(pd.unique(diff["stream"]).size),
            colorbar=f"gate {b} - {a}",
        )
        axes[0].set_title(title or f"gate {b} - gate {a} per aligned token (grey: no partner)", loc="left")
    return drawn(axes[0] if n == 1 else axes, ax, diff)
