"""Prompt comparison: an ipywidgets 8 app that runs two (or more) prompts through one Pipeline and
shows their gates side by side, with a difference view, updating live.

``PromptComparison(prompts=(a, b), pipeline=None)`` builds the app; in a notebook the object shows
itself (``display(cmp)`` or as a cell's last expression); ``cmp.widget`` is the ipywidgets tree
(what a standalone page such as Voila serves). Everything the app shows can be set and read from
Python, without a browser:

- ``set_prompts(a, b, ...)``, ``.prompts``; ``.layer``, ``.stream`` ('mean' / 'max' / 'min' or a
  stream index), ``.view`` ('tokens' or 'all gates'), ``.theme`` ('light' / 'dark');
  ``insert_image(slot, '16x12' | '640x480px')`` appends an ``<image:...>`` placeholder;
- ``.html`` the whole view as one HTML string (inline CSS only: no scripts, no network), ``.panels``
  its parts by name, ``.messages`` the readable error of each bad prompt (None when fine),
  ``.traces`` the Trace of each good prompt, ``.difference`` the tidy difference table,
  ``.figures`` figures of the current state (built on first access: a ``TokenView``, plotly
  heatmaps, the difference heatmap), ``.last_update_ms``.

**Views.** 'tokens': each prompt as token-coloured text (``plots.token_html``) at the chosen
layer and stream. 'all gates': under every token a small grid of all ``n_layers x hc_mult``
gates (rows = layers, columns = streams; 2 x 4 = 8 on V4.1-Flash), coloured with the heatmap map.

**The difference view: per aligned token position.** Prompt B's tokens are aligned to prompt A's
by a longest-matching-blocks alignment of their raw token ids (``difflib``; ``align_tokens``):
tokens in matching blocks pair up, a replaced block pairs position by position up to the shorter
side, and inserted tokens have no partner. Each paired B token is coloured by ``gate_B - gate_A``
(same layer and stream; in the 'all gates' view every layer x stream) on a diverging map scaled
to the largest absolute difference (at least 0.05); unpaired tokens get a dashed outline and A's
deleted tokens show struck through. Aligning tokens rather than raw positions keeps an edit from
shifting every later comparison; and since a position's Engram gate reads only its own stream
and the <= 4-token n-grams ending there, the difference view shows how far an edit reaches (with
the embedding streams: exactly 3 tokens past it; with a whole model's streams, further).

**Bad prompts** (empty, longer than ``max_chars``, lone surrogates / invalid UTF-8, an image grid
over the model's limit, more than ``max_tokens`` tokens) put a readable message in that prompt's
panel; the other prompts keep showing and the app keeps working.

**Speed.** One Pipeline is reused; each prompt's Trace and tidy frame are cached by text (LRU),
so typing in one box reruns only that prompt, and switching layer, stream, view or theme reruns
nothing. On the CPU a small model (dim <= 512, e.g. the embedded default) runs its forward on one
torch thread (``torch_threads='auto'``; restored afterwards): for tensors this small, intra-op
threads cost more than they give, several times more on a busy machine. Collision exposure is
not computed (the notebooks show it). ``benchmarks/widget_update.py`` measures an update.
"""

from __future__ import annotations

import difflib
import functools
import html
import os
import re
import time
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.run.images import ImagePromptError, parse_placeholder
from engram_viz.viz.style import HTML_FONT_STACK, Theme, display_piece, get_theme, text_color_on
from engram_viz.viz.tokens import token_html

VIEWS = ("tokens", "all gates")
STREAM_REDUCTIONS = ("mean", "max", "min")
MAX_CHARS = 20_000
MAX_TOKENS = 2_048
DIFF_FLOOR = 0.05  # the difference colour scale spans at least +-0.05
ENV_CHECKPOINT = "ENGRAM_VIZ_CHECKPOINT"
SMALL_DIM = 512  # models up to this width run the widget's forward on one torch thread (CPU)
SLOTS = "ABCDEFGH"
DEFAULT_PAIR = (
    "Only Alexander the Great could tame the horse Bucephalus.",
    "Only Alexander the Small could tame the horse Bucephalus.",
)


_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


class PromptInputError(ValueError):
    """A prompt the comparison cannot run; the message is shown in the widget."""


# --------------------------------------------------------------------------------------- checks


