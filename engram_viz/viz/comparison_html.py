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

Every piece is a macro of ``templates/comparison.html.j2`` (``viz.html_templates``: escaped as
``html.escape`` does), in the theme's colours.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
from markupsafe import Markup
from matplotlib import colormaps

from engram_viz.analysis.gates.comparison import AlignedDifference, PromptResult, aligned_difference
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.html_templates import macros
from engram_viz.viz.style import Theme, get_theme, text_color_on
from engram_viz.viz.token_labels import image_label, image_spans, token_label, token_labels
from engram_viz.viz.tokens import token_html

DIFF_FLOOR = 0.05  # the difference colour scale spans at least +-0.05
_M = macros("comparison.html.j2")


def _hex(rgba: np.ndarray) -> list[str]:
    """``[N, 4]`` floats in 0..1 -> '#rrggbb' strings."""
    rgb = np.clip(np.rint(np.asarray(rgba)[:, :3] * 255), 0, 255).astype(np.int64)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb]


def _diverging_cmap(theme: Theme):
    return colormaps["berlin" if theme.name == "dark" and "berlin" in colormaps else "RdBu_r"]


def _gradient(stops: list[str]) -> str:
    """A 140 px colour bar through ``stops`` (for a legend)."""
    return _M.gradient(stops)


def _grid_rows(colours: np.ndarray, cell: int) -> str:
    """``[rows, columns]`` colour strings -> rows of ``cell`` px squares."""
    return _M.grid_rows(colours.tolist(), cell)


def _grid_cell(tip: str, text: str, rows: str, width: int, colour: str | None = None) -> str:
    """One token (``text``, markup) with its grid ``rows`` below it; ``tip`` is its tooltip."""
    return _M.grid_cell(tip, Markup(text), Markup(rows), width, colour)


def panel_box(theme: Theme, inner: str, title: str = "") -> str:
    """``inner`` HTML in a themed panel, with a small ``title`` line above it when given."""
    return _M.panel(theme, Markup(inner), title)


def message_html(message: str, theme: str | Theme = "light", title: str = "") -> str:
    """A readable message box (inline CSS only)."""
    t = get_theme(theme)
    return panel_box(t, _M.message(t, message), title)


def header_html(pipeline: Pipeline, layer_ids: Sequence[int], hc: int, theme: Theme) -> str:
    """Which model and weights, residual streams, config, Engram layers and device made the view."""
    p = pipeline
    streams = p.streams_label or f"{p.streams_mode} streams"
    return panel_box(theme, _M.header(theme, str(p.model_label), streams, p.config.name, layer_ids, hc, p.device))


def gate_grid_html(
    result: PromptResult, layer_ids: Sequence[int], *, theme: str | Theme = "light", label: str = "", cell: int = 9
) -> str:
    """Every token with a small grid of all its gates below it: rows = Engram layers, columns =
    streams (``n_layers x hc_mult`` cells), coloured with the heatmap map (0..1); an image span is
    one grey cell labelled ``[image ×n]``. Wraps like text; each token's tooltip lists all its gates. Inline CSS only."""
    t = get_theme(theme)
    g = result.gates  # [T, L, hc]
    n, n_layers, hc = g.shape
    colours = np.array(_hex(t.heat_cmap(np.clip(g.reshape(-1), 0, 1)))).reshape(n, n_layers, hc)
    parts = []
    labels, notes = token_labels(result.pieces)
    spans = dict(image_spans(result.is_image))  # first -> last position of each image span
    grey = _grid_rows(np.full((n_layers, hc), t.image, dtype=object), cell)
    p = 0
    while p < n:
        if p in spans:  # one grey cell for the whole span
            k = spans[p] - p + 1
            tip = f"image span: positions {p}-{spans[p]} ({k} tokens); gates 0 (masked)"
            parts.append(_grid_cell(tip, html.escape(image_label(k)), grey, hc * cell, t.muted))
            p = spans[p] + 1
            continue
        piece = result.pieces[p]
        tip = [f"{piece!r}  position {p}", *([notes[p]] if p in notes else [])]
        tip += [
            f"layer {layer}: " + "  ".join(f"s{s} {g[p, li, s]:.3f}" for s in range(hc))
            for li, layer in enumerate(layer_ids)
        ]
        text = html.escape(labels[p])
        parts.append(_grid_cell("\n".join(tip), text, _grid_rows(colours[p], cell), hc * cell, t.foreground))
        p += 1
    legend = _M.grid_legend(t, layer_ids, hc, Markup(_gradient(_hex(t.heat_cmap(np.linspace(0, 1, 11))))))
    return panel_box(t, _M.grid(Markup("".join(parts)), Markup(legend)), label)


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


def _image_chip(run: list[tuple], labels: tuple[str, str], t: Theme) -> str:
    """One grey chip for a run of image positions (pairs ``(i, j, kind)``: B's span, paired with
    A's or not, or a span only A has); their gates are 0 (masked)."""
    sides = []
    for k, label in ((1, labels[1]), (0, labels[0])):
        pos = [p[k] for p in run if p[k] is not None]
        if pos:
            sides.append(f"{label} positions {min(pos)}-{max(pos)} ({len(pos)} tokens)")
    only = "" if len(sides) == 2 else f" (only in {labels[0] if run[0][1] is None else labels[1]})"
    n = max(sum(p[1] is not None for p in run), sum(p[0] is not None for p in run))
    return _M.image_chip(t, f"image span{only}: {'; '.join(sides)}; gates 0 (masked)", image_label(n))


def _deleted(piece: str, i: int, la: str, t: Theme) -> str:
    return _M.deleted(t, f"only in {la}: {piece!r} (position {i})", token_label(piece))


def _inserted(piece: str, j: int, labels: tuple[str, str], t: Theme) -> str:
    la, lb = labels
    tip = f"{piece!r}  {lb} position {j}: only in {lb} (no partner in {la})"
    return _M.inserted(t, tip, token_label(piece))


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
    piece, text = b.pieces[j], html.escape(token_label(b.pieces[j]))
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
    return _M.token(tip, _hex([rgba])[0], text_color_on(rgba), Markup(text))


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
        if _in_image_run(a, b, i, j):
            end = idx + 1
            while end < len(pairs) and _in_image_run(a, b, pairs[end][0], pairs[end][1]):
                end += 1
            parts.append(_image_chip(pairs[idx:end], labels, t))
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
    gradient = _gradient(_hex(colours.cmap(np.linspace(0, 1, 11))))
    legend = _M.difference_legend(t, labels, what, f"{scale:.3g}", Markup(gradient))
    text = _difference_text(summary, b, labels)
    body = _M.difference(t, text, Markup("".join(parts)), 1.1 if all_gates else 2.0, Markup(legend))
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
