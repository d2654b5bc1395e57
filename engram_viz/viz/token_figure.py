"""Token-coloured text as a matplotlib figure, in the spirit of the Engram paper's Figure 7: each
token's background shows its gate. The paper PDF/SVG/PNG, and the static fallback of the notebook
view (``tokens.TokenView``) that shows on GitHub.

The chips are laid out in inches over the whole figure (lines wrap at the figure's width and the
height follows the text), so this is a figure-level plot: it makes its own figure.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import matplotlib
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Colormap, Normalize
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle

from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import Theme, get_theme, paper_rc, text_color_on
from engram_viz.viz.token_chips import TokenCell, stream_label, token_cells, view_setup


@dataclass
class _Placed:
    cell: TokenCell
    x: float  # inches from the left
    line: int  # line index, 0 at the top
    width: float


@dataclass
class _Ink:
    """Text measure and spacing (inches) of one figure at one font size."""

    measure: Callable[[str], float]  # width of a text in pixels
    prop: FontProperties
    dpi: float
    fontsize: float
    margin: float = 0.12

    def __post_init__(self) -> None:
        f = self.fontsize
        self.pad, self.gap = f * 0.18 / 72, f * 0.08 / 72
        self.line_h, self.label_h, self.block_gap = f * 1.55 / 72, f * 1.5 / 72, f * 0.9 / 72


def _layout_lines(cells: Sequence[TokenCell], widths: Sequence[float], avail: float, gap: float) -> list[_Placed]:
    placed, x, line = [], 0.0, 0
    for cell, w in zip(cells, widths):
        if x > 0 and x + w > avail:
            x, line = 0.0, line + 1
        placed.append(_Placed(cell, x, line, min(w, avail)))
        x += w + gap
        if cell.line_break:
            x, line = 0.0, line + 1
    return placed


def _fit(text: str, width_px: float, measure) -> str:
    """``text`` cut with an ellipsis to fit ``width_px``."""
    while len(text) > 1 and measure(text + "\u2026") > width_px:
        text = text[:-1]
    return text + "\u2026"


def _chip(fig: Figure, ink: _Ink, t: Theme, p: _Placed, top: float, face) -> None:
    """One token: its coloured box and its text (cut with an ellipsis when wider than a line)."""
    tr, line_h, pad = fig.dpi_scale_trans, ink.line_h, ink.pad
    y0 = top - (p.line + 1) * line_h + line_h * 0.08
    fig.add_artist(
        Rectangle(
            (ink.margin + p.x, y0), p.width, line_h * 0.84, transform=tr, facecolor=face, edgecolor="none", linewidth=0
        )
    )
    text = p.cell.text
    if ink.measure(text) / ink.dpi + 2 * pad > p.width + 1e-9:
        text = _fit(text, (p.width - 2 * pad) * ink.dpi, ink.measure)
    fig.text(
        ink.margin + p.x + pad,
        y0 + line_h * 0.24,
        text,
        transform=tr,
        fontproperties=ink.prop,
        color=t.muted if p.cell.is_image else text_color_on(face),
        style="italic" if p.cell.is_image else "normal",
        parse_math=False,
    )


def _block(fig: Figure, ink: _Ink, t: Theme, label: str, placed: list[_Placed], paint, top: float) -> float:
    """One prompt's label and chips below ``top`` (inches); returns the top of the next block."""
    fig.text(
        ink.margin,
        top - ink.label_h * 0.75,
        label,
        transform=fig.dpi_scale_trans,
        fontsize=ink.fontsize * 0.8,
        color=t.muted,
        parse_math=False,
    )
    top -= ink.label_h
    for p in placed:
        _chip(fig, ink, t, p, top, t.image if p.cell.is_image else paint(p.cell.value))
    return top - (((placed[-1].line + 1) if placed else 1) * ink.line_h + ink.block_gap)


def _colour_bar(fig: Figure, ink: _Ink, t: Theme, cmap: Colormap, norm: Normalize, label: str) -> None:
    width, height = fig.get_size_inches()
    avail = width - 2 * ink.margin
    cax = fig.add_axes((ink.margin / width, (ink.margin + 0.2) / height, min(2.4, avail * 0.45) / width, 0.09 / height))
    bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal")
    bar.outline.set_visible(False)
    bar.set_ticks([norm.vmin, (norm.vmin + norm.vmax) / 2, norm.vmax])
    cax.tick_params(labelsize=ink.fontsize * 0.7, length=2)
    cax.set_title(label, fontsize=ink.fontsize * 0.75, loc="left", color=t.muted)


def token_text_figure(
    gates: pd.DataFrame,
    prompts: str | Sequence[str] | None = None,
    *,
    layer: int | None = None,
    stream: int | str = "mean",
    theme: str | Theme = "light",
    width: float = 6.5,
    fontsize: float = 10.0,
    vmin: float = 0.0,
    vmax: float = 1.0,
    title: str | None = None,
) -> Figure:
    """Token-coloured text (Figure 7 style) for one or several prompts, one block per prompt.

    gates: prompt, position, token, is_image, layer, stream, gate. ``layer`` defaults to the
    frame's first layer; ``stream`` is a stream index or 'mean' / 'max' / 'min' over streams.
    Image spans show as one grey chip. ``width`` in inches; the height follows the text.

    Returns the Figure, not an Axes: the chips are laid out in inches over the whole figure, whose
    height follows the text, so there is no Axes to draw into (hence no ``ax=``).
    """
    chosen, layer = view_setup(gates, prompts, layer)
    t = get_theme(theme)
    cmap, norm = t.token_cmap, Normalize(vmin, vmax)
    with matplotlib.rc_context(paper_rc(t)):
        fig = Figure(figsize=(width, 1.0), layout="none")
        renderer = FigureCanvasAgg(fig).get_renderer()
        prop = FontProperties(family=matplotlib.rcParams["font.family"], size=fontsize)

        def measure(s: str) -> float:
            return renderer.get_text_width_height_descent(s, prop, ismath=False)[0]

        ink = _Ink(measure, prop, fig.dpi, fontsize)
        blocks = []
        for prompt in chosen:
            cells = token_cells(gates, prompt, layer, stream)
            widths = [measure(c.text) / ink.dpi + 2 * ink.pad for c in cells]
            blocks.append((prompt, _layout_lines(cells, widths, width - 2 * ink.margin, ink.gap)))
        title_h = fontsize * 1.7 / 72 if title else 0.0
        lines = sum(ink.label_h + ((p[-1].line + 1) if p else 1) * ink.line_h + ink.block_gap for _, p in blocks)
        height = ink.margin + title_h + lines + 0.42 + ink.margin
        fig.set_size_inches(width, height)
        top = height - ink.margin
        if title:
            fig.text(
                ink.margin,
                top - fontsize / 72,
                title,
                transform=fig.dpi_scale_trans,
                fontsize=fontsize * 1.05,
                weight="bold",
                parse_math=False,
            )
            top -= title_h
        for prompt, placed in blocks:
            label = f"{prompt}  \u00b7  layer {layer}  \u00b7  {stream_label(stream)}"
            top = _block(fig, ink, t, label, placed, lambda v: cmap(norm(v)), top)
        _colour_bar(fig, ink, t, cmap, norm, f"gate ({stream_label(stream)}, layer {layer})")
        fig.draw_without_rendering()
    fig.engram_viz_theme = t.name
    return stamp(fig, gates)
