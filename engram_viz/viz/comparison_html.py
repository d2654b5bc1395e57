"""HTML views of a prompt comparison (inline CSS only: no scripts, no network).

- ``prompt_panel(result, slot, ...)``: one prompt as token-coloured text at one layer and stream
  (``viz.tokens.token_html``), or, in the 'all gates' view, ``gate_grid_html``: under every token
  a small grid of all ``n_layers x hc_mult`` gates (rows = layers, columns = streams).
- ``difference_html(a, b, ...)``: B's tokens coloured by ``gate_B - gate_A`` per aligned token
  (``analysis.gates.comparison``) on a diverging map scaled to the largest absolute difference (at
  least ``DIFF_FLOOR``); unpaired tokens get a dashed outline, A's deleted tokens show struck
  through and each image span shows as one grey chip (its gates are 0 in both).
- ``message_html(message)``: a readable message box (a prompt that cannot run);
  ``header_html(pipeline, ...)``: which model, weights and streams made the view.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib import colormaps

from engram_viz.analysis.gates.comparison import AlignedDifference, PromptResult, aligned_difference
from engram_viz.viz.style import HTML_FONT_STACK, Theme, display_piece, get_theme, text_color_on
from engram_viz.viz.tokens import token_html

DIFF_FLOOR = 0.05  # the difference colour scale spans at least +-0.05


def _hex(rgba: np.ndarray) -> list[str]:
    """``[N, 4]`` floats in 0..1 -> '#rrggbb' strings."""
    rgb = np.clip(np.rint(np.asarray(rgba)[:, :3] * 255), 0, 255).astype(np.int64)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb]


def _diverging_cmap(theme: Theme):
    return colormaps["berlin" if theme.name == "dark" and "berlin" in colormaps else "RdBu_r"]


def _gradient(stops: list[str]) -> str:
    """A 140 px colour bar through ``stops`` (for a legend)."""
    return (
        '<span style="display:inline-block;width:140px;height:9px;vertical-align:middle;'
        f'background:linear-gradient(to right, {", ".join(stops)})"></span>'
    )


def _grid_rows(colours: np.ndarray, cell: int) -> str:
    """``[rows, columns]`` colour strings -> rows of ``cell`` px squares."""
    return "".join(
        f'<div style="line-height:0;height:{cell}px">'
        + "".join(
            f'<span style="display:inline-block;width:{cell}px;height:{cell}px;background:{c}"></span>' for c in row
        )
        + "</div>"
        for row in colours
    )


def _grid_cell(tip: str, text: str, rows: str, width: int, colour: str | None = None) -> str:
    """One token (escaped ``text``) with its grid ``rows`` below it; ``tip`` is its tooltip."""
    colour_css = f";color:{colour}" if colour is not None else ""
    return (
        f'<span class="ev-cell" title="{html.escape(tip, quote=True)}" style="display:inline-block;'
        f'vertical-align:top;margin:0 2px 6px 0;text-align:center"><span style="display:block;font-size:13px;'
        f'white-space:pre;min-width:{width}px{colour_css}">{text}</span>{rows}</span>'
    )


def panel_box(theme: Theme, inner: str, title: str = "") -> str:
    """``inner`` HTML in a themed panel, with a small ``title`` line above it when given."""
    head = (
        f'<div style="font-size:12px;color:{theme.muted};margin-bottom:4px">{html.escape(title)}</div>' if title else ""
    )
    return (
        f'<div class="ev-panel" style="background:{theme.background};color:{theme.foreground};padding:10px 12px;'
        f'font-family:{html.escape(HTML_FONT_STACK, quote=True)}">{head}{inner}</div>'
    )


def message_html(message: str, theme: str | Theme = "light", title: str = "") -> str:
    """A readable message box (inline CSS only)."""
    t = get_theme(theme)
    bg, border = ("#fff4e5", "#f0b35b") if t.name == "light" else ("#3a2c14", "#b07a2a")
    return panel_box(
        t,
        f'<div class="ev-message" style="background:{bg};border:1px solid {border};border-radius:6px;'
        f'padding:8px 12px;font-size:14px;white-space:pre-wrap">{html.escape(message)}</div>',
        title,
    )


def header_html(pipeline: Any, layer_ids: Sequence[int], hc: int, theme: Theme) -> str:
    """Which model and weights, residual streams, config, Engram layers and device made the view."""
    p = pipeline
    streams = p.streams_label or f"{p.streams_mode} streams"
    return panel_box(
        theme,
        f'<div style="font-size:13px"><b>Model and weights:</b> {html.escape(str(p.model_label))}<br>'
        f"<b>Residual streams:</b> {html.escape(streams)}<br>"
        f'<span style="color:{theme.muted}">config {html.escape(p.config.name)}, Engram layers '
        f"{', '.join(map(str, layer_ids))}, {hc} streams, device {p.device}</span></div>",
    )


def gate_grid_html(
    result: PromptResult, layer_ids: Sequence[int], *, theme: str | Theme = "light", label: str = "", cell: int = 9
) -> str:
    """Every token with a small grid of all its gates below it: rows = Engram layers, columns =
    streams (``n_layers x hc_mult`` cells), coloured with the heatmap map (0..1); image positions
    grey. Wraps like text; each token's tooltip lists all its gates. Inline CSS only."""
    t = get_theme(theme)
    g = result.gates  # [T, L, hc]
    n, n_layers, hc = g.shape
    colours = np.array(_hex(t.heat_cmap(np.clip(g.reshape(-1), 0, 1)))).reshape(n, n_layers, hc)
    parts = []
    for p in range(n):
        img = bool(result.is_image[p])
        piece = result.pieces[p]
        tip = [f"{piece!r}  position {p}" + ("  (image: gates shut)" if img else "")]
        tip += [
            f"layer {layer}: " + "  ".join(f"s{s} {g[p, li, s]:.3f}" for s in range(hc))
            for li, layer in enumerate(layer_ids)
        ]
        rows = _grid_rows(np.full((n_layers, hc), t.image, dtype=object) if img else colours[p], cell)
        text = html.escape(display_piece(piece)) if not img else "&#9633;"
        parts.append(_grid_cell("\n".join(tip), text, rows, hc * cell, t.muted if img else t.foreground))
    legend = (
        f'<div style="font-size:12px;color:{t.muted};margin-top:6px">all gates: rows = layers '
        f"{', '.join(str(x) for x in layer_ids)}, columns = streams 0-{hc - 1}; 0 "
        f"{_gradient(_hex(t.heat_cmap(np.linspace(0, 1, 11))))} 1</div>"
    )
    return panel_box(t, '<div style="line-height:1.1">' + "".join(parts) + "</div>" + legend, label)


