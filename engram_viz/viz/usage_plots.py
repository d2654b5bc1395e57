"""matplotlib figures of table row usage: coverage per (order, head) column, the rank-frequency of
rows, and where the touched rows lie in a layer's address space.

Each takes the frame ``engram_viz.analysis.row_stats.usage.RowUsage`` gives (``coverage()``,
``rank_frequency()``; a (layer, row, hits) frame or the ``RowUsage`` itself) first, draws into
``ax`` when given (one Axes per panel) or into a new themed figure, and returns its Axes either
way (``ax.figure`` is the figure).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import FrameError, InputError
from engram_viz.viz.figure_axes import AxesArg, column_axis, column_index, drawn, plot_axes
from engram_viz.viz.frames import COVERAGE_COLUMNS, USAGE_COLUMNS, as_usage_frame, pick_layers, require_columns
from engram_viz.viz.style import Theme


def coverage_per_column(
    coverage: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
    log: bool = False,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Fraction of each column's rows touched (rows_touched / prime) per (n-gram order, head), one
    panel per layer. Returns the panels: an array of Axes, one per layer (the given ``ax`` as given).

    coverage: layer, order, head, prime, rows_touched, coverage (``RowUsage.coverage()``).
    """
    require_columns(coverage, COVERAGE_COLUMNS, "coverage")
    layers = pick_layers(coverage, layer, "coverage")

    with plot_axes(ax, theme, (width, 0.6 + 1.8 * len(layers)), len(layers)) as (_fig, t, axes):
        for panel, lay in zip(axes, layers):
            at = coverage[coverage["layer"] == lay].sort_values(["order", "head"])
            x, orders, n_heads = column_index(at)
            colours = [t.palette[(o - orders[0]) % len(t.palette)] for o in at["order"]]
            panel.bar(x, at["coverage"], width=0.75, color=colours)
            column_axis(panel, orders, n_heads, t)
            if log:
                panel.set_yscale("log")
            touched, prime = int(at["rows_touched"].sum()), int(at["prime"].sum())
            panel.set_title(
                f"layer {lay}: {touched:,} of {prime:,} rows touched ({100 * (touched / max(prime, 1)):.3g}%)",
                loc="left",
            )
            panel.set_ylabel("touched / prime", fontsize=7)
            panel.grid(axis="y")
            panel.set_axisbelow(True)
    return drawn(axes, ax, coverage)


def _log_ranks(n: int, points: int = 2000) -> np.ndarray:
    """At most ``points`` 0-based ranks, log-spaced, always including the first and last."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.geomspace(1, n, points).astype(np.int64) - 1)


def _ranked(at: pd.DataFrame, ranked: bool, lay: int) -> tuple[np.ndarray, np.ndarray, str]:
    """Ranks ``[R]``, hits ``[R]`` and the legend label of one layer's usage."""
    if ranked:
        at = at.sort_values("rank")
        ranks, hits = at["rank"].to_numpy(), at["hits"].to_numpy()
        return ranks, hits, f"layer {lay}: {int(ranks.max()):,} rows"
    all_hits = at.groupby("row")["hits"].sum().to_numpy()
    all_hits = np.sort(all_hits[all_hits > 0])[::-1]
    idx = _log_ranks(len(all_hits))
    return idx + 1, all_hits[idx], f"layer {lay}: {len(all_hits):,} rows, {int(all_hits.sum()):,} hits"


def row_rank_frequency(
    usage,
    *,
    layer: int | Sequence[int] | None = None,
    ax: Axes | None = None,
    theme: str | Theme = "light",
    width: float = 4.5,
) -> Axes:
    """Rank-frequency of table rows on log-log axes (hits of the r-th most used row), one line per
    layer; long tails are drawn at log-spaced ranks. Returns the Axes.

    usage: layer, row, hits (duplicate (layer, row) entries are summed), or an already ranked
    frame layer, rank, hits (``RowUsage.rank_frequency()``), or a ``RowUsage``.
    """
    usage = as_usage_frame(usage)
    ranked = "rank" in usage.columns and "row" not in usage.columns
    require_columns(usage, ("layer", "rank", "hits") if ranked else USAGE_COLUMNS, "usage")
    layers = pick_layers(usage, layer, "usage")
    with plot_axes(ax, theme, (width, 3.2), 1, lambda fig: fig.add_subplot()) as (_fig, t, (axes,)):
        for k, lay in enumerate(layers):
            ranks, hits, label = _ranked(usage[usage["layer"] == lay], ranked, lay)
            if len(ranks):
                axes.plot(
                    ranks, hits, color=t.palette[k % len(t.palette)], linewidth=1.2, label=label, drawstyle="steps-post"
                )
        axes.set_xscale("log")
        axes.set_yscale("log")
        axes.set_xlabel("rank of row")
        axes.set_ylabel("hits")
        axes.grid(which="major")
        axes.set_axisbelow(True)
        axes.legend(loc="upper right")
        axes.set_title("table row usage: rank-frequency", loc="left")
    return drawn(axes, ax, usage)


