"""matplotlib figures for papers, one style (``style.paper_rc``), light and dark themes.

Every function takes a tidy frame (see ``frames``), returns a ``matplotlib.figure.Figure`` built
without pyplot (no global state; safe in long loops) and leaves saving to ``engram_viz.viz.export``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.transforms import blended_transform_factory

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.viz.frames import (
    COLLISION_COLUMNS,
    COVERAGE_COLUMNS,
    GATE_COLUMNS,
    USAGE_COLUMNS,
    as_usage_frame,
    gate_table,
    pick_layers,
    pick_one,
    reduce_streams,
    require_columns,
    stream_columns,
    with_aliases,
)
from engram_viz.viz.style import Theme, display_piece, themed_figure

# ------------------------------------------------------------------------------------- helpers


def _token_ticks(ax: Axes, tokens: Sequence[str], max_labels: int = 120, fontsize: float = 6.5) -> None:
    """Token pieces as x tick labels (every k-th, with its position, when there are many)."""
    n = len(tokens)
    step = max(1, math.ceil(n / max_labels))
    ticks = list(range(0, n, step))
    labels = [display_piece(tokens[i]) if step == 1 else f"{i} {display_piece(tokens[i])}" for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=fontsize)
    for label in ax.get_xticklabels():
        label.set_parse_math(False)
    ax.tick_params(axis="x", length=0, pad=2)


def _heatmap_width(n_tokens: int, width: float | None) -> float:
    return width if width is not None else float(np.clip(1.3 + 0.15 * n_tokens, 4.0, 14.0))


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
            raise ValueError(f"prompt {prompt!r} has {len(table)} positions at layer {layer} but {len(tokens)} before")
        streams = stream_columns(table)
        values = np.array(table[streams], dtype=float).T
        values[:, image] = np.nan
        blocks.append(values)
        labels += [f"L{layer} s{int(s)}" for s in streams]
    return np.vstack(blocks), labels, tokens, image


def _column_axis(ax: Axes, orders: Sequence[int], n_heads: int, t: Theme) -> None:
    """x axis of the 24 hash columns: heads as ticks, n-gram orders as groups below."""
    n = len(orders) * n_heads
    ax.set_xticks(range(n), [str(h) for _ in orders for h in range(n_heads)], fontsize=6)
    ax.set_xlim(-0.6, n - 0.4)
    tr = blended_transform_factory(ax.transData, ax.transAxes)
    for k, order in enumerate(orders):
        ax.text(
            k * n_heads + (n_heads - 1) / 2,
            -0.2,
            f"{order}-gram heads",
            transform=tr,
            ha="center",
            va="top",
            fontsize=7,
            color=t.muted,
        )
        if k:
            ax.axvline(k * n_heads - 0.5, color=t.grid, linewidth=0.8)


def _column_index(frame: pd.DataFrame) -> tuple[np.ndarray, list[int], int]:
    orders = sorted(int(o) for o in pd.unique(frame["order"]))
    n_heads = int(frame["head"].max()) + 1
    x = (frame["order"].to_numpy() - orders[0]) * n_heads + frame["head"].to_numpy()
    return x, orders, n_heads


def _as_layout(layout: EngramLayout | EngramConfig | str) -> EngramLayout:
    return layout if isinstance(layout, EngramLayout) else EngramLayout(load_config(layout))


# ----------------------------------------------------------------------------------- gate plots


def gate_heatmap(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float | None = None,
    vmin: float = 0.0,
    vmax: float = 1.0,
) -> Figure:
    """Stream x position heatmap of one prompt's gates; all layers stacked (all 8 gates on V4.1)
    unless ``layer`` picks some. Image positions are grey.

    gates: prompt, position, token, is_image, layer, stream, gate.
    """
    require_columns(gates, GATE_COLUMNS, "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    matrix, labels, tokens, _ = _gate_rows(gates, prompt, layers)
    height = 1.2 + 0.2 * len(labels) + 0.06 * max(len(display_piece(s)) for s in tokens)
    with themed_figure(theme, (_heatmap_width(len(tokens), width), min(height, 9.0))) as (fig, t):
        ax = fig.add_subplot()
        im = ax.imshow(
            np.ma.masked_invalid(matrix), aspect="auto", cmap=t.heat_cmap, vmin=vmin, vmax=vmax, interpolation="nearest"
        )
        ax.set_yticks(range(len(labels)), labels)
        n_streams = len(labels) // len(layers)
        for k in range(1, len(layers)):
            ax.axhline(k * n_streams - 0.5, color=t.background, linewidth=2.0)
        _token_ticks(ax, tokens)
        ax.set_title(f"{prompt}: gate per stream and position", loc="left")
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
        fig.colorbar(im, ax=ax, label="gate", fraction=0.04, pad=0.01, aspect=15).outline.set_visible(False)
    return fig


def gate_distributions(
    gates: pd.DataFrame,
    by: str = "category",
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float | None = None,
) -> Figure:
    """Box plots of gates per group of ``by`` (category, prompt, ...), one box per stream, one panel
    per layer. Image positions are left out (their gates are 0 by construction).

    gates: prompt, position, token, is_image, layer, stream, gate, and the ``by`` column.
    """
    require_columns(gates, (*GATE_COLUMNS, by), "gates")
    layers = pick_layers(gates, layer, "gates")
    text = gates[~gates["is_image"].astype(bool)]
    if text.empty:
        raise ValueError("the gates frame holds only image positions; no gates to show")
    groups = list(pd.unique(text[by]))
    streams = sorted(int(s) for s in pd.unique(text["stream"]))
    w = 0.8 / len(streams)
    fig_w = width if width is not None else float(np.clip(1.5 + 0.55 * len(groups) * len(layers), 4.0, 14.0))
    with themed_figure(theme, (fig_w, 2.8)) as (fig, t):
        axes = fig.subplots(1, len(layers), sharey=True, squeeze=False)[0]
        for ax, lay in zip(axes, layers):
            at = text[text["layer"] == lay]
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
            ax.set_xticks(
                range(len(groups)),
                [str(g) for g in groups],
                rotation=30 if len(groups) > 3 else 0,
                ha="right" if len(groups) > 3 else "center",
            )
            ax.set_xlim(-0.6, len(groups) - 0.4)
            ax.set_ylim(0, 1)
            ax.set_title(f"layer {lay}", loc="left")
            ax.grid(axis="y")
            ax.set_axisbelow(True)
        axes[0].set_ylabel("gate")
        handles = [Patch(color=t.palette[i % len(t.palette)], label=f"stream {s}") for i, s in enumerate(streams)]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(streams))
        fig.suptitle(f"gate distributions by {by} (text positions)", x=0.01, ha="left", fontsize=9.5)
    return fig


def exposure_beside_gates(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float | None = None,
) -> Figure:
    """Per layer, the stream x position gate heatmap above a bar chart of each position's collision
    exposure (0..24 of its rows shared with another n-gram); r is the Pearson correlation of
    exposure with the mean gate over text positions.

    gates: prompt, position, token, is_image, layer, stream, gate, exposure.
    """
    require_columns(gates, (*GATE_COLUMNS, "exposure"), "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    tables = [gate_table(gates, prompt, lay) for lay in layers]
    tokens = tables[0]["token"].tolist()
    ratios = [r for _ in layers for r in (4, 1.8)]
    height = min(1.0 + 1.5 * len(layers) + 0.06 * max(len(display_piece(s)) for s in tokens), 10.0)
    with themed_figure(
        theme, (width if width is not None else max(_heatmap_width(len(tokens), None), 5.0), height)
    ) as (fig, t):
        axes = fig.subplots(2 * len(layers), 1, sharex=True, height_ratios=ratios)
        for k, (lay, table) in enumerate(zip(layers, tables)):
            top, bottom = axes[2 * k], axes[2 * k + 1]
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
        _token_ticks(axes[-1], tokens)
        fig.suptitle(str(prompt), x=0.01, ha="left", fontsize=9.5)
    return fig


# ------------------------------------------------------------------------------ table and hash


def collisions_vs_expected(
    collisions: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> Figure:
    """Observed colliding buckets (bars) against those an ideal uniform hash of the same prime size
    would give (markers), per (n-gram order, head) column, one panel per layer.

    collisions: layer, order, head, prime, distinct, occupied, colliding_buckets,
    expected_occupied, expected_colliding (or ``CollisionStats.columns()``: distinct_ngrams,
    shared_buckets, expected_shared_buckets).
    """
    collisions = with_aliases(collisions, "collisions")
    require_columns(collisions, COLLISION_COLUMNS, "collisions")
    layers = pick_layers(collisions, layer, "collisions")
    with themed_figure(theme, (width, 0.6 + 1.9 * len(layers))) as (fig, t):
        axes = fig.subplots(len(layers), 1, squeeze=False)[:, 0]
        for ax, lay in zip(axes, layers):
            at = collisions[collisions["layer"] == lay].sort_values(["order", "head"])
            x, orders, n_heads = _column_index(at)
            ax.bar(x, at["colliding_buckets"], width=0.75, color=t.palette[0], label="observed")
            ax.scatter(
                x,
                at["expected_colliding"],
                marker="_",
                s=90,
                linewidths=1.6,
                color=t.foreground,
                zorder=3,
                label="expected (uniform hash)",
            )
            _column_axis(ax, orders, n_heads, t)
            obs, exp = int(at["colliding_buckets"].sum()), float(at["expected_colliding"].sum())
            ax.set_title(
                f"layer {lay}: {obs:,} colliding buckets observed, {exp:,.1f} expected; "
                f"{int(at['distinct'].sum()):,} distinct n-grams",
                loc="left",
            )
            ax.set_ylabel("buckets with\n\u2265 2 n-grams", fontsize=7)
            ax.grid(axis="y")
            ax.set_axisbelow(True)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=2)
    return fig


def coverage_per_column(
    coverage: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float = 7.0,
    log: bool = False,
) -> Figure:
    """Fraction of each column's rows touched (touched / prime) per (n-gram order, head), one panel
    per layer.

    coverage: layer, order, head, prime, touched, coverage (or ``RowUsage.coverage()``, whose
    rows_touched stands for touched).
    """
    coverage = with_aliases(coverage, "coverage")
    require_columns(coverage, COVERAGE_COLUMNS, "coverage")
    layers = pick_layers(coverage, layer, "coverage")
    with themed_figure(theme, (width, 0.6 + 1.8 * len(layers))) as (fig, t):
        axes = fig.subplots(len(layers), 1, squeeze=False)[:, 0]
        for ax, lay in zip(axes, layers):
            at = coverage[coverage["layer"] == lay].sort_values(["order", "head"])
            x, orders, n_heads = _column_index(at)
            colours = [t.palette[(o - orders[0]) % len(t.palette)] for o in at["order"]]
            ax.bar(x, at["coverage"], width=0.75, color=colours)
            _column_axis(ax, orders, n_heads, t)
            if log:
                ax.set_yscale("log")
            total = int(at["touched"].sum()) / max(int(at["prime"].sum()), 1)
            ax.set_title(
                f"layer {lay}: {int(at['touched'].sum()):,} of {int(at['prime'].sum()):,} rows touched "
                f"({100 * total:.3g}%)",
                loc="left",
            )
            ax.set_ylabel("touched / prime", fontsize=7)
            ax.grid(axis="y")
            ax.set_axisbelow(True)
    return fig


def _log_ranks(n: int, points: int = 2000) -> np.ndarray:
    """At most ``points`` 0-based ranks, log-spaced, always including the first and last."""
    if n <= points:
        return np.arange(n)
    return np.unique(np.geomspace(1, n, points).astype(np.int64) - 1)


def row_rank_frequency(
    usage,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float = 4.5,
) -> Figure:
    """Rank-frequency of table rows on log-log axes (hits of the r-th most used row), one line per
    layer; long tails are drawn at log-spaced ranks.

    usage: layer, row, hits (duplicate (layer, row) entries are summed), or an already ranked
    frame layer, rank, hits (``RowUsage.rank_frequency()``), or a ``RowUsage``.
    """
    usage = as_usage_frame(usage)
    ranked = "rank" in usage.columns and "row" not in usage.columns
    require_columns(usage, ("layer", "rank", "hits") if ranked else USAGE_COLUMNS, "usage")
    layers = pick_layers(usage, layer, "usage")
    with themed_figure(theme, (width, 3.2)) as (fig, t):
        ax = fig.add_subplot()
        for k, lay in enumerate(layers):
            at = usage[usage["layer"] == lay]
            if ranked:
                at = at.sort_values("rank")
                ranks, hits = at["rank"].to_numpy(), at["hits"].to_numpy()
                label = f"layer {lay}: {int(ranks.max()):,} rows"
            else:
                all_hits = at.groupby("row")["hits"].sum().to_numpy()
                all_hits = np.sort(all_hits[all_hits > 0])[::-1]
                idx = _log_ranks(len(all_hits))
                ranks, hits = idx + 1, all_hits[idx]
                label = f"layer {lay}: {len(all_hits):,} rows, {int(all_hits.sum()):,} hits"
            if len(ranks):
                ax.plot(
                    ranks, hits, color=t.palette[k % len(t.palette)], linewidth=1.2, label=label, drawstyle="steps-post"
                )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("rank of row")
        ax.set_ylabel("hits")
        ax.grid(which="major")
        ax.set_axisbelow(True)
        ax.legend(loc="upper right")
        ax.set_title("table row usage: rank-frequency", loc="left")
    return fig


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


def touched_rows_map(
    usage,
    layout: EngramLayout | EngramConfig | str = "tiny",
    *,
    layer: int | Sequence[int] | None = None,
    bins: int = 512,
    weight: str = "touched",
    theme: str | Theme = "light",
    width: float = 7.0,
) -> Figure:
    """Where touched rows lie in a layer's address space: one strip per (n-gram order, head) column,
    each column's buckets split into ``bins`` bins, colour = fraction of the bin's rows touched
    (``weight='touched'``) or hits per row (``'hits'``), log scale. Never dense over the table:
    memory is ``24 x bins``.

    usage: layer, row, hits (row = row id in the layer's table, column offsets included), or a
    ``RowUsage``.
    ``layout``: an EngramLayout, a config or a preset name, for the column offsets and primes.
    """
    usage = as_usage_frame(usage)
    require_columns(usage, USAGE_COLUMNS, "usage")
    if weight not in ("touched", "hits"):
        raise ValueError(f"weight {weight!r} is unknown; expected 'touched' or 'hits'")
    if not isinstance(bins, (int, np.integer)) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    lay_out = _as_layout(layout)
    layers = pick_layers(usage, layer, "usage")
    n_heads = lay_out.n_heads
    with themed_figure(theme, (width, 0.5 + 2.2 * len(layers))) as (fig, t):
        axes = fig.subplots(len(layers), 1, squeeze=False)[:, 0]
        cmap = t.heat_cmap.with_extremes(bad=t.background)
        for ax, lay in zip(axes, layers):
            li = lay_out.layer_index(lay)
            offsets, primes = lay_out.offsets[li], lay_out.column_primes[li]
            per_row = usage[usage["layer"] == lay].groupby("row")["hits"].sum()
            rows = per_row.index.to_numpy(dtype=np.int64)
            n_rows = int(lay_out.rows_per_layer[li])
            if len(rows) and (rows.min() < 0 or rows.max() >= n_rows):
                bad = rows[(rows < 0) | (rows >= n_rows)][0]
                raise ValueError(f"usage row {bad} out of range for layer {lay}; expected 0..{n_rows - 1}")
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
                shown,
                aspect="auto",
                cmap=cmap,
                norm=norm,
                interpolation="nearest",
                extent=(0, 1, len(primes) - 0.5, -0.5),
            )
            orders = list(lay_out.config.ngram_orders)
            ax.set_yticks([k * n_heads + (n_heads - 1) / 2 for k in range(len(orders))], [f"{o}-gram" for o in orders])
            for k in range(1, len(orders)):
                ax.axhline(k * n_heads - 0.5, color=t.foreground, linewidth=0.6)
            ax.set_xlabel(
                f"bucket within column (fraction of its prime; {bins} bins, "
                f"~{int(primes.mean() // bins):,} rows per bin)"
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
    return fig


# ------------------------------------------------------------------------------ two prompts


DIFF_COLUMNS = ("pair", "kind", "token_a", "token_b", "layer", "stream", "diff")


def _diff_matrix(diff: pd.DataFrame) -> tuple[np.ndarray, list[str], list[str], float]:
    """``[layers * streams, pairs]`` differences (NaN where a side has no partner), row labels,
    x labels (B's token; A's token struck as '-tok' for deletions) and the symmetric scale."""
    require_columns(diff, DIFF_COLUMNS, "difference")
    wide = diff.pivot_table(index=["layer", "stream"], columns="pair", values="diff", aggfunc="first", dropna=False)
    wide = wide.reindex(columns=sorted(pd.unique(diff["pair"])))
    first = diff.drop_duplicates("pair").set_index("pair").loc[wide.columns]
    labels = [
        display_piece(tb) if kind != "delete" else "-" + display_piece(ta)
        for ta, tb, kind in zip(first["token_a"], first["token_b"], first["kind"])
    ]
    matrix = wide.to_numpy(dtype=float)
    finite = np.abs(matrix[np.isfinite(matrix)])
    scale = max(0.05, float(finite.max()) if finite.size else 0.0)
    rows = [f"L{int(lay)} s{int(s)}" for lay, s in wide.index]
    return matrix, rows, labels, scale


def gate_difference_heatmap(
    diff: pd.DataFrame, *, theme: str | Theme = "light", width: float | None = None, title: str | None = None
) -> Figure:
    """Gate of prompt B minus prompt A per aligned token (x) and (layer, stream) (y), on a
    diverging, colour-blind-safe map scaled to the largest absolute difference (at least 0.05).
    Tokens only in one prompt are grey; x labels are B's tokens ('-tok' for A's deleted ones).

    diff: pair, kind, token_a, token_b, layer, stream, diff (``engram_viz.apps.widgets.gate_difference``).
    """
    from matplotlib import colormaps

    matrix, rows, labels, scale = _diff_matrix(diff)
    a, b = diff.attrs.get("prompts", ("A", "B"))
    height = 1.2 + 0.2 * len(rows) + 0.06 * max((len(s) for s in labels), default=1)
    with themed_figure(theme, (_heatmap_width(len(labels), width), min(height, 9.0))) as (fig, t):
        cmap = colormaps["berlin" if t.name == "dark" and "berlin" in colormaps else "RdBu_r"].with_extremes(
            bad=t.image
        )
        ax = fig.add_subplot()
        im = ax.imshow(
            np.ma.masked_invalid(matrix), aspect="auto", cmap=cmap, vmin=-scale, vmax=scale, interpolation="nearest"
        )
        ax.set_yticks(range(len(rows)), rows)
        _token_ticks(ax, labels)
        ax.set_title(title or f"gate {b} - gate {a} per aligned token (grey: no partner)", loc="left")
        for side in ("left", "bottom"):
            ax.spines[side].set_visible(False)
        bar = fig.colorbar(im, ax=ax, label=f"gate {b} - {a}", fraction=0.04, pad=0.01, aspect=15)
        bar.outline.set_visible(False)
    return fig


def heads_shared_vs_expected(
    heads_shared: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> Figure:
    """Multi-head sharing: how many distinct n-grams share a bucket on 0, 1, ..., 8 of their heads
    (bars, log scale) against a uniform hash (markers; Poisson-binomial over the heads), one panel
    per (layer, order). An n-gram's table read is ambiguous only on the heads where it shares.

    heads_shared: layer, order, heads_shared, ngrams, expected_ngrams (``CollisionStats.heads_shared()``).
    """
    require_columns(heads_shared, ("layer", "order", "heads_shared", "ngrams", "expected_ngrams"), "heads_shared")
    layers = pick_layers(heads_shared, layer, "heads_shared")
    orders = sorted(int(o) for o in pd.unique(heads_shared["order"]))
    with themed_figure(theme, (width, 0.7 + 1.7 * len(layers))) as (fig, t):
        axes = fig.subplots(len(layers), len(orders), squeeze=False, sharey=True)
        for r, lay in enumerate(layers):
            for c, order in enumerate(orders):
                ax = axes[r, c]
                at = heads_shared[(heads_shared["layer"] == lay) & (heads_shared["order"] == order)]
                at = at.sort_values("heads_shared")
                x = at["heads_shared"].to_numpy()
                ax.bar(x, at["ngrams"].to_numpy(dtype=float), width=0.75, color=t.palette[c % len(t.palette)],
                       label="observed")  # fmt: skip
                exp = at["expected_ngrams"].to_numpy(dtype=float)
                keep = exp >= 1e-3
                ax.scatter(x[keep], exp[keep], marker="_", s=80, linewidths=1.5, color=t.foreground, zorder=3,
                           label="expected (uniform hash)")  # fmt: skip
                ax.set_yscale("log")
                ax.set_ylim(bottom=0.5)
                ax.set_xticks(x)
                ax.set_title(f"layer {lay}, {order}-grams", loc="left")
                ax.grid(axis="y")
                ax.set_axisbelow(True)
            axes[r, 0].set_ylabel("distinct n-grams")
        fig.supxlabel("heads (of 8) on which the n-gram shares its bucket", fontsize=8)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=2)
    return fig
