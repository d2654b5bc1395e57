"""Token-coloured text in HTML, in the spirit of the Engram paper's Figure 7: each token's
background shows its gate. ``token_html`` gives a self-contained page with tooltips (inline CSS
only, no scripts, no network); ``TokenView`` is what a notebook displays: that HTML plus the
matplotlib figure (``token_figure``) as a PNG fallback. Both draw the cells of ``cells``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize, to_hex
from matplotlib.figure import Figure

from engram_viz.viz.frames import pick_prompts
from engram_viz.viz.html_templates import render
from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import Theme, get_theme, paper_rc, text_color_on
from engram_viz.viz.token_chips import TokenCell, stream_label, token_cells, view_setup
from engram_viz.viz.token_figure import token_text_figure


def _cell_rows(cells: Sequence[TokenCell], t: Theme, norm: Normalize) -> list[tuple]:
    """Per cell: (tooltip, background, text colour, extra CSS, text, line break after it)."""
    values = np.array([0.0 if c.is_image else c.value for c in cells], dtype=float)
    colours = t.token_cmap(norm(values)) if len(cells) else []  # one colour-map call for all cells
    out = []
    for c, rgba in zip(cells, colours):
        if c.is_image:
            face, ink, extra = t.image, t.muted, "font-style:italic;"
        else:
            rgba = tuple(float(x) for x in rgba)
            face, ink = to_hex(rgba), text_color_on(rgba)
            extra = "font-size:0.75em;letter-spacing:0.03em;" if c.is_special else ""  # BOS: a label, not text
        out.append((c.tooltip, face, ink, extra, c.text, c.line_break))
    return out


def token_html(
    gates: pd.DataFrame,
    prompts: str | Sequence[str] | None = None,
    *,
    layer: int | None = None,
    stream: int | str = "mean",
    rows: pd.DataFrame | None = None,
    theme: str | Theme = "light",
    vmin: float = 0.0,
    vmax: float = 1.0,
    title: str | None = None,
    full_page: bool = True,
    fontsize: float = 16.0,
    attribution: pd.DataFrame | None = None,
) -> str:
    """Token-coloured text as HTML with a tooltip per token (token, position, the layer's stream
    gates, collision exposure, the n-gram orders' shares of the gate when ``attribution`` is given,
    and the 24 row ids when ``rows`` is given).

    gates: prompt, position, token, is_image, layer, stream, gate [+ exposure]; rows (optional):
    prompt, position, layer, order, head, row; attribution (optional): an explanation's groups
    frame (``Explanation.groups_frame(left_out=False)``: prompt, position, layer, kind, group,
    stream, dot_share). The tooltip is the ``title`` attribute: inline CSS only, no scripts, no network. With
    ``full_page`` a complete document, else a fragment for a notebook cell.
    """
    chosen, layer = view_setup(gates, prompts, layer)
    t = get_theme(theme)
    norm = Normalize(vmin, vmax)
    blocks = [
        (
            f"{prompt} \u00b7 layer {layer} \u00b7 {stream_label(stream)}",
            _cell_rows(token_cells(gates, prompt, layer, stream, rows, attribution), t, norm),
        )
        for prompt in chosen
    ]
    body = render(
        "tokens.html.j2",
        t=t,
        title=title or "",
        blocks=blocks,
        fontsize=fontsize,
        legend=f"gate ({stream_label(stream)}, layer {layer})",
        vmin=f"{vmin:g}",
        vmax=f"{vmax:g}",
        stops=[to_hex(t.token_cmap(x)) for x in np.linspace(0, 1, 11)],
    )
    if not full_page:
        return str(body)
    return str(render("tokens_page.html.j2", t=t, title=title or "engram-viz: token gates", body=body))


@dataclass
class TokenView:
    """Token-coloured text that a notebook shows as HTML with tooltips plus a PNG fallback.

    Build with ``token_view``; ``html()`` gives the page, ``figure()`` the matplotlib figure;
    ``engram_viz.viz.export.export_all(view, stem)`` writes html, png, pdf and svg.
    """

    gates: pd.DataFrame
    prompts: str | Sequence[str] | None = None
    layer: int | None = None
    stream: int | str = "mean"
    rows: pd.DataFrame | None = None
    theme: str = "light"
    vmin: float = 0.0
    vmax: float = 1.0
    title: str | None = None
    attribution: pd.DataFrame | None = None

    def html(self, full_page: bool = True) -> str:
        return token_html(
            self.gates,
            self.prompts,
            layer=self.layer,
            stream=self.stream,
            rows=self.rows,
            theme=self.theme,
            vmin=self.vmin,
            vmax=self.vmax,
            title=self.title,
            full_page=full_page,
            attribution=self.attribution,
        )

    def figure(self, width: float = 6.5) -> Figure:
        return token_text_figure(
            self.gates,
            self.prompts,
            layer=self.layer,
            stream=self.stream,
            theme=self.theme,
            width=width,
            vmin=self.vmin,
            vmax=self.vmax,
            title=self.title,
        )

    def png(self, dpi: int = 150) -> bytes:
        buf = io.BytesIO()
        fig = self.figure()
        with matplotlib.rc_context(paper_rc(self.theme)):
            fig.savefig(buf, format="png", dpi=dpi)
        return buf.getvalue()

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        return {"text/html": self.html(full_page=False), "image/png": self.png(), "text/plain": repr(self)}

    def __repr__(self) -> str:
        n = len(pick_prompts(self.gates, self.prompts, "gates"))
        return f"TokenView({n} prompt(s), layer={self.layer}, stream={self.stream!r}, theme={self.theme!r})"


def token_view(
    gates: pd.DataFrame,
    prompts: str | Sequence[str] | None = None,
    *,
    layer: int | None = None,
    stream: int | str = "mean",
    rows: pd.DataFrame | None = None,
    theme: str = "light",
    title: str | None = None,
    attribution: pd.DataFrame | None = None,
) -> TokenView:
    """A ``TokenView`` of gates (prompt, position, token, is_image, layer, stream, gate [+ exposure]),
    checked now so that errors show where the view is made; ``attribution`` as in :func:`token_html`."""
    view_setup(gates, prompts, layer)
    get_theme(theme)
    view = TokenView(gates, prompts, layer, stream, rows, theme, title=title, attribution=attribution)
    return stamp(view, gates)  # its title says which model ran, when the frame carries provenance