def _bin_sizes(prime: int, bins: int) -> np.ndarray:
    """Buckets per bin when bucket i goes to bin ``i * bins // prime``."""
    edges = -(-np.arange(bins + 1, dtype=np.int64) * prime // bins)  # ceil(b * prime / bins)
    return np.diff(edges)


def _touched_grid(rows: np.ndarray, weights: np.ndarray, offsets: np.ndarray, primes: np.ndarray, bins: int):
    """``[n_cols, bins]`` sums of ``weights`` per (column, bin) and the bucket count of each bin."""
    col = np.searchsorted(offsets, rows, side="right") - 1
    bucket = rows - offsets[col]
    b = bucket * bins // primes[col]
    grid = np.bincount(col * bins + b, weights=weights, minlength=len(primes) * bins).reshape(len(primes), bins)
    sizes = np.stack([_bin_sizes(int(p), bins) for p in primes])
    return grid, sizes


def _as_layout(layout: EngramLayout | EngramConfig | str) -> EngramLayout:
    return layout if isinstance(layout, EngramLayout) else EngramLayout(load_config(layout))


def _touched_panel(
    fig: Figure, ax: Axes, usage: pd.DataFrame, lay: int, layout: EngramLayout, bins: int, weight: str, t: Theme
) -> None:
    """One layer of ``touched_rows_map``: ``[24, bins]`` strips, a colour bar beside them."""
    cmap = t.heat_cmap.with_extremes(bad=t.background)
    li, n_heads = layout.layer_index(lay), layout.n_heads
    offsets, primes = layout.offsets[li], layout.column_primes[li]
    per_row = usage[usage["layer"] == lay].groupby("row")["hits"].sum()
    rows = per_row.index.to_numpy(dtype=np.int64)
    n_rows = int(layout.rows_per_layer[li])
    if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
        bad = rows[(rows < 0) | (rows >= n_rows)][0]
        raise FrameError(f"usage row {bad} out of range for layer {lay}; expected 0..{n_rows - 1}")
    w = np.ones(len(rows)) if weight == "touched" else per_row.to_numpy(dtype=float)
    grid, sizes = _touched_grid(rows, w, offsets, primes, int(bins))
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(sizes > 0, grid / sizes, np.nan)
    shown = np.ma.masked_where(~(value > 0), value)
    positive = value[value > 0]
    norm = (
        LogNorm(positive.min(), positive.max())
        if len(positive) and positive.min() < positive.max()
        else Normalize(0, 1 if not len(positive) else positive.max())
    )
    im = ax.imshow(
        shown, aspect="auto", cmap=cmap, norm=norm, interpolation="nearest", extent=(0, 1, len(primes) - 0.5, -0.5)
    )
    orders = list(layout.config.ngram_orders)
    ax.set_yticks([k * n_heads + (n_heads - 1) / 2 for k in range(len(orders))], [f"{o}-gram" for o in orders])
    for k in range(1, len(orders)):
        ax.axhline(k * n_heads - 0.5, color=t.foreground, linewidth=0.6)
    ax.set_xlabel(
        f"bucket within column (fraction of its prime; {bins} bins, ~{int(primes.mean() // bins):,} rows per bin)"
        if primes.mean() >= bins
        else f"bucket within column (fraction of its prime; {bins} bins)"
    )
    ax.set_title(
        f"layer {lay}: {len(rows):,} of {n_rows:,} rows touched "
        f"({100 * len(rows) / n_rows:.3g}%); strips = 8 heads per order",
        loc="left",
    )
    label = "fraction of rows touched" if weight == "touched" else "hits per row"
    fig.colorbar(im, ax=ax, fraction=0.04, pad=0.01, label=label).outline.set_visible(False)


def touched_rows_map(
    usage,
    layout: EngramLayout | EngramConfig | str = "tiny",
    *,
    layer: int | Sequence[int] | None = None,
    bins: int = 512,
    weight: str = "touched",
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Where touched rows lie in a layer's address space: one strip per (n-gram order, head) column,
    each column's buckets split into ``bins`` bins, colour = fraction of the bin's rows touched
    (``weight='touched'``) or hits per row (``'hits'``), log scale. Never dense over the table:
    memory is ``24 x bins``. One panel per layer; returns them, an array of Axes (the given ``ax``
    as given).

    usage: layer, row, hits (row = row id in the layer's table, column offsets included), or a
    ``RowUsage``.
    ``layout``: an EngramLayout, a config or a preset name, for the column offsets and primes.
    """
    usage = as_usage_frame(usage)
    require_columns(usage, USAGE_COLUMNS, "usage")
    if weight not in ("touched", "hits"):
        raise InputError(f"weight {weight!r} is unknown; expected 'touched' or 'hits'")
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise InputError(f"bins must be a positive int, got {bins!r}")
    lay_out = _as_layout(layout)
    layers = pick_layers(usage, layer, "usage")

    with plot_axes(ax, theme, (width, 0.5 + 2.2 * len(layers)), len(layers)) as (fig, t, axes):
        for panel, lay in zip(axes, layers):
            _touched_panel(fig, panel, usage, lay, lay_out, bins, weight, t)
    return drawn(axes, ax, usage)
