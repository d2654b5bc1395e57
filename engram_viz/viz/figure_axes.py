"""Panels of the matplotlib plots: the axes a plot draws into (made in a new themed figure, or given
by the caller as ``ax=``) and the axis decorations several plots share (token ticks, the 24 hash
columns as grouped heads).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.transforms import blended_transform_factory

from engram_viz.errors import InputError
from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import Theme, get_theme, paper_rc, themed_figure
from engram_viz.viz.token_labels import token_labels

AxesArg = Axes | Sequence[Axes] | None


@contextmanager
def plot_axes(
    ax: AxesArg,
    theme: str | Theme,
    figsize: tuple[float, float],
    n: int,
    make: Callable[[Figure], object] | None = None,
) -> Iterator[tuple[Figure, Theme, list[Axes]]]:
    """Yield ``(fig, theme, axes)``: ``n`` panels to draw into, in order.

    With ``ax=None`` a new themed figure of ``figsize`` inches (``style.themed_figure``) whose
    axes ``make(fig)`` creates (an Axes or an array of them; by default a column of ``n``); else the caller's ``ax`` (one Axes,
    or a sequence of ``n``), drawn under the theme's rcParams. Either way the plot returns its
    axes, never the figure (see :func:`drawn`); ``ax.figure`` reaches it.
    """
    if ax is None:
        with themed_figure(theme, figsize) as (fig, t):
            made = fig.subplots(n, 1, squeeze=False)[:, 0] if make is None else make(fig)
            yield fig, t, list(np.ravel(made))
        return
    axes = [ax] if isinstance(ax, Axes) else list(ax)
    if len(axes) != n or not all(isinstance(a, Axes) for a in axes):
        raise InputError(f"ax must be {n} matplotlib Axes (one per panel), got {ax!r}")
    t = get_theme(theme)
    with matplotlib.rc_context(paper_rc(t)):
        yield axes[0].figure, t, axes


def drawn(
    panels: Axes | Sequence[Axes] | np.ndarray, ax: AxesArg, data: pd.DataFrame | None = None
) -> Axes | np.ndarray | Sequence[Axes]:
    """What a plot returns, whether it made its figure or was given ``ax``: its Axes (a one-panel
    plot), else its panels (an array of Axes when it made them, the caller's ``ax`` as given
    otherwise). The figure is stamped with the provenance ``data`` carries in its attrs
    (``viz.stamps.stamp``; a frame without leaves it bare)."""
    if not isinstance(panels, Axes):
        panels = np.asarray(panels, dtype=object)  # a 1-D array of the panels, or the plot's own grid
    first = panels if isinstance(panels, Axes) else panels.flat[0]
    if data is not None:
        stamp(first.figure, data)
    return panels if isinstance(panels, Axes) or ax is None else ax


def legend(
    fig: Figure, axes: list[Axes], owned: bool, handles: list, labels: list, ncols: int, side: str = "lower"
) -> None:
    """A legend outside the panels, below them (``side='upper'``: above, where a figure label takes
    the bottom; the layout keeps the two apart) when the plot made the figure, else in the first
    of the given axes."""
    if owned:
        fig.legend(handles, labels, loc=f"outside {side} center", ncols=ncols)
    else:
        axes[0].legend(handles, labels)


def token_ticks(ax: Axes, tokens: Sequence[str], max_labels: int = 120, fontsize: float = 6.5) -> None:
    """Token pieces as x tick labels (every k-th, with its position, when there are many)."""
    n = len(tokens)
    step = max(1, math.ceil(n / max_labels))
    ticks = list(range(0, n, step))
    shown = token_labels(tokens)[0]
    labels = [shown[i] if step == 1 else f"{i} {shown[i]}" for i in ticks]
    ax.set_xticks(ticks, labels, rotation=90, fontsize=fontsize)
    for label in ax.get_xticklabels():
        label.set_parse_math(False)
    ax.tick_params(axis="x", length=0, pad=2)


def column_axis(ax: Axes, orders: Sequence[int], n_heads: int, t: Theme) -> None:
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


def column_index(frame: pd.DataFrame) -> tuple[np.ndarray, list[int], int]:
    """x position ``[N]`` of each (order, head) row of ``frame`` on a ``column_axis``, the orders
    and the number of heads."""
    orders = sorted(int(o) for o in pd.unique(frame["order"]))
    n_heads = int(frame["head"].max()) + 1
    x = (frame["order"].to_numpy() - orders[0]) * n_heads + frame["head"].to_numpy()
    return x, orders, n_heads