def prompt_panel(
    result: PromptResult,
    slot: str,
    layer_ids: Sequence[int],
    *,
    layer: int,
    stream: int | str,
    all_gates: bool,
    theme: Theme,
) -> str:
    """Prompt ``slot``'s panel: its message when it cannot run, else its gates ('tokens' or 'all gates')."""
    if not result.ok:
        return message_html(result.error, theme, f"prompt {slot}")
    if all_gates:
        return gate_grid_html(result, layer_ids, theme=theme, label=f"prompt {slot} - all gates")
    frame = result.layer_frame(layer, f"prompt {slot}")
    return token_html(frame, layer=layer, stream=stream, theme=theme, full_page=False, fontsize=15.0)


def _in_image_run(a: PromptResult, b: PromptResult, i: int | None, j: int | None) -> bool:
    """B image position paired with an A image position or nothing; or an A image position deleted."""
    if j is not None:
        return bool(b.is_image[j]) and (i is None or bool(a.is_image[i]))
    return i is not None and bool(a.is_image[i])


def _image_chip(positions: list[int], lb: str, t: Theme) -> str:
    """One grey chip for an image span of B (its gates are 0 in both prompts)."""
    span = f"{min(positions)}-{max(positions)} ({len(positions)} tokens)"
    tip = f"image span: {lb} positions {span}; gates 0 (masked) in both"
    return (
        f'<span class="ev-img" title="{html.escape(tip, quote=True)}" style="background:{t.image};'
        f'color:{t.muted};font-style:italic;padding:0.15em 0.08em;margin-right:1px;border-radius:2px">'
        f"[image \u00d7{len(positions)}]</span>"
    )


def _deleted(piece: str, i: int, la: str, t: Theme) -> str:
    tip = f"only in {la}: {piece!r} (position {i})"
    return (
        f'<span class="ev-del" title="{html.escape(tip, quote=True)}" style="text-decoration:line-through;'
        f'color:{t.muted};padding:0.1em 0.08em;margin-right:1px;font-size:0.85em">'
        f"{html.escape(display_piece(piece))}</span>"
    )


