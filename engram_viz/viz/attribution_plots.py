"""Attribution figures: per-order and per-head bars of one position (matplotlib for papers, plotly
interactive), and the orders' Shapley values per token class.

Data first: ``groups`` is :meth:`engram_viz.analysis.explain.explanation.Explanation.groups_frame` (columns
``analysis.explain.explanation.GROUP_COLUMNS``); ``profile`` is :func:`engram_viz.analysis.explain.explanation.order_profile`.
A matplotlib plot draws into ``ax`` when given or into a new themed figure and returns its Axes
either way (``ax.figure`` is the figure); saving is ``engram_viz.viz.export``'s.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes

from engram_viz.errors import FrameError, InputError
from engram_viz.viz.figure_axes import AxesArg, drawn, legend, plot_axes
from engram_viz.viz.frames import require_columns
from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import Theme
from engram_viz.viz.token_labels import token_label

KINDS = ("order", "head")
VALUES = {
    "dot_share": "share of dot",
    "shapley": "Shapley value for the gate",
    "loo_gate": "gate with it left out",
    "value_proj": "value part along the value",
}


def _one_position(groups: pd.DataFrame, position: int | None, layer: int | None) -> tuple[pd.DataFrame, int, int]:
    require_columns(groups, ("position", "layer", "kind", "group", "stream", "token"), "attribution groups")
    position = int(groups["position"].iloc[0]) if position is None else int(position)
    layer = int(groups["layer"].iloc[0]) if layer is None else int(layer)
    df = groups[(groups["position"] == position) & (groups["layer"] == layer)]
    if df.empty:
        raise FrameError(
            f"no attribution for position {position} at layer {layer}; the frame has positions "
            f"{sorted(set(groups['position']))} and layers {sorted(set(groups['layer']))}"
        )
    return df, position, layer


def attribution_bars(
    groups: pd.DataFrame,
    position: int | None = None,
    *,
    layer: int | None = None,
    value: str = "dot_share",
    ax: AxesArg = None,
    theme: str | Theme = "light",
) -> np.ndarray | Axes | AxesArg:
    """Bars of ``value`` per n-gram order (left) and per head (right) for one position and layer,
    one bar per stream. ``value``: ``dot_share`` (default), ``loo_gate``, ``value_proj``, or
    ``shapley`` (orders only: one panel). ``ax``: one Axes per panel. Returns the panels: an array
    of Axes, one per panel (the given ``ax`` as given)."""
    if value not in VALUES:
        raise InputError(f"value {value!r} unknown; expected one of {list(VALUES)}")
    df, position, layer = _one_position(groups, position, layer)
    kinds = ("order",) if value == "shapley" else KINDS
    with plot_axes(ax, theme, (3.2 * len(kinds) + 0.6, 2.6), len(kinds), lambda f: f.subplots(1, len(kinds))) as (
        fig,
        _t,
        axes,
    ):
        streams = sorted(set(df["stream"]))
        width = 0.8 / len(streams)
        handles = []
        for a, kind in zip(axes, kinds):
            part = df[df["kind"] == kind]
            ids = sorted(set(part["group"]))
            for k, s in enumerate(streams):
                vals = part[part["stream"] == s].set_index("group").reindex(ids)[value].to_numpy(dtype=float)
                bars = a.bar(np.arange(len(ids)) + (k - (len(streams) - 1) / 2) * width, vals, width, label=f"s{s}")
                if a is axes[0]:
                    handles.append(bars)
            a.axhline(0, color="0.5", linewidth=0.6)
            a.set_xticks(range(len(ids)), [f"{g}-gram" if kind == "order" else str(g) for g in ids])
            a.set_xlabel("n-gram order" if kind == "order" else "head")
            a.set_ylabel(VALUES[value])
        token = token_label(str(df["token"].iloc[0]))
        axes[0].set_title(f"{token!r} (position {position}), layer {layer}", loc="left", fontsize=8)
        legend(fig, axes, ax is None, handles, [f"stream {s}" for s in streams], len(streams))
    return drawn(axes, ax, groups)


def order_profile_plot(
    profile: pd.DataFrame, *, layer: int | None = None, ax: Axes | None = None, theme: str | Theme = "light"
) -> Axes:
    """Mean Shapley value of each n-gram order for the gate, per token class (bars, one group per
    class): which orders open the gate on entities, function words and the rest. Returns the Axes."""
    require_columns(profile, ("layer", "token_class", "order", "shapley"), "order profile")
    layer = int(profile["layer"].iloc[0]) if layer is None else int(layer)
    df = profile[profile["layer"] == layer]
    table = df.groupby(["token_class", "order"])["shapley"].mean().unstack("order")
    with plot_axes(ax, theme, (4.6, 2.8), 1, lambda f: f.subplots()) as (_fig, _t, axes):
        a = axes[0]
        orders = list(table.columns)
        width = 0.8 / len(orders)
        for k, order in enumerate(orders):
            x = np.arange(len(table)) + (k - (len(orders) - 1) / 2) * width
            a.bar(x, table[order].to_numpy(dtype=float), width, label=f"{order}-gram")
        counts = df.drop_duplicates(["prompt", "position"]).groupby("token_class").size()
        a.set_xticks(range(len(table)), [f"{c}\n({counts.get(c, 0)} tokens)" for c in table.index])
        a.axhline(0, color="0.5", linewidth=0.6)
        a.set_ylabel("mean Shapley value (gate)")
        a.set_title(f"which n-gram orders open the gate, layer {layer}", loc="left", fontsize=8)
        a.legend(fontsize=7)
    return drawn(a, ax, profile)


def attribution_bars_interactive(groups: pd.DataFrame, position: int | None = None, *, layer: int | None = None):
    """The plotly version of :func:`attribution_bars` (dot shares per order and per head, one trace
    per stream; hover shows the left-out gate and, for orders, the Shapley value)."""
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as err:  # pragma: no cover - plotly is in the notebook extra
        raise ImportError("interactive figures need plotly: pip install 'engram-viz[notebook]'") from err
    df, position, layer = _one_position(groups, position, layer)
    fig = make_subplots(rows=1, cols=2, subplot_titles=("per n-gram order", "per head"))
    for col, kind in enumerate(KINDS, start=1):
        part = df[df["kind"] == kind]
        for s in sorted(set(part["stream"])):
            d = part[part["stream"] == s].sort_values("group")
            fig.add_trace(
                go.Bar(
                    x=[f"{g}-gram" if kind == "order" else f"head {g}" for g in d["group"]],
                    y=d["dot_share"],
                    name=f"stream {s}",
                    legendgroup=f"s{s}",
                    showlegend=col == 1,
                    customdata=np.stack([d["loo_gate"], d["shapley"].fillna(np.nan)], axis=-1),
                    hovertemplate="share of dot %{y:.3f}<br>gate left out %{customdata[0]:.3f}"
                    + ("<br>Shapley %{customdata[1]:.3f}" if kind == "order" else "")
                    + "<extra>stream "
                    + str(s)
                    + "</extra>",
                ),
                row=1,
                col=col,
            )
    token = token_label(str(df["token"].iloc[0]))
    fig.update_layout(
        barmode="group", title=f"{token!r} (position {position}), layer {layer}: shares of dot", height=360
    )
    return stamp(fig, groups)
