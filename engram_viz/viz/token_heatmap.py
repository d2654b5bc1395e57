"""Token heatmaps at one size: a row (layer x stream, ...) by token grid whose cells and fonts are
the same on every prompt. A token is one column of fixed width; an image span is one grey column
labelled ``[image ×56]``; a prompt longer than a row of the figure wraps onto further rows of
panels below (never a thinner cell or a smaller font). The gate heatmap and the difference heatmap
draw through :func:`draw_token_heatmap`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Colormap
from matplotlib.figure import Figure

from engram_viz.viz.style import Theme
from engram_viz.viz.token_labels import ELLIPSIS, image_label, image_spans, token_labels

CELL_IN = 0.2  # width of one token column, inches (a 7 pt label rotated 90° fits in it)
ROW_IN = 0.17  # height of one heatmap row, inches
TICK_PT = 7.0  # token labels, points, on every prompt
LABEL_CHARS = 14  # longer token labels are cut with '…'
SIDE_IN = 1.5  # row labels on the left and the colour bar on the right, inches
WIDTH_IN = 7.0  # the widest figure (a paper's text width); longer prompts wrap
TITLE_IN = 0.35


@dataclass(frozen=True)
class TokenAxis:
    """The columns of a token heatmap: one per text position, one per image span.

    ``spans[c]`` = (first, last) position of column c (equal for a token); ``image[c]`` True for an
    image span; ``labels[c]`` its tick label."""

    labels: list[str]
    spans: list[tuple[int, int]]
    image: np.ndarray

    def __len__(self) -> int:
        return len(self.labels)

    def values(self, matrix: np.ndarray) -> np.ndarray:
        """``[R, T]`` per-position values -> ``[R, C]`` per column (NaN for image spans)."""
        out = np.asarray(matrix, dtype=float)[:, [a for a, _ in self.spans]]
        out[:, self.image] = np.nan
        return out


def short(label: str, n: int = LABEL_CHARS) -> str:
    return label if len(label) <= n else label[: n - 1] + ELLIPSIS


def token_axis(tokens: Sequence[str], is_image: Sequence[bool] | np.ndarray) -> TokenAxis:
    """Columns of one prompt: token labels (``viz.token_labels``, cut at ``LABEL_CHARS``), image
    spans collapsed into one labelled column each."""
    image = np.asarray(is_image, dtype=bool)
    shown = token_labels(list(tokens))[0]
    starts = {a: b for a, b in image_spans(image)}
    labels, spans, flags = [], [], []
    t = 0
    while t < len(image):
        if t in starts:
            b = starts[t]
            labels.append(image_label(b - t + 1))
            spans.append((t, b))
            flags.append(True)
            t = b + 1
            continue
        labels.append(short(shown[t]))
        spans.append((t, t))
        flags.append(False)
        t += 1
    return TokenAxis(labels, spans, np.asarray(flags, dtype=bool))


def per_row(width: float | None) -> int:
    """Token columns per panel row for a figure ``width`` inches wide (default ``WIDTH_IN``)."""
    return max(8, int(((width or WIDTH_IN) - SIDE_IN) / CELL_IN))


def heatmap_size(n_rows: int, axis: TokenAxis, width: float | None) -> tuple[tuple[float, float], int]:
    """``((width, height) inches, panels)``: a prompt that fits one panel gets a figure just as wide
    as its columns; a longer one ``width`` (default ``WIDTH_IN``) and as many panels as it needs."""
    cols = per_row(width)
    panels = max(1, math.ceil(len(axis) / cols))
    fig_w = (width or WIDTH_IN) if panels > 1 else (width or max(3.5, SIDE_IN + CELL_IN * len(axis)))
    label_in = 0.15 + TICK_PT / 72 * 0.6 * max((len(s) for s in axis.labels), default=1)
    return (fig_w, TITLE_IN + panels * (ROW_IN * n_rows + label_in + 0.1)), panels


def draw_token_heatmap(
    fig: Figure,
    axes: Sequence[Axes],
    values: np.ndarray,
    row_labels: Sequence[str],
    axis: TokenAxis,
    *,
    cmap: Colormap,
    vmin: float,
    vmax: float,
    t: Theme,
    group_rows: int = 0,
    colorbar: str = "",
):
    """Draw ``values`` ``[R, C]`` (per column of ``axis``) into ``axes``, one panel per slice of
    columns (each as wide as the widest: cells keep one size); a white line every ``group_rows``
    rows (layers); image columns grey with their label. Returns the image of the first panel."""
    cols = max(1, math.ceil(len(axis) / len(axes)))
    first = None
    for k, ax in enumerate(axes):
        lo, hi = k * cols, min(len(axis), (k + 1) * cols)
        im = ax.imshow(
            np.ma.masked_invalid(values[:, lo:hi]),
            aspect="auto",
            cmap=cmap.with_extremes(bad=t.image),
            vmin=vmin,
            vmax=vmax,
            interpolation="nearest",
        )
        first = first or im
        ax.set_xlim(-0.5, cols - 0.5)  # the last panel keeps the others' cell width
        ax.set_yticks(range(len(row_labels)), row_labels, fontsize=TICK_PT)
        for g in range(group_rows, len(row_labels), group_rows) if group_rows else ():
            ax.axhline(g - 0.5, color=t.background, linewidth=2.0)
        ax.set_xticks(range(hi - lo), axis.labels[lo:hi], rotation=90, fontsize=TICK_PT)
        for label, img in zip(ax.get_xticklabels(), axis.image[lo:hi]):
            label.set_parse_math(False)
            if img:
                label.set_color(t.muted)
                label.set_fontstyle("italic")
        ax.tick_params(axis="x", length=0, pad=2)
        for side in ("left", "bottom", "top", "right"):
            ax.spines[side].set_visible(False)
    if colorbar:
        bar = fig.colorbar(first, ax=list(axes), label=colorbar, fraction=0.04, pad=0.01, aspect=15)
        bar.outline.set_visible(False)
    return first
