"""Token-coloured text in the spirit of the Engram paper's Figure 7: each token's background shows
its gate. The same cells drive three renderings: a matplotlib figure (paper PDF/SVG/PNG, and the
static fallback that shows on GitHub), a self-contained HTML page with tooltips (inline CSS only,
no scripts, no network), and ``TokenView``, which a notebook displays as both.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize, to_hex
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.patches import Rectangle

from engram_viz.viz.frames import (
    GATE_COLUMNS,
    gate_table,
    pick_layers,
    pick_prompts,
    reduce_streams,
    require_columns,
    row_ids_text,
    stream_columns,
)
from engram_viz.viz.style import HTML_FONT_STACK, Theme, display_piece, get_theme, paper_rc, text_color_on


@dataclass(frozen=True)
class TokenCell:
    """One chip of token-coloured text (an image span collapses into one chip)."""

    text: str  # as shown: controls made visible
    value: float  # the gate coloured (nan for image spans)
    tooltip: str
    is_image: bool
    line_break: bool  # the token ends with a newline: start a new line after it


def _stream_label(stream: int | str) -> str:
    return f"stream {stream}" if not isinstance(stream, str) else f"{stream} of streams"


def token_cells(
    gates: pd.DataFrame, prompt, layer: int, stream: int | str = "mean", rows: pd.DataFrame | None = None
) -> list[TokenCell]:
    """The chips of one prompt at one layer. Needs gates columns prompt, position, token, is_image,
    layer, stream, gate (+ exposure, shown in tooltips when present); ``rows`` adds row ids to tooltips."""
    table = gate_table(gates, prompt, layer)
    values = reduce_streams(table, stream)
    row_text = row_ids_text(rows, prompt, layer)
    has_exposure = "exposure" in table.columns
    cells: list[TokenCell] = []
    positions = table.index.to_numpy()
    # plain arrays, read once (per-row pandas access is slow on long prompts)
    image = table["is_image"].to_numpy(dtype=bool)
    tokens = table["token"].tolist()
    streams = stream_columns(table)
    stream_values = table[streams].to_numpy(dtype=float)
    exposure = table["exposure"].to_numpy() if has_exposure else None
    i = 0
    while i < len(table):
        if image[i]:
            j = i
            while j + 1 < len(table) and image[j + 1]:
                j += 1
            n = j - i + 1
            tip = f"image span: positions {positions[i]}-{positions[j]} ({n} tokens)\ngates 0 (masked)"
            cells.append(TokenCell(f"[image \u00d7{n}]", float("nan"), tip, True, False))
            i = j + 1
            continue
        position = int(positions[i])
        piece = tokens[i]
        summary = "  ".join(f"s{int(s)} {v:.3f}" for s, v in zip(streams, stream_values[i]))  # as gate_summary
        lines = [
            f"{piece!r}  position {position}",
            f"layer {layer} gates: {summary}",
        ]
        if has_exposure:
            lines.append(f"collision exposure {int(exposure[i])}/24 rows shared")
        if position in row_text:
            lines.append(row_text[position])
        cells.append(TokenCell(display_piece(piece), float(values[i]), "\n".join(lines), False, piece.endswith("\n")))
        i += 1
    return cells


def _view_setup(gates: pd.DataFrame, prompts, layer: int | None) -> tuple[list, int]:
    require_columns(gates, GATE_COLUMNS, "gates")
    chosen = pick_prompts(gates, prompts, "gates")
    layers = pick_layers(gates, layer, "gates")
    return chosen, layers[0]


# ----------------------------------------------------------------------------------- matplotlib


@dataclass
class _Placed:
    cell: TokenCell
    x: float  # inches from the left
    line: int  # line index, 0 at the top
    width: float


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
    """
    chosen, layer = _view_setup(gates, prompts, layer)
    t = get_theme(theme)
    cmap, norm = t.token_cmap, Normalize(vmin, vmax)
    with matplotlib.rc_context(paper_rc(t)):
        fig = Figure(figsize=(width, 1.0), layout="none")
        canvas = FigureCanvasAgg(fig)
        renderer = canvas.get_renderer()
        prop = FontProperties(family=matplotlib.rcParams["font.family"], size=fontsize)
        dpi = fig.dpi

        def measure(s: str) -> float:
            return renderer.get_text_width_height_descent(s, prop, ismath=False)[0]

        pad, gap, margin = fontsize * 0.18 / 72, fontsize * 0.08 / 72, 0.12
        line_h, label_h, block_gap = fontsize * 1.55 / 72, fontsize * 1.5 / 72, fontsize * 0.9 / 72
        avail = width - 2 * margin
        blocks = []
        for prompt in chosen:
            cells = token_cells(gates, prompt, layer, stream)
            widths = [measure(c.text) / dpi + 2 * pad for c in cells]
            placed = _layout_lines(cells, widths, avail, gap)
            blocks.append((prompt, placed, (placed[-1].line + 1) if placed else 1))
        title_h = fontsize * 1.7 / 72 if title else 0.0
        bar_h = 0.42
        height = margin + title_h + sum(label_h + n * line_h + block_gap for _, _, n in blocks) + bar_h + margin
        fig.set_size_inches(width, height)
        tr = fig.dpi_scale_trans
        top = height - margin
        if title:
            fig.text(
                margin,
                top - fontsize / 72,
                title,
                transform=tr,
                fontsize=fontsize * 1.05,
                weight="bold",
                parse_math=False,
            )
            top -= title_h
        for prompt, placed, n_lines in blocks:
            fig.text(
                margin,
                top - label_h * 0.75,
                f"{prompt}  \u00b7  layer {layer}  \u00b7  {_stream_label(stream)}",
                transform=tr,
                fontsize=fontsize * 0.8,
                color=t.muted,
                parse_math=False,
            )
            top -= label_h
            for p in placed:
                y0 = top - (p.line + 1) * line_h + line_h * 0.08
                face = t.image if p.cell.is_image else cmap(norm(p.cell.value))
                fig.add_artist(
                    Rectangle(
                        (margin + p.x, y0),
                        p.width,
                        line_h * 0.84,
                        transform=tr,
                        facecolor=face,
                        edgecolor="none",
                        linewidth=0,
                    )
                )
                text = p.cell.text
                if measure(text) / dpi + 2 * pad > p.width + 1e-9:
                    text = _fit(text, (p.width - 2 * pad) * dpi, measure)
                fig.text(
                    margin + p.x + pad,
                    y0 + line_h * 0.24,
                    text,
                    transform=tr,
                    fontproperties=prop,
                    color=t.muted if p.cell.is_image else text_color_on(face),
                    style="italic" if p.cell.is_image else "normal",
                    parse_math=False,
                )
            top -= n_lines * line_h + block_gap
        cax = fig.add_axes((margin / width, (margin + 0.2) / height, min(2.4, avail * 0.45) / width, 0.09 / height))
        bar = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), cax=cax, orientation="horizontal")
        bar.outline.set_visible(False)
        bar.set_ticks([vmin, (vmin + vmax) / 2, vmax])
        cax.tick_params(labelsize=fontsize * 0.7, length=2)
        cax.set_title(
            f"gate ({_stream_label(stream)}, layer {layer})", fontsize=fontsize * 0.75, loc="left", color=t.muted
        )
        fig.draw_without_rendering()
    fig.engram_viz_theme = t.name
    return fig


