"""Token-coloured text in HTML, in the spirit of the Engram paper's Figure 7: each token's
background shows its gate. ``token_html`` gives a self-contained page with tooltips (inline CSS
only, no scripts, no network); ``TokenView`` is what a notebook displays: that HTML plus the
matplotlib figure (``token_figure``) as a PNG fallback. Both draw the cells of ``cells``.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize, to_hex
from matplotlib.figure import Figure

from engram_viz.viz.frames import pick_prompts
from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import HTML_FONT_STACK, Theme, get_theme, paper_rc, text_color_on
from engram_viz.viz.token_chips import TokenCell, stream_label, token_cells, view_setup
from engram_viz.viz.token_figure import token_text_figure


def _legend_html(t: Theme, vmin: float, vmax: float, label: str) -> str:
    stops = ", ".join(to_hex(t.token_cmap(x)) for x in np.linspace(0, 1, 11))
    bar = (
        f'<span style="display:inline-block;width:160px;height:10px;vertical-align:middle;border-radius:2px;'
        f'background:linear-gradient(to right, {stops})"></span>'
    )
    chip = (
        f'<span style="display:inline-block;padding:0 4px;margin-left:12px;background:{t.image};'
        f'color:{t.muted};font-style:italic">[image]</span> masked, gate 0'
    )
    return (
        f'<div style="margin-top:10px;font-size:12px;color:{t.muted}">{html.escape(label)}: '
        f"{vmin:g} {bar} {vmax:g}{chip}</div>"
    )


def _cells_html(cells: Sequence[TokenCell], t: Theme, norm: Normalize, fontsize: float) -> str:
    parts = []
    values = np.array([0.0 if c.is_image else c.value for c in cells], dtype=float)
    colours = t.token_cmap(norm(values)) if len(cells) else []  # one colour-map call for all cells
    for c, rgba in zip(cells, colours):
        if c.is_image:
            face, ink, extra = t.image, t.muted, "font-style:italic;"
        else:
            rgba = tuple(float(x) for x in rgba)
            face, ink, extra = to_hex(rgba), text_color_on(rgba), ""
        parts.append(
            f'<span class="ev-tok" title="{html.escape(c.tooltip, quote=True)}" style="background:{face};'
            f'color:{ink};{extra}padding:0.15em 0.08em;margin-right:1px;border-radius:2px">'
            f"{html.escape(c.text)}</span>"
        )
        if c.line_break:
            parts.append("<br>")
    return (
        f'<div style="white-space:pre-wrap;word-break:break-word;line-height:2.0;font-size:{fontsize}px;'
        f'font-family:{html.escape(HTML_FONT_STACK, quote=True)}">' + "".join(parts) + "</div>"
    )


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
    blocks = []
    for prompt in chosen:
        cells = token_cells(gates, prompt, layer, stream, rows, attribution)
        label = f"{prompt} \u00b7 layer {layer} \u00b7 {stream_label(stream)}"
        blocks.append(
            f'<section style="margin:0 0 16px 0"><div style="font-size:12px;color:{t.muted};'
            f'margin-bottom:2px">{html.escape(str(label))}</div>{_cells_html(cells, t, norm, fontsize)}'
            "</section>"
        )
    heading = f'<h2 style="font-size:16px;margin:0 0 12px 0">{html.escape(title)}</h2>' if title else ""
    body = (
        f'<div class="ev-tokens ev-{t.name}" style="background:{t.background};color:{t.foreground};'
        f'padding:14px 16px;font-family:{html.escape(HTML_FONT_STACK, quote=True)}">{heading}'
        + "".join(blocks)
        + _legend_html(t, vmin, vmax, f"gate ({stream_label(stream)}, layer {layer})")
        + "</div>"
    )
    if not full_page:
        return body
    doc_title = html.escape(title or "engram-viz: token gates")
    return (
        '<!DOCTYPE html>\n<html lang="und">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{doc_title}</title>\n<style>body{{margin:0;background:{t.background}}}"
        f".ev-tok:hover{{outline:1px solid {t.foreground}}}</style>\n</head>\n<body>\n{body}\n</body>\n</html>\n"
    )


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
