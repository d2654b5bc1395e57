"""Provenance on the page: the box that says which model, weights and streams produced a result (shown
by the notebooks) and the stamp every figure drawn from a Trace's frame carries (the figures of the
report page and of the notebooks alike).

The data is ``engram_viz.run.provenance.Provenance``, read from a Trace, a Pipeline or a frame's
``attrs``; the plot functions call :func:`stamp` with the frame they drew, so no caller labels a
figure by hand.
"""

from __future__ import annotations

import html
import textwrap
from typing import Any

from matplotlib.figure import Figure

from engram_viz.errors import InputTypeError
from engram_viz.run.provenance import Provenance, provenance_of
from engram_viz.viz.html_templates import render, synthetic_warning
from engram_viz.viz.style import STAMP_PT, THEMES, Theme, figure_of, get_theme

_STAMP = "_engram_viz_stamp"  # the matplotlib Text a figure was stamped with (restamping replaces it)
_TITLE = "_engram_viz_title"  # a TokenView's own title, before its stamp
PROVENANCE = "engram_viz_provenance"  # the full stamp text on a figure: export writes it into the file's metadata


def stamp_lines(text: str, per_line: int, max_lines: int | None) -> str:
    """``text`` wrapped at ``per_line`` characters, at most ``max_lines`` lines (the last cut with
    '…'; the whole text goes into the file's metadata)."""
    lines = textwrap.wrap(text, per_line) or [""]
    if max_lines is not None and len(lines) > max_lines:
        lines = lines[:max_lines]
        lines[-1] = lines[-1][: per_line - 1].rstrip() + "\u2026"
    return "\n".join(lines)


def _fit(fig: Figure, drawn: Any, text: str) -> None:
    """Set the stamp ``text`` wrapped to the figure's width (measured), in at most the lines its
    layout keeps free at the bottom (``style.themed_figure``; any number on a figure of the caller's)."""
    max_lines = getattr(fig, "engram_viz_stamp_lines", None)
    room = fig.bbox.width * 0.99 - drawn.get_window_extent().x0
    per_line = max(20, int(fig.get_figwidth() * 72 / (STAMP_PT * 0.5)))  # a first guess, then measured
    while True:
        drawn.set_text(stamp_lines(text, per_line, max_lines))
        if per_line <= 20 or drawn.get_window_extent(fig.canvas.get_renderer()).width <= room:
            return
        per_line -= 4


def stamp_text(fig: Figure) -> Any:
    """The stamp drawn on a matplotlib figure (a Text), or None."""
    return getattr(fig, _STAMP, None)


def stamp(fig: Any, source: Any) -> Any:
    """Write the provenance of ``source`` (a frame with provenance attrs, a Trace, a Pipeline, a
    Provenance, or a label string) on ``fig``: a matplotlib figure gets a small line in its bottom-left
    corner (once: stamping again replaces it), a plotly figure a subtitle, a TokenView its title.
    ``fig`` may be what a plot returned, an Axes or an array of them: their figure is stamped.
    A frame without provenance leaves the figure as it is. Returns ``fig`` as given."""
    if figure_of(fig) is not fig:  # an Axes, or the array of them a plot returned
        stamp(figure_of(fig), source)
        return fig
    if isinstance(source, str):
        text = Provenance(source, "", "", False).label
    else:
        found = provenance_of(source)
        if found is None or not found.model:
            return fig
        text = found.label
    if isinstance(fig, Figure):
        colour = THEMES.get(getattr(fig, "engram_viz_theme", "light"), THEMES["light"]).muted
        setattr(fig, PROVENANCE, text)
        drawn = getattr(fig, _STAMP, None)
        if drawn is None:
            drawn = fig.text(0.004, 0.004, "", fontsize=STAMP_PT, color=colour, ha="left", va="bottom")
            drawn.set_parse_math(False)
            setattr(fig, _STAMP, drawn)
        _fit(fig, drawn, text)
    elif hasattr(fig, "update_layout"):  # plotly
        title = fig.layout.title.text or ""
        fig.update_layout(title={"text": title, "subtitle": {"text": html.escape(text)}}, margin={"t": 70})
    elif hasattr(fig, "title") and hasattr(fig, "png"):  # a TokenView (viz.tokens)
        base = getattr(fig, _TITLE, fig.title)  # the title before any stamp (stamping again replaces it)
        setattr(fig, _TITLE, base)
        fig.title = f"{base} \u2014 {text}" if base else text
    else:
        raise InputTypeError(f"cannot stamp a {type(fig).__name__}; expected a matplotlib/plotly figure or a TokenView")
    return fig


class ProvenanceBox:
    """Which model, weights and streams produced a result; shows as a box (HTML, in ``theme``'s
    colours) or as text."""

    def __init__(self, source: Any, theme: str | Theme = "light"):
        found = provenance_of(source)
        self.provenance = found if found is not None else Provenance("(unknown)", "", "?", False)
        self.theme = get_theme(theme)

    def _repr_html_(self) -> str:
        p, t = self.provenance, self.theme
        warning = synthetic_warning(t, boxed=False) if p.synthetic else ""
        streams = p.streams or "(set on first run)"
        return str(
            render("provenance_box.html.j2", t=t, model=p.model, streams=streams, config=p.config, warning=warning)
        )

    def __repr__(self) -> str:
        p = self.provenance
        lines = [f"model and weights: {p.model}", f"residual streams: {p.streams}", f"config: {p.config}"]
        if p.synthetic:
            lines.append("SYNTHETIC weights: gates are not learned; hashes, collisions and row usage are exact")
        return "\n".join(lines)