def _inserted(piece: str, j: int, labels: tuple[str, str], t: Theme) -> str:
    la, lb = labels
    tip = f"{piece!r}  {lb} position {j}: only in {lb} (no partner in {la})"
    return (
        f'<span class="ev-ins" title="{html.escape(tip, quote=True)}" style="border:1px dashed '
        f'{t.muted};padding:0.1em 0.08em;margin-right:1px;border-radius:2px">{html.escape(display_piece(piece))}</span>'
    )


class _DifferenceColours:
    """Colours of ``gate_B - gate_A`` on the theme's diverging map, scaled to +-``scale``;
    ``tokens[k]``: RGBA of paired token ``k`` (one layer and stream; None for all gates)."""

    def __init__(self, t: Theme, d: AlignedDifference, scale: float):
        self.cmap, self.scale = _diverging_cmap(t), scale
        self.tokens = None if d.all_gates else self.rgba(d.diff) if len(d.diff) else np.zeros((0, 4))

    def rgba(self, values: np.ndarray) -> np.ndarray:
        norm = np.clip((np.asarray(values, dtype=np.float64) + self.scale) / (2 * self.scale), 0, 1)
        return self.cmap(norm)

    def hex(self, values: np.ndarray) -> list[str]:
        return _hex(self.rgba(values.reshape(-1)))


def _paired(
    d: AlignedDifference,
    k: int,
    kind: str,
    a: PromptResult,
    b: PromptResult,
    colours: _DifferenceColours,
    layer_ids: Sequence[int],
    labels: tuple[str, str],
    cell: int,
) -> str:
    """Paired token ``k`` of B coloured by its difference: one chip, or a grid of all its gates."""
    (i, j), la, lb = d.paired[k], *labels
    piece, text = b.pieces[j], html.escape(display_piece(b.pieces[j]))
    head = f"{piece!r}  {lb} position {j} <-> {la} position {i} {a.pieces[i]!r} ({kind})"
    if d.all_gates:
        diff = d.diff[k]  # [L, hc]
        lines = [head] + [
            f"layer {layer_ids[x]}: " + "  ".join(f"s{s} {diff[x, s]:+.3f}" for s in range(diff.shape[1]))
            for x in range(diff.shape[0])
        ]
        rows = _grid_rows(np.array(colours.hex(diff)).reshape(diff.shape), cell)
        return _grid_cell("\n".join(lines), text, rows, diff.shape[1] * cell)
    value = float(d.diff[k])
    rgba = tuple(float(x) for x in colours.tokens[k])
    tip = f"{head}\ngate {la} {d.gate_a[i]:.3f} -> {lb} {d.gate_b[j]:.3f}: {value:+.4f}"
    return (
        f'<span class="ev-tok" title="{html.escape(tip, quote=True)}" style="background:{_hex([rgba])[0]};'
        f'color:{text_color_on(rgba)};padding:0.15em 0.08em;margin-right:1px;border-radius:2px">{text}</span>'
    )


def _difference_tokens(
    a: PromptResult,
    b: PromptResult,
    d: AlignedDifference,
    colours: _DifferenceColours,
    layer_ids: Sequence[int],
    labels: tuple[str, str],
    t: Theme,
    cell: int,
) -> list[str]:
    """HTML of every aligned pair in reading order (one chip per image span)."""
    k_of = {pair: k for k, pair in enumerate(d.paired)}
    parts, idx, pairs = [], 0, d.pairs
    while idx < len(pairs):
        i, j, kind = pairs[idx]
        if j is not None and _in_image_run(a, b, i, j):
            end = idx + 1
            while end < len(pairs) and _in_image_run(a, b, pairs[end][0], pairs[end][1]):
                end += 1
            parts.append(_image_chip([pj for _, pj, _ in pairs[idx:end] if pj is not None], labels[1], t))
            idx = end
            continue
        idx += 1
        if j is None:
            parts.append(_deleted(a.pieces[i], i, labels[0], t))
        elif i is None:
            parts.append(_inserted(b.pieces[j], j, labels, t))
        else:
            parts.append(_paired(d, k_of[(i, j)], kind, a, b, colours, layer_ids, labels, cell))
    return parts