def check_prompt_text(text: Any, *, max_chars: int = MAX_CHARS, name: str = "prompt") -> str:
    """``text`` as a str the tokenizer takes, or a :class:`PromptInputError` that says what is wrong
    and what is expected (bytes are decoded as strict UTF-8)."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise PromptInputError(
                f"{name} is not valid UTF-8: byte 0x{bytes(text)[err.start]:02x} at offset {err.start} "
                "cannot be decoded; paste plain text"
            ) from None
    if not isinstance(text, str):
        raise PromptInputError(f"{name} must be text (a str), got {type(text).__name__}")
    if not text.strip():
        raise PromptInputError(f"{name} is empty: type some text (image placeholders like <image:16x12> work too)")
    if len(text) > max_chars:
        raise PromptInputError(
            f"{name} has {len(text):,} characters; the comparison takes at most {max_chars:,}. "
            "Shorten it, or run long texts with Pipeline.run in a notebook"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        raise PromptInputError(
            f"{name} holds U+{ord(bad):04X} at character {err.start}, a lone surrogate that is not valid UTF-8 "
            "(often pasted from a broken source); delete it"
        ) from None
    return text


# ------------------------------------------------------------------------------------ alignment


def align_tokens(ids_a: Sequence[int], ids_b: Sequence[int]) -> list[tuple[int | None, int | None, str]]:
    """Align two token sequences: ``[(position_a | None, position_b | None, kind)]`` in reading order,
    kind 'equal' (same token), 'replace' (paired position by position inside a replaced block),
    'insert' (only in B) or 'delete' (only in A). Longest matching blocks of ``difflib``, no junk
    heuristic, so the result depends only on the two sequences."""
    a, b = [int(x) for x in ids_a], [int(x) for x in ids_b]
    out: list[tuple[int | None, int | None, str]] = []
    for op, i0, i1, j0, j1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out += [(i0 + k, j0 + k, "equal") for k in range(i1 - i0)]
        elif op == "replace":
            n = min(i1 - i0, j1 - j0)
            out += [(i0 + k, j0 + k, "replace") for k in range(n)]
            out += [(i, None, "delete") for i in range(i0 + n, i1)]
            out += [(None, j, "insert") for j in range(j0 + n, j1)]
        elif op == "delete":
            out += [(i, None, "delete") for i in range(i0, i1)]
        else:
            out += [(None, j, "insert") for j in range(j0, j1)]
    return out


@dataclass
class PromptResult:
    """One prompt as the comparison sees it: its single-prompt Trace and arrays, or its error."""

    text: str
    trace: Any = None  # engram_viz.run.trace.Trace with one prompt
    gates: np.ndarray | None = None  # float32 [T, n_layers, hc]
    input_ids: np.ndarray | None = None  # int64 [T]
    pieces: list[str] | None = None
    is_image: np.ndarray | None = None  # bool [T]
    error: str | None = None

    def __post_init__(self) -> None:
        self._frames: dict[Any, pd.DataFrame] = {}

    @property
    def ok(self) -> bool:
        return self.error is None

    def layer_frame(self, layer: int, prompt: str) -> pd.DataFrame:
        """Tidy gates of one layer (prompt, position, token, is_image, layer, stream, gate), built
        straight from the arrays (cached): what ``plots.token_html`` reads."""
        key = (int(layer), prompt)
        if key not in self._frames:
            li = list(self.trace.layer_ids).index(int(layer))
            g = self.gates[:, li]  # [T, hc]
            n, hc = g.shape
            self._frames[key] = pd.DataFrame(
                {
                    "prompt": prompt,
                    "position": np.repeat(np.arange(n, dtype=np.int64), hc),
                    "token": np.repeat(np.array(self.pieces, dtype=object), hc),
                    "is_image": np.repeat(self.is_image, hc),
                    "layer": int(layer),
                    "stream": np.tile(np.arange(hc, dtype=np.int64), n),
                    "gate": g.reshape(-1).astype(np.float64),
                }
            )
        return self._frames[key]

    def frame(self, prompt: str) -> pd.DataFrame:
        """Tidy gates of every layer (``Trace.to_frame('gates')``), the prompt column set to ``prompt``."""
        if prompt not in self._frames:
            self._frames[prompt] = self.trace.to_frame("gates").assign(prompt=prompt)
        return self._frames[prompt]


def _reduce(g: np.ndarray, stream: int | str) -> np.ndarray:
    """``[T, hc] -> [T]``: one stream, or the mean / max / min over streams."""
    if isinstance(stream, str):
        return {"mean": np.mean, "max": np.max, "min": np.min}[stream](g, axis=-1)
    return g[..., int(stream)]


def gate_difference(
    a: PromptResult, b: PromptResult, layer_ids: Sequence[int], *, label_a: str = "A", label_b: str = "B"
) -> pd.DataFrame:
    """Tidy difference table of two prompts, one row per (aligned pair, layer, stream):
    pair, kind, position_a, position_b, token_a, token_b, layer, stream, gate_a, gate_b, diff
    (``gate_b - gate_a``; NaN where a side has no partner). Image positions compare as 0 - 0."""
    pairs = align_tokens(a.input_ids, b.input_ids)
    n_layers, hc = a.gates.shape[1:]
    recs = []
    for k, (i, j, kind) in enumerate(pairs):
        ga = a.gates[i] if i is not None else np.full((n_layers, hc), np.nan, np.float32)
        gb = b.gates[j] if j is not None else np.full((n_layers, hc), np.nan, np.float32)
        recs.append((k, kind, -1 if i is None else i, -1 if j is None else j,
                     "" if i is None else a.pieces[i], "" if j is None else b.pieces[j], ga, gb))  # fmt: skip
    n = len(recs)
    if n == 0:
        return pd.DataFrame(columns=["pair", "kind", "position_a", "position_b", "token_a", "token_b", "layer",
                                     "stream", "gate_a", "gate_b", "diff"])  # fmt: skip
    rep = n_layers * hc
    ga = np.stack([r[6] for r in recs]).reshape(-1)
    gb = np.stack([r[7] for r in recs]).reshape(-1)
    df = pd.DataFrame(
        {
            "pair": np.repeat([r[0] for r in recs], rep),
            "kind": np.repeat(np.array([r[1] for r in recs], dtype=object), rep),
            "position_a": np.repeat([r[2] for r in recs], rep),
            "position_b": np.repeat([r[3] for r in recs], rep),
            "token_a": np.repeat(np.array([r[4] for r in recs], dtype=object), rep),
            "token_b": np.repeat(np.array([r[5] for r in recs], dtype=object), rep),
            "layer": np.tile(np.repeat(np.asarray(layer_ids, dtype=np.int64), hc), n),
            "stream": np.tile(np.arange(hc), n * n_layers),
            "gate_a": ga.astype(np.float64),
            "gate_b": gb.astype(np.float64),
        }
    )
    df["diff"] = df["gate_b"] - df["gate_a"]
    df.attrs["prompts"] = (label_a, label_b)
    return df


# ------------------------------------------------------------------------------------ HTML views


def _hex(rgba: np.ndarray) -> list[str]:
    """``[N, 4]`` floats in 0..1 -> '#rrggbb' strings."""
    rgb = np.clip(np.rint(np.asarray(rgba)[:, :3] * 255), 0, 255).astype(np.int64)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb]


def _diverging_cmap(theme: Theme):
    from matplotlib import colormaps

    return colormaps["berlin" if theme.name == "dark" and "berlin" in colormaps else "RdBu_r"]


def _box(theme: Theme, inner: str, title: str = "") -> str:
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
    return _box(
        t,
        f'<div class="ev-message" style="background:{bg};border:1px solid {border};border-radius:6px;'
        f'padding:8px 12px;font-size:14px;white-space:pre-wrap">{html.escape(message)}</div>',
        title,
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
        rows = []
        for li, layer in enumerate(layer_ids):
            tip.append(f"layer {layer}: " + "  ".join(f"s{s} {g[p, li, s]:.3f}" for s in range(hc)))
            cells = "".join(
                f'<span style="display:inline-block;width:{cell}px;height:{cell}px;background:'
                f'{t.image if img else colours[p, li, s]}"></span>'
                for s in range(hc)
            )
            rows.append(f'<div style="line-height:0;height:{cell}px">{cells}</div>')
        text = html.escape(display_piece(piece)) if not img else "&#9633;"
        parts.append(
            f'<span class="ev-cell" title="{html.escape(chr(10).join(tip), quote=True)}" style="display:inline-block;'
            f'vertical-align:top;margin:0 2px 6px 0;text-align:center">'
            f'<span style="display:block;font-size:13px;white-space:pre;min-width:{hc * cell}px;'
            f'color:{t.muted if img else t.foreground}">{text}</span>{"".join(rows)}</span>'
        )
    legend_stops = ", ".join(_hex(t.heat_cmap(np.linspace(0, 1, 11))))
    legend = (
        f'<div style="font-size:12px;color:{t.muted};margin-top:6px">all gates: rows = layers '
        f"{', '.join(str(x) for x in layer_ids)}, columns = streams 0-{hc - 1}; 0 "
        f'<span style="display:inline-block;width:140px;height:9px;vertical-align:middle;'
        f'background:linear-gradient(to right, {legend_stops})"></span> 1</div>'
    )
    return _box(t, '<div style="line-height:1.1">' + "".join(parts) + "</div>" + legend, label)


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
    cmap = _diverging_cmap(t)
    la, lb = labels
    li = list(layer_ids).index(int(layer))
    pairs = align_tokens(a.input_ids, b.input_ids)
    paired = [(i, j) for i, j, kind in pairs if i is not None and j is not None]
    if all_gates:
        da = np.stack([a.gates[i] for i, _ in paired]) if paired else np.zeros((0, *a.gates.shape[1:]))
        db = np.stack([b.gates[j] for _, j in paired]) if paired else np.zeros((0, *b.gates.shape[1:]))
        d_all = db - da  # [P, L, hc]
        scale_src = d_all
    else:
        va, vb = _reduce(a.gates[:, li], stream), _reduce(b.gates[:, li], stream)
        d_sel = np.array([vb[j] - va[i] for i, j in paired], dtype=np.float64)
        scale_src = d_sel
    scale = max(DIFF_FLOOR, float(np.abs(scale_src).max()) if scale_src.size else 0.0)
    norm = lambda v: np.clip((np.asarray(v, dtype=np.float64) + scale) / (2 * scale), 0, 1)
    sel_colours = None if all_gates else cmap(norm(d_sel)) if len(d_sel) else np.zeros((0, 4))
    parts, k = [], 0
    biggest = (0.0, None)
    changed = 0

    def in_image_run(pair: tuple[int | None, int | None, str]) -> bool:
        """B image position paired with an A image position or nothing; or an A image position deleted."""
        pi, pj, _ = pair
        if pj is not None:
            return bool(b.is_image[pj]) and (pi is None or bool(a.is_image[pi]))
        return pi is not None and bool(a.is_image[pi])

    idx = 0
    while idx < len(pairs):
        i, j, kind = pairs[idx]
        idx += 1
        if j is not None and in_image_run((i, j, kind)):  # one grey chip per image span (gates 0 in both)
            js = [j]
            k += i is not None
            while idx < len(pairs) and in_image_run(pairs[idx]):
                pi, pj, _ = pairs[idx]
                if pj is not None:
                    js.append(pj)
                    k += pi is not None
                idx += 1
            tip = f"image span: {lb} positions {min(js)}-{max(js)} ({len(js)} tokens); gates 0 (masked) in both"
            parts.append(
                f'<span class="ev-img" title="{html.escape(tip, quote=True)}" style="background:{t.image};'
                f'color:{t.muted};font-style:italic;padding:0.15em 0.08em;margin-right:1px;border-radius:2px">'
                f"[image \u00d7{len(js)}]</span>"
            )
            continue
        if j is None:  # deleted from A
            parts.append(
                f'<span class="ev-del" title="{html.escape(f"only in {la}: {a.pieces[i]!r} (position {i})", quote=True)}"'
                f' style="text-decoration:line-through;color:{t.muted};padding:0.1em 0.08em;margin-right:1px;'
                f'font-size:0.85em">{html.escape(display_piece(a.pieces[i]))}</span>'
            )
            continue
        piece = b.pieces[j]
        text = html.escape(display_piece(piece))
        if i is None:
            tip = f"{piece!r}  {lb} position {j}: only in {lb} (no partner in {la})"
            parts.append(
                f'<span class="ev-ins" title="{html.escape(tip, quote=True)}" style="border:1px dashed '
                f'{t.muted};padding:0.1em 0.08em;margin-right:1px;border-radius:2px">{text}</span>'
            )
            continue
        if all_gates:
            d = d_all[k]
            mag = float(np.abs(d).max())
            lines = [f"{piece!r}  {lb} position {j} <-> {la} position {i} {a.pieces[i]!r} ({kind})"]
            lines += [
                f"layer {layer_ids[x]}: " + "  ".join(f"s{s} {d[x, s]:+.3f}" for s in range(d.shape[1]))
                for x in range(d.shape[0])
            ]
            colours = np.array(_hex(cmap(norm(d.reshape(-1))))).reshape(d.shape)
            rows = "".join(
                f'<div style="line-height:0;height:{cell}px">'
                + "".join(
                    f'<span style="display:inline-block;width:{cell}px;height:{cell}px;background:{colours[x, s]}">'
                    "</span>"
                    for s in range(d.shape[1])
                )
                + "</div>"
                for x in range(d.shape[0])
            )
            parts.append(
                f'<span class="ev-cell" title="{html.escape(chr(10).join(lines), quote=True)}" style="display:'
                f'inline-block;vertical-align:top;margin:0 2px 6px 0;text-align:center"><span style="display:block;'
                f'font-size:13px;white-space:pre;min-width:{d.shape[1] * cell}px">{text}</span>{rows}</span>'
            )
        else:
            d = float(d_sel[k])
            mag = abs(d)
            rgba = tuple(float(x) for x in sel_colours[k])
            tip = (
                f"{piece!r}  {lb} position {j} <-> {la} position {i} {a.pieces[i]!r} ({kind})\n"
                f"gate {la} {va[i]:.3f} -> {lb} {vb[j]:.3f}: {d:+.4f}"
            )
            parts.append(
                f'<span class="ev-tok" title="{html.escape(tip, quote=True)}" style="background:{_hex([rgba])[0]};'
                f'color:{text_color_on(rgba)};padding:0.15em 0.08em;margin-right:1px;border-radius:2px">{text}</span>'
            )
        if mag > 1e-6:
            changed += 1
        if mag > biggest[0]:
            biggest = (mag, (i, j))
        k += 1
    counts = {kind: sum(1 for *_, kd in pairs if kd == kind) for kind in ("equal", "replace", "insert", "delete")}
    what = "all layers x streams" if all_gates else f"layer {layer}, {_stream_text(stream)}"
    stops = ", ".join(_hex(cmap(np.linspace(0, 1, 11))))
    summary = {
        "aligned": len(paired),
        **counts,
        "changed": changed,
        "scale": scale,
        "max_abs_diff": biggest[0],
        "max_at": biggest[1],
    }
    at = ""
    if biggest[1] is not None and biggest[0] > 1e-6:
        i, j = biggest[1]
        at = f"; largest |diff| {biggest[0]:.3f} at {lb} position {j} {b.pieces[j]!r}"
    head = (
        f"{len(paired)} aligned tokens ({counts['equal']} equal, {counts['replace']} replaced), {counts['insert']} "
        f"only in {lb}, {counts['delete']} only in {la}; {changed} aligned tokens with a different gate{at}"
    )
    legend = (
        f'<div style="font-size:12px;color:{t.muted};margin-top:8px">gate {lb} - gate {la} ({what}): '
        f'-{scale:.3g} <span style="display:inline-block;width:140px;height:9px;vertical-align:middle;'
        f'background:linear-gradient(to right, {stops})"></span> +{scale:.3g}; dashed = only in {lb}, '
        f"struck through = only in {la}</div>"
    )
    body = (
        f'<div style="font-size:13px;margin-bottom:6px">{html.escape(head)}</div>'
        f'<div style="white-space:pre-wrap;word-break:break-word;line-height:{1.1 if all_gates else 2.0};'
        f'font-size:15px">' + "".join(parts) + "</div>" + legend
    )
    return _box(t, body, f"difference {lb} - {la} per aligned token ({what})"), summary


def _stream_text(stream: int | str) -> str:
    return f"stream {stream}" if not isinstance(stream, str) else f"{stream} of streams"


# ------------------------------------------------------------------------------------ the app


@functools.cache
def _prompt_box_class() -> type:
    """``ipywidgets.Textarea`` whose value the kernel does not echo back to the browser. A browser
    can send text holding a lone surrogate (invalid UTF-8, pasted from a broken source); the kernel
    cannot send it back (its messages are UTF-8 JSON), and ipywidgets' echo, sent before the value
    is set, would fail and drop the edit silently instead of letting the app say what is wrong."""
    import ipywidgets as W
    from traitlets import Unicode

    class PromptBox(W.Textarea):
        value = Unicode(help="String value").tag(sync=True, echo_update=False)

    return PromptBox


def pipeline_from_env(checkpoint: Any = None, **kwargs: Any):
    """A Pipeline on ``checkpoint``, else on the folder named by ``$ENGRAM_VIZ_CHECKPOINT``, else on
    the embedded default weights."""
    from engram_viz.run.pipeline import Pipeline

    if checkpoint is None:
        checkpoint = os.environ.get(ENV_CHECKPOINT) or None
    return Pipeline(checkpoint, **kwargs)


class PromptComparison:
    """The prompt-comparison app (module docstring). ``pipeline``: a Pipeline to reuse (else one is
    made from ``checkpoint`` / ``$ENGRAM_VIZ_CHECKPOINT`` / the embedded default)."""

    def __init__(
        self,
        prompts: Sequence[str] = DEFAULT_PAIR,
        *,
        pipeline: Any = None,
        checkpoint: Any = None,
        layer: int | None = None,
        stream: int | str = "mean",
        view: str = "tokens",
        theme: str = "light",
        max_chars: int = MAX_CHARS,
        max_tokens: int = MAX_TOKENS,
        continuous_update: bool = True,
        cache_size: int = 64,
        torch_threads: int | str | None = "auto",
    ):
        import ipywidgets as W

        if len(prompts) < 2:
            raise ValueError(f"a comparison needs at least 2 prompts, got {len(prompts)}")
        if len(prompts) > len(SLOTS):
            raise ValueError(f"a comparison shows at most {len(SLOTS)} prompts, got {len(prompts)}")
        self.pipeline = pipeline if pipeline is not None else pipeline_from_env(checkpoint)
        self.layer_ids = tuple(int(x) for x in self.pipeline.layer_ids)
        self.hc = int(self.pipeline.config.hc_mult)
        self.max_chars, self.max_tokens = int(max_chars), int(max_tokens)
        if torch_threads == "auto":  # small models: intra-op threads cost more than they give
            torch_threads = 1 if self.pipeline.config.dim <= SMALL_DIM and self.pipeline.device.type == "cpu" else None
        self.torch_threads = torch_threads
        self._cache: OrderedDict[str, PromptResult] = OrderedDict()
        self._cache_size = int(cache_size)
        self._results: list[PromptResult] = []
        self._panels: dict[str, str] = {}
        self._summaries: dict[str, dict] = {}
        self._figures: dict[str, Any] | None = None
        self._busy = False
        self._raw: dict[int, tuple[str, Any]] = {}
        self.last_update_ms = 0.0
        self.n_updates = 0

        self._W = W
        self._boxes: list[Any] = []
        self._layer_w = W.Dropdown(description="layer", layout=W.Layout(width="150px"))
        self._layer_w.options = [(str(x), x) for x in self.layer_ids]
        self._stream_w = W.Dropdown(
            options=[(s, s) for s in STREAM_REDUCTIONS] + [(f"stream {s}", s) for s in range(self.hc)],
            description="stream",
            layout=W.Layout(width="190px"),
        )
        self._view_w = W.ToggleButtons(options=list(VIEWS), description="view", style={"button_width": "90px"})
        self._theme_w = W.Dropdown(options=["light", "dark"], description="theme", layout=W.Layout(width="160px"))
        self._image_spec_w = W.Text(value="16x12", description="image", placeholder="WxH or WxHpx",
                                    layout=W.Layout(width="210px"))  # fmt: skip
        self._image_target_w = W.Dropdown(description="into", layout=W.Layout(width="130px"))
        self._image_button = W.Button(description="insert image", icon="image", tooltip="append <image:WxH>")
        self._image_info_w = W.HTML()
        self._add_button = W.Button(description="add prompt", icon="plus")
        self._header_w = W.HTML()
        self._status_w = W.HTML()
        self._panels_box = W.HBox(layout=W.Layout(width="100%", align_items="flex-start"))
        self._diff_box = W.VBox(layout=W.Layout(width="100%"))
        self._prompt_row = W.HBox(layout=W.Layout(width="100%"))
        self._continuous = bool(continuous_update)

        for p in prompts:
            self._new_box(p)
        self._layer_w.value = self.layer_ids[0] if layer is None else self._check_layer(layer)
        self._stream_w.value = self._check_stream(stream)
        self._view_w.value = self._check_view(view)
        self._theme_w.value = get_theme(theme).name
        for w in (self._layer_w, self._stream_w, self._view_w, self._theme_w):
            w.observe(self._on_change, names="value")
        self._image_button.on_click(lambda _: self.insert_image(self._image_target_w.value, self._image_spec_w.value))
        self._add_button.on_click(lambda _: self.add_prompt(""))
        self._image_spec_w.observe(self._on_image_spec, names="value")
        self._on_image_spec()
        self.widget = W.VBox(
            [
                self._header_w,
                self._prompt_row,
                W.HBox([self._layer_w, self._stream_w, self._theme_w, self._add_button]),
                self._view_w,
                W.HBox([self._image_spec_w, self._image_target_w, self._image_button, self._image_info_w]),
                self._status_w,
                self._panels_box,
                self._diff_box,
            ],
            layout=W.Layout(width="100%"),
        )
        self.update()

    # -- widgets ----------------------------------------------------------------------------------

    def _new_box(self, text: str) -> None:
        W = self._W
        slot = SLOTS[len(self._boxes)]
        box = _prompt_box_class()(
            value=str(text),
            description=slot,
            placeholder=f"prompt {slot}: text, with <image:WxH> placeholders if you like",
            continuous_update=self._continuous,
            layout=W.Layout(width="auto", flex="1 1 0", height="90px"),
            style={"description_width": "18px"},
        )
        box.observe(self._on_change, names="value")
        self._boxes.append(box)
        self._prompt_row.children = tuple(self._boxes)
        self._set_targets()

    def _set_targets(self) -> None:
        """The 'into' dropdown lists the prompt slots and always has one selected (A by default)."""
        keep = self._image_target_w.value
        self._image_target_w.options = list(SLOTS[: len(self._boxes)])
        self._image_target_w.value = keep if keep in self._image_target_w.options else SLOTS[0]

    def _check_layer(self, layer: Any) -> int:
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            raise ValueError(f"layer must be one of the Engram layers {list(self.layer_ids)}, got {layer!r}") from None
        if layer not in self.layer_ids:
            raise ValueError(f"layer {layer} is not an Engram layer; expected one of {list(self.layer_ids)}")
        return layer

    def _check_stream(self, stream: Any) -> int | str:
        if isinstance(stream, str) and stream in STREAM_REDUCTIONS:
            return stream
        if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool) and 0 <= int(stream) < self.hc:
            return int(stream)
        raise ValueError(
            f"stream must be one of {list(STREAM_REDUCTIONS)} or an int in 0..{self.hc - 1}, got {stream!r}"
        )

    @staticmethod
    def _check_view(view: str) -> str:
        if view not in VIEWS:
            raise ValueError(f"view must be one of {list(VIEWS)}, got {view!r}")
        return view

    def _on_change(self, change: Any = None) -> None:
        if not self._busy:
            self.update()

    def _on_image_spec(self, change: Any = None) -> None:
        spec = self._image_spec_w.value.strip()
        try:
            w, h, px = parse_placeholder(spec.removeprefix("<image:").removesuffix(">"), self.pipeline.config)
        except ImagePromptError as err:
            self._image_info_w.value = f'<span style="color:#b35900">{html.escape(str(err))}</span>'
            return
        src = f"{px[0]}x{px[1]} px -> " if px else ""
        self._image_info_w.value = (
            f'<span style="color:#666">{src}{w}x{h} grid: {w * h} image tokens, {h * (w + 1) + 2} positions</span>'
        )

    # -- state, readable and settable from Python -------------------------------------------------

    @property
    def slots(self) -> list[str]:
        return list(SLOTS[: len(self._boxes)])

    @property
    def prompts(self) -> list[str]:
        return [b.value for b in self._boxes]

    def set_prompts(self, *prompts: Any) -> PromptComparison:
        """Set the prompts (``set_prompts(a, b)`` or ``set_prompts([a, b, c])``) and update once."""
        if len(prompts) == 1 and isinstance(prompts[0], (list, tuple)):
            prompts = tuple(prompts[0])
        if len(prompts) < 2:
            raise ValueError(f"set_prompts needs at least 2 prompts, got {len(prompts)}")
        if len(prompts) > len(SLOTS):
            raise ValueError(f"a comparison shows at most {len(SLOTS)} prompts, got {len(prompts)}")
        self._busy = True
        try:
            while len(self._boxes) < len(prompts):
                self._new_box("")
            if len(self._boxes) > len(prompts):
                self._boxes = self._boxes[: len(prompts)]
                self._prompt_row.children = tuple(self._boxes)
                self._set_targets()
            self._raw = {}
            for k, (box, p) in enumerate(zip(self._boxes, prompts)):
                if isinstance(p, str):
                    box.value = p
                else:  # bytes or another type: checked as given (until the box is edited), shown as its repr
                    self._raw[k] = (repr(p), p)
                    box.value = repr(p)
        finally:
            self._busy = False
        self.update()
        return self

    def add_prompt(self, text: str = "") -> PromptComparison:
        """Add one more prompt box (compared against A)."""
        if len(self._boxes) >= len(SLOTS):
            raise ValueError(f"a comparison shows at most {len(SLOTS)} prompts")
        self._busy = True
        try:
            self._new_box(text)
        finally:
            self._busy = False
        self.update()
        return self

    def _set(self, w: Any, value: Any) -> None:
        if w.value != value:
            w.value = value  # the observer updates
        else:
            self.update()

    @property
    def layer(self) -> int:
        return int(self._layer_w.value)

    @layer.setter
    def layer(self, value: int) -> None:
        self._set(self._layer_w, self._check_layer(value))

    @property
    def stream(self) -> int | str:
        return self._stream_w.value

    @stream.setter
    def stream(self, value: int | str) -> None:
        self._set(self._stream_w, self._check_stream(value))

    @property
    def view(self) -> str:
        return self._view_w.value

    @view.setter
    def view(self, value: str) -> None:
        self._set(self._view_w, self._check_view(value))

    @property
    def theme(self) -> str:
        return self._theme_w.value

    @theme.setter
    def theme(self, value: str) -> None:
        self._set(self._theme_w, get_theme(value).name)

    def insert_image(self, slot: str = "A", spec: str = "16x12") -> str | None:
        """Append an ``<image:spec>`` placeholder (``'WxH'`` grid or ``'WxHpx'`` pixels) to prompt
        ``slot``; returns the placeholder, or None (and a message in the widget) if ``spec`` is bad."""
        if slot not in self.slots:
            raise ValueError(f"slot {slot!r} unknown; expected one of {self.slots}")
        spec = str(spec).strip().removeprefix("<image:").removesuffix(">")
        try:
            parse_placeholder(spec, self.pipeline.config)
        except ImagePromptError as err:
            self._image_info_w.value = f'<span style="color:#b35900">{html.escape(str(err))}</span>'
            return None
        placeholder = f"<image:{spec}>"
        box = self._boxes[self.slots.index(slot)]
        sep = "" if not box.value or box.value.endswith((" ", "\n")) else " "
        box.value = f"{box.value}{sep}{placeholder} "  # the observer updates
        return placeholder

    # -- running ----------------------------------------------------------------------------------

    def _prepare(self, k: int, text: Any) -> tuple[str | None, str | None]:
        """(checked text, None) or (None, message)."""
        shown, raw = self._raw.get(k, (None, text))
        if shown != text:  # edited since set_prompts: the box's text counts
            raw = text
            if isinstance(text, str) and _LONE_SURROGATE.search(text):
                # the box shows U+FFFD (the text can go back to the browser); the check sees the original
                self._raw[k] = (_LONE_SURROGATE.sub("\ufffd", text), text)
                self._busy = True
                try:
                    self._boxes[k].value = self._raw[k][0]
                finally:
                    self._busy = False
        try:
            return check_prompt_text(raw, max_chars=self.max_chars, name=f"prompt {SLOTS[k]}"), None
        except PromptInputError as err:
            return None, str(err)

    def _run(self, texts: list[str]) -> None:
        """Run the texts not in the cache, in one batch when they are fine, one by one otherwise."""
        todo = [t for t in dict.fromkeys(texts) if t not in self._cache]
        if not todo:
            return
        built, errors = [], {}
        for t in todo:
            try:
                p = self.pipeline.build([{"id": "_", "text": t}])[0]
            except Exception as err:  # noqa: BLE001 - any bad prompt becomes a message
                errors[t] = _readable(err)
                continue
            if len(p.input_ids) > self.max_tokens:
                errors[t] = (
                    f"{len(p.input_ids):,} tokens (image spans included); the comparison takes at most "
                    f"{self.max_tokens:,}. Shorten it or use smaller image grids"
                )
                continue
            built.append((t, p))
        if built:
            try:
                with _torch_threads(self.torch_threads):
                    trace = self.pipeline.run(
                        [{"id": f"_{i}", "text": t, "input_ids": p.input_ids, "token_types": p.token_types}
                         for i, (t, p) in enumerate(built)],
                        exposure=False,
                    )  # fmt: skip
            except Exception as err:  # noqa: BLE001
                for t, _ in built:
                    errors[t] = _readable(err)
            else:
                gates = trace.gates.numpy()
                for i, (t, _) in enumerate(built):
                    n = int(trace.lengths[i])
                    pid = f"_{i}"
                    self._store(
                        t,
                        PromptResult(
                            text=t,
                            trace=trace.select([pid]) if len(built) > 1 else trace,
                            gates=gates[i, :n].astype(np.float32),
                            input_ids=trace.input_ids[i, :n].numpy(),
                            pieces=list(trace.pieces[i]),
                            is_image=trace.is_image[i, :n].numpy(),
                        ),
                    )
        for t, msg in errors.items():
            self._store(t, PromptResult(text=t, error=msg))

    def _store(self, text: str, result: PromptResult) -> None:
        self._cache[text] = result
        self._cache.move_to_end(text)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def update(self) -> None:
        """Recompute what changed and redraw every panel (called by the widgets on any change)."""
        t0 = time.perf_counter()
        texts, results = [], []
        pending = []
        for k, box in enumerate(self._boxes):
            text, msg = self._prepare(k, box.value)
            texts.append(text)
            pending.append(msg)
        self._run([t for t in texts if t is not None])
        for k, (text, msg) in enumerate(zip(texts, pending)):
            if text is None:
                results.append(PromptResult(text=str(self._boxes[k].value), error=msg))
            else:
                res = self._cache[text]
                self._cache.move_to_end(text)
                if res.error is not None and not res.error.startswith(f"prompt {SLOTS[k]}"):
                    res = PromptResult(text=text, error=f"prompt {SLOTS[k]}: {res.error}")
                results.append(res)
        self._results = results
        self._figures = None
        self._render()
        self.last_update_ms = (time.perf_counter() - t0) * 1000
        self.n_updates += 1
        self._status_w.value = self._status_html()

    # -- drawing ----------------------------------------------------------------------------------

    def _render(self) -> None:
        t = get_theme(self.theme)
        W = self._W
        panels: dict[str, str] = {"header": self._header_html(t)}
        layer, stream, all_gates = self.layer, self.stream, self.view == "all gates"
        for slot, res in zip(self.slots, self._results):
            if not res.ok:
                panels[slot] = message_html(res.error, t, f"prompt {slot}")
            elif all_gates:
                panels[slot] = gate_grid_html(res, self.layer_ids, theme=t, label=f"prompt {slot} - all gates")
            else:
                frame = res.layer_frame(layer, f"prompt {slot}")
                panels[slot] = token_html(frame, layer=layer, stream=stream, theme=t, full_page=False, fontsize=15.0)
        self._summaries = {}
        ref = self._results[0]
        for slot, res in zip(self.slots[1:], self._results[1:]):
            key = f"diff {slot}-A"
            if not (ref.ok and res.ok):
                bad = [s for s, r in (("A", ref), (slot, res)) if not r.ok]
                panels[key] = message_html(
                    f"the difference needs both prompts; fix prompt {' and '.join(bad)} first", t, key
                )
                continue
            panels[key], self._summaries[key] = difference_html(
                ref, res, self.layer_ids, layer=layer, stream=stream, all_gates=all_gates, theme=t, labels=("A", slot)
            )
        self._panels = panels
        self._header_w.value = panels["header"]
        boxes = []
        width = f"{100 / len(self.slots):.2f}%"
        for slot in self.slots:
            boxes.append(W.HTML(value=panels[slot], layout=W.Layout(width=width, overflow="auto")))
        self._panels_box.children = tuple(boxes)
        self._diff_box.children = tuple(W.HTML(value=panels[k]) for k in panels if k.startswith("diff "))

    def _header_html(self, t: Theme) -> str:
        p = self.pipeline
        streams = p.streams_label or f"{p.streams_mode} streams"
        return _box(
            t,
            f'<div style="font-size:13px"><b>Model and weights:</b> {html.escape(str(p.model_label))}<br>'
            f"<b>Residual streams:</b> {html.escape(streams)}<br>"
            f'<span style="color:{t.muted}">config {html.escape(p.config.name)}, Engram layers '
            f"{', '.join(map(str, self.layer_ids))}, {self.hc} streams, device {p.device}</span></div>",
        )

    def _status_html(self) -> str:
        bad = [r.error for r in self._results if not r.ok]
        ok = sum(r.ok for r in self._results)
        msg = f"{ok} of {len(self._results)} prompts shown; updated in {self.last_update_ms:.0f} ms"
        if bad:
            msg += f" - {len(bad)} need a fix (see the panels)"
        return f'<div class="ev-status" style="font-size:12px;color:#666">{html.escape(msg)}</div>'

    # -- read-back ----------------------------------------------------------------------------------

    @property
    def panels(self) -> dict[str, str]:
        """HTML of each part: 'header', one per slot ('A', 'B', ...), one per difference ('diff B-A')."""
        return dict(self._panels)

    @property
    def html(self) -> str:
        """The whole current view as one HTML fragment (inline CSS only, no scripts)."""
        return "\n".join(self._panels.values())

    @property
    def messages(self) -> dict[str, str | None]:
        """slot -> the readable error of that prompt, or None when it runs."""
        return {s: r.error for s, r in zip(self.slots, self._results)}

    @property
    def traces(self) -> dict[str, Any]:
        """slot -> the Trace of each prompt that runs (prompt id '_0', one prompt each)."""
        return {s: r.trace for s, r in zip(self.slots, self._results) if r.ok}

    @property
    def results(self) -> dict[str, PromptResult]:
        return dict(zip(self.slots, self._results))

    @property
    def summaries(self) -> dict[str, dict]:
        """'diff B-A' -> aligned / equal / replace / insert / delete / changed counts, scale, max_abs_diff."""
        return dict(self._summaries)

    @property
    def difference(self) -> pd.DataFrame:
        """Tidy difference table of B (and C, ...) against A, all layers and streams (``gate_difference``),
        with a column 'compare' ('B-A', ...); empty when prompt A or all others fail."""
        ref, parts = self._results[0], []
        for slot, res in zip(self.slots[1:], self._results[1:]):
            if ref.ok and res.ok:
                df = gate_difference(ref, res, self.layer_ids, label_b=slot)
                df.insert(0, "compare", f"{slot}-A")
                parts.append(df)
        return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

    def gates_frame(self) -> pd.DataFrame:
        """Tidy gates of every prompt that runs, the prompt column holding its slot ('A', 'B', ...)."""
        parts = [r.frame(s) for s, r in zip(self.slots, self._results) if r.ok]
        if not parts:
            raise ValueError("no prompt runs: every prompt has an error (see .messages)")
        return pd.concat(parts, ignore_index=True)

    @property
    def figures(self) -> dict[str, Any]:
        """Figures of the current state, built on first access after each update: 'tokens' (a
        ``TokenView`` of all prompts that run: HTML + PNG, exportable), 'gates <slot>' (plotly
        stream x position heatmaps) and 'diff <slot>-A' (plotly and matplotlib difference heatmaps
        as 'diff B-A' and 'diff B-A (paper)')."""
        if self._figures is None:
            from engram_viz.viz import (
                gate_difference_heatmap,
                gate_difference_interactive,
                gate_heatmap_interactive,
                token_view,
            )

            figs: dict[str, Any] = {}
            ok = [(s, r) for s, r in zip(self.slots, self._results) if r.ok]
            if ok:
                gates = self.gates_frame()
                title = f"{self.pipeline.model_label}"
                figs["tokens"] = token_view(
                    gates, layer=self.layer, stream=self.stream, theme=self.theme, title=_short(title)
                )
                for s, _ in ok:
                    figs[f"gates {s}"] = gate_heatmap_interactive(gates, s, theme=self.theme)
            diff = self.difference
            for key in diff["compare"].unique() if len(diff) else []:
                sub = diff[diff["compare"] == key]
                figs[f"diff {key}"] = gate_difference_interactive(sub, theme=self.theme)
                figs[f"diff {key} (paper)"] = gate_difference_heatmap(sub, theme=self.theme)
            self._figures = figs
        return self._figures

    # -- display ------------------------------------------------------------------------------------

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        bundle = dict(bundle) if bundle else {}
        bundle.setdefault("text/html", self.html)  # a static view where widgets do not render
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        return (
            f"PromptComparison({len(self._boxes)} prompts, layer={self.layer}, stream={self.stream!r}, "
            f"view={self.view!r}, model={self.pipeline.model_label!r})"
        )


@contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``n`` torch intra-op threads (None: as set), restoring the setting afterwards."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(int(n))
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _readable(err: BaseException) -> str:
    """One line for the widget: the exception's own message (its type when it has none)."""
    msg = str(err).strip() or type(err).__name__
    if isinstance(err, UnicodeError):
        msg = f"the text is not valid UTF-8 ({msg})"
    return msg


def app(checkpoint: Any = None, prompts: Sequence[str] | None = None, **kwargs: Any) -> PromptComparison:
    """The comparison app for a standalone page (Voila): one call, the widget in ``.widget``."""
    if prompts is None:
        return PromptComparison(checkpoint=checkpoint, **kwargs)
    return PromptComparison(prompts, checkpoint=checkpoint, **kwargs)
