"""Provenance on the page: the box that says which model, weights and streams produced a result (shown
by the notebooks) and the stamp every figure drawn from a Trace's frame carries (the figures of the
report page and of the notebooks alike).

The data is ``engram_viz.run.provenance.Provenance``, read from a Trace, a Pipeline or a frame's
``attrs``; the plot functions call :func:`stamp` with the frame they drew, so no caller labels a
figure by hand.
"""

from __future__ import annotations

import html
from typing import Any

from matplotlib.figure import Figure

from engram_viz.errors import InputTypeError
from engram_viz.run.provenance import Provenance, provenance_of
from engram_viz.viz.html_templates import render, synthetic_warning
from engram_viz.viz.style import THEMES, Theme, figure_of, get_theme

_STAMP = "_engram_viz_stamp"  # the matplotlib Text a figure was stamped with (restamping replaces it)
_TITLE = "_engram_viz_title"  # a TokenView's own title, before its stamp


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
        old = getattr(fig, _STAMP, None)
        if old is not None:
            old.set_text(text)
        else:
            drawn = fig.text(0.003, 0.003, text, fontsize=5.5, color=colour, ha="left", va="bottom", parse_math=False)
            setattr(fig, _STAMP, drawn)
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