def _difference_summary(a: PromptResult, b: PromptResult, d: AlignedDifference, scale: float) -> dict:
    """Aligned / equal / replace / insert / delete counts, tokens with a different gate (image spans
    aside), the colour scale and the largest difference with its (position_a, position_b)."""
    changed, biggest = 0, (0.0, None)
    for k, (i, j) in enumerate(d.paired):
        if _in_image_run(a, b, i, j):
            continue
        mag = d.magnitude(k)
        if mag > 1e-6:
            changed += 1
        if mag > biggest[0]:
            biggest = (mag, (i, j))
    return {
        "aligned": len(d.paired),
        **d.counts(),
        "changed": changed,
        "scale": scale,
        "max_abs_diff": biggest[0],
        "max_at": biggest[1],
    }


def _difference_text(summary: dict, b: PromptResult, labels: tuple[str, str]) -> str:
    """One line: how many tokens align, differ, exist on one side only; where the largest difference is."""
    la, lb = labels
    at = ""
    if summary["max_at"] is not None and summary["max_abs_diff"] > 1e-6:
        j = summary["max_at"][1]
        at = f"; largest |diff| {summary['max_abs_diff']:.3f} at {lb} position {j} {b.pieces[j]!r}"
    return (
        f"{summary['aligned']} aligned tokens ({summary['equal']} equal, {summary['replace']} replaced), "
        f"{summary['insert']} only in {lb}, {summary['delete']} only in {la}; {summary['changed']} aligned tokens "
        f"with a different gate{at}"
    )


def _stream_text(stream: int | str) -> str:
    return f"stream {stream}" if not isinstance(stream, str) else f"{stream} of streams"


def difference_html(
    a: PromptResult,
    b: PromptResult,
    layer_ids: Sequence[int],
    *,
    layer: int,
    stream: int | str = "mean",
    all_gates: bool = False,
    theme: str | Theme = "light",
    labels: tuple[str, str] = ("A", "B"),
    cell: int = 9,
) -> tuple[str, dict]:
    """The difference view of B against A (module docstring): B's tokens coloured by
    ``gate_B - gate_A`` per aligned token; returns ``(html, summary)`` where summary holds
    aligned / inserted / deleted counts, the scale and the largest difference."""
    t = get_theme(theme)
    la, lb = labels
    d = aligned_difference(a, b, layer_ids, layer=layer, stream=stream, all_gates=all_gates)
    scale = max(DIFF_FLOOR, float(np.abs(d.diff).max()) if d.diff.size else 0.0)
    colours = _DifferenceColours(t, d, scale)
    parts = _difference_tokens(a, b, d, colours, layer_ids, labels, t, cell)
    summary = _difference_summary(a, b, d, scale)
    what = "all layers x streams" if all_gates else f"layer {layer}, {_stream_text(stream)}"
    legend = (
        f'<div style="font-size:12px;color:{t.muted};margin-top:8px">gate {lb} - gate {la} ({what}): '
        f"-{scale:.3g} {_gradient(_hex(colours.cmap(np.linspace(0, 1, 11))))} +{scale:.3g}; dashed = only in {lb}, "
        f"struck through = only in {la}</div>"
    )
    body = (
        f'<div style="font-size:13px;margin-bottom:6px">{html.escape(_difference_text(summary, b, labels))}</div>'
        f'<div style="white-space:pre-wrap;word-break:break-word;line-height:{1.1 if all_gates else 2.0};'
        f'font-size:15px">' + "".join(parts) + "</div>" + legend
    )
    return panel_box(t, body, f"difference {lb} - {la} per aligned token ({what})"), summary


def difference_panel(
    ref: PromptResult,
    res: PromptResult,
    slot: str,
    layer_ids: Sequence[int],
    *,
    layer: int,
    stream: int | str,
    all_gates: bool,
    theme: Theme,
) -> tuple[str, dict | None]:
    """Panel 'diff <slot>-A' and its summary, or a message (summary None) when either prompt fails."""
    key = f"diff {slot}-A"
    if not (ref.ok and res.ok):
        bad = [s for s, r in (("A", ref), (slot, res)) if not r.ok]
        return message_html(
            f"the difference needs both prompts; fix prompt {' and '.join(bad)} first", theme, key
        ), None
    return difference_html(
        ref, res, layer_ids, layer=layer, stream=stream, all_gates=all_gates, theme=theme, labels=("A", slot)
    )