# ----------------------------------------------------------------------------------------- HTML


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
) -> str:
    """Token-coloured text as HTML with a tooltip per token (token, position, the layer's stream
    gates, collision exposure, and the 24 row ids when ``rows`` is given).

    gates: prompt, position, token, is_image, layer, stream, gate [+ exposure]; rows (optional):
    prompt, position, layer, order, head, row. Inline CSS only: no scripts, no network. With
    ``full_page`` a complete document, else a fragment for a notebook cell.
    """
    chosen, layer = _view_setup(gates, prompts, layer)
    t = get_theme(theme)
    norm = Normalize(vmin, vmax)
    blocks = []
    for prompt in chosen:
        cells = token_cells(gates, prompt, layer, stream, rows)
        label = f"{prompt} \u00b7 layer {layer} \u00b7 {_stream_label(stream)}"
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
        + _legend_html(t, vmin, vmax, f"gate ({_stream_label(stream)}, layer {layer})")
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


# ------------------------------------------------------------------------------------ notebooks


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
) -> TokenView:
    """A ``TokenView`` of gates (prompt, position, token, is_image, layer, stream, gate [+ exposure]),
    checked now so that errors show where the view is made."""
    _view_setup(gates, prompts, layer)
    get_theme(theme)
    return TokenView(gates, prompts, layer, stream, rows, theme, title=title)
