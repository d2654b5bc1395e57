"""Prompt comparison: two (or more) prompts run through one Pipeline, their gates side by side with
a difference view, updating live, in the interactive gate view (``apps.gate_view.GateView``, an
anywidget component: JupyterLab, Jupyter Notebook, VS Code, Colab, marimo and ``engram-viz app``).

``PromptComparison(prompts=(a, b), pipeline=None)`` builds it; in a notebook the object shows
itself (``display(cmp)`` or as a cell's last expression; in marimo ``mo.ui.anywidget(cmp.widget)``);
``cmp.widget`` is the ``GateView``. Everything the view shows can be set and read from Python:

- ``set_prompts(a, b, ...)``, ``.prompts``; ``.layer``, ``.stream`` ('mean' / 'max' / 'min' or a
  stream index), ``.view`` ('tokens' or 'all gates'), ``.theme`` ('auto' follows the host page,
  'light', 'dark'; reads back as the theme in effect); ``insert_image(slot, '16x12' | '640x480px')``
  appends an ``<image:...>`` placeholder, ``insert_picture(slot, picture)`` a real picture (as the view's
  upload button does: ``apps.picture_upload``), whose span gets image features where the streams merge them;
- ``.html`` the whole view as one HTML string (inline CSS only: no scripts, no network), ``.panels``
  its parts by name, ``.messages`` the readable error of each bad prompt (None when fine),
  ``.traces`` the Trace of each good prompt, ``.difference`` the tidy difference table,
  ``.figures`` figures of the current state (built on first access: a ``TokenView``, plotly
  heatmaps, the difference heatmap), ``.last_update_ms``; ``export(fmt)`` the view as a file
  (html, png, pdf, or its settings as json: ``apps.view_export``).

**Views.** 'tokens': each prompt as token-coloured text at the chosen layer and stream; 'all gates':
under every token a grid of all ``n_layers x hc_mult`` gates. The difference view colours each of
B's tokens by ``gate_B - gate_A`` per aligned token (``engram_viz.analysis.gates.comparison``).
Clicking a token explains it (``.explainer``, ``apps.widget_explain``): its 24 rows with decoded
n-grams and shares of the gate, each with a button that ablates it and shows the change.

**Bad prompts** (empty, longer than ``max_chars``, lone surrogates / invalid UTF-8: see
``engram_viz.run.prompt_text``; an image grid over the model's limit, more than ``max_tokens``
tokens) put a readable message in that prompt's panel; the other prompts keep showing.

**Speed.** One Pipeline is reused; each prompt's Trace is cached by text (LRU,
``engram_viz.apps.prompt_cache``), so typing in one box reruns only that prompt, and switching
layer, stream, view or theme reruns nothing. ``benchmarks/widget_update.py`` measures an update.
anywidget is imported with this module, which ``import engram_viz`` does not import.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.analysis.gates.comparison import STREAM_REDUCTIONS, PromptResult, gate_difference
from engram_viz.apps.gate_view import THEME_CHOICES, GateView
from engram_viz.apps.picture_upload import MAX_UPLOAD_BYTES, answer_upload, picture_span, upload_folder
from engram_viz.apps.prompt_cache import MAX_TOKENS, PromptCache
from engram_viz.apps.view_export import answer_export, export_view
from engram_viz.apps.widget_explain import TokenExplainer
from engram_viz.errors import InputError
from engram_viz.run.images import ImagePromptError, parse_placeholder
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompt_text import MAX_CHARS, PromptInputError, check_prompt_text, without_lone_surrogates
from engram_viz.run.provenance import provenance_of
from engram_viz.viz import gate_difference_heatmap, gate_difference_interactive, gate_heatmap_interactive, token_view
from engram_viz.viz.comparison_html import difference_panel, header_html, prompt_panel
from engram_viz.viz.style import get_theme
from engram_viz.viz.view_payload import header_payload, prompt_payload, theme_payload

VIEWS = ("tokens", "all gates")
SLOTS = "ABCDEFGH"
DEFAULT_PAIR = (
    "Only Alexander the Great could tame the horse Bucephalus.",
    "Only Alexander the Small could tame the horse Bucephalus.",
)


def _short(text: str, n: int = 90) -> str:
    return text if len(text) <= n else text[: n - 1] + "\u2026"


def _check_count(n: int, what: str) -> None:
    if n < 2:
        raise InputError(f"{what} needs at least 2 prompts, got {n}")
    if n > len(SLOTS):
        raise InputError(f"a comparison shows at most {len(SLOTS)} prompts, got {n}")


class PromptComparison:
    """The prompt comparison (module docstring). ``pipeline``: a Pipeline to reuse (else one is
    made from ``checkpoint`` / ``$ENGRAM_VIZ_CHECKPOINT`` / the embedded default). ``picture_folder``: the
    one folder uploads go to and ``<image:NAME>`` pictures are read from (default ``<cache>/uploads``)."""

    def __init__(
        self,
        prompts: Sequence[str] = DEFAULT_PAIR,
        *,
        pipeline: Pipeline | None = None,
        checkpoint: Any = None,
        layer: int | None = None,
        stream: int | str = "mean",
        view: str = "tokens",
        theme: str = "auto",
        max_chars: int = MAX_CHARS,
        max_tokens: int = MAX_TOKENS,
        cache_size: int = 64,
        torch_threads: int | str | None = "auto",
        picture_folder: str | Path | None = None,
    ):
        _check_count(len(prompts), "a comparison")
        self.picture_folder = Path(picture_folder) if picture_folder is not None else upload_folder()
        self.pipeline = pipeline if pipeline is not None else Pipeline(checkpoint)
        self.layer_ids = tuple(int(x) for x in self.pipeline.layer_ids)
        self.hc = int(self.pipeline.config.hc_mult)
        self.max_chars = int(max_chars)
        cache = {"max_tokens": max_tokens, "size": cache_size, "torch_threads": torch_threads}
        self._cache = PromptCache(self.pipeline, folder=self.picture_folder, **cache)
        self._results: list[PromptResult] = []
        self._panels: dict[str, str] = {}
        self._summaries: dict[str, dict] = {}
        self._figures: dict[str, Any] | None = None
        self._payloads: dict[tuple[str, int], dict] = {}  # (slot, id of its result) -> what the view draws
        self._busy = False
        self._raw: dict[int, tuple[str, Any]] = {}
        self.last_update_ms = 0.0
        self.n_updates = 0
        self.widget = v = GateView(
            prompts=[str(p) for p in prompts],
            layer_ids=list(self.layer_ids),
            hc=self.hc,
            max_prompts=len(SLOTS),
            layer=self.layer_ids[0] if layer is None else self._check_layer(layer),
            stream=str(self._check_stream(stream)),
            view=self._check_view(view),
            theme=self._check_theme(theme),
            themes=theme_payload(),
            max_upload_bytes=MAX_UPLOAD_BYTES,
        )
        self.explainer = TokenExplainer(self)
        v.observe(self._on_change, names=["prompts", "layer", "stream", "view", "theme", "host_theme"])
        v.observe(self.explainer.on_selected, names="selected")
        v.observe(self.explainer.on_ablate_request, names="ablate_request")
        v.observe(self._on_export, names="export_request")
        v.observe(self._on_image_spec, names="image_spec")
        v.observe(lambda change: answer_upload(self, change["new"]), names="picture_upload")
        self._on_image_spec()
        if any(not isinstance(p, str) for p in prompts):
            self.set_prompts(*prompts)
        else:
            self.update()

    @property
    def max_tokens(self) -> int:
        return self._cache.max_tokens

    @property
    def torch_threads(self) -> int | None:
        """Torch intra-op threads of the view's forward (None: as set)."""
        return self._cache.torch_threads

    # -- checks -----------------------------------------------------------------------------------

    def _check_layer(self, layer: Any) -> int:
        try:
            layer = int(layer)
        except (TypeError, ValueError):
            raise InputError(f"layer must be one of the Engram layers {list(self.layer_ids)}, got {layer!r}") from None
        if layer not in self.layer_ids:
            raise InputError(f"layer {layer} is not an Engram layer; expected one of {list(self.layer_ids)}")
        return layer

    def _check_stream(self, stream: Any) -> int | str:
        if isinstance(stream, str) and stream.isdigit():
            stream = int(stream)
        if isinstance(stream, str) and stream in STREAM_REDUCTIONS:
            return stream
        if isinstance(stream, (int, np.integer)) and not isinstance(stream, bool) and 0 <= int(stream) < self.hc:
            return int(stream)
        raise InputError(
            f"stream must be one of {list(STREAM_REDUCTIONS)} or an int in 0..{self.hc - 1}, got {stream!r}"
        )

    def _check_slot(self, slot: str) -> None:
        if slot not in self.slots:
            raise InputError(f"slot {slot!r} unknown; expected one of {self.slots}")

    @staticmethod
    def _check_view(view: str) -> str:
        if view not in VIEWS:
            raise InputError(f"view must be one of {list(VIEWS)}, got {view!r}")
        return view

    @staticmethod
    def _check_theme(theme: str) -> str:
        if theme not in THEME_CHOICES:
            get_theme(theme)  # the one error for an unknown theme
        return str(theme)

    # -- what the view asks ------------------------------------------------------------------------

    def _on_change(self, change: Any = None) -> None:
        if not self._busy:
            self.update()

    def _on_export(self, change: Any) -> None:
        req = change["new"] or {}
        if req.get("format"):
            self.widget.export_file = answer_export(self, req)

    def _on_image_spec(self, change: Any = None) -> None:
        spec = self.widget.image_spec.strip()
        try:
            w, h, px = parse_placeholder(spec.removeprefix("<image:").removesuffix(">"), self.pipeline.config)
        except ImagePromptError as err:
            self.widget.image_info = str(err)
            return
        src = f"{px[0]}x{px[1]} px -> " if px else ""
        self.widget.image_info = f"{src}{w}x{h} grid: {w * h} image tokens, {h * (w + 1) + 2} positions"

    # -- state, readable and settable from Python -------------------------------------------------

    @property
    def slots(self) -> list[str]:
        return list(SLOTS[: len(self.widget.prompts)])

    @property
    def prompts(self) -> list[str]:
        return list(self.widget.prompts)

    def set_prompts(self, *prompts: Any) -> PromptComparison:
        """Set the prompts (``set_prompts(a, b)`` or ``set_prompts([a, b, c])``) and update once."""
        if len(prompts) == 1 and isinstance(prompts[0], (list, tuple)):
            prompts = tuple(prompts[0])
        _check_count(len(prompts), "set_prompts")
        self._raw = {}
        shown = []
        for k, p in enumerate(prompts):
            if not isinstance(p, str):  # bytes or another type: checked as given (until edited), shown as its repr
                self._raw[k] = (repr(p), p)
            shown.append(p if isinstance(p, str) else repr(p))
        self._busy = True
        try:
            self.widget.prompts = shown
        finally:
            self._busy = False
        self.update()
        return self

    def add_prompt(self, text: str = "") -> PromptComparison:
        """Add one more prompt box (compared against A)."""
        if len(self.widget.prompts) >= len(SLOTS):
            raise InputError(f"a comparison shows at most {len(SLOTS)} prompts")
        self.widget.prompts = [*self.widget.prompts, str(text)]  # the observer updates
        return self

    def _set(self, name: str, value: Any) -> None:
        if getattr(self.widget, name) != value:
            setattr(self.widget, name, value)  # the observer updates
        else:
            self.update()

    @property
    def layer(self) -> int:
        return int(self.widget.layer)

    @layer.setter
    def layer(self, value: int) -> None:
        self._set("layer", self._check_layer(value))

    @property
    def stream(self) -> int | str:
        return self._check_stream(self.widget.stream)

    @stream.setter
    def stream(self, value: int | str) -> None:
        self._set("stream", str(self._check_stream(value)))

    @property
    def view(self) -> str:
        return self.widget.view

    @view.setter
    def view(self, value: str) -> None:
        self._set("view", self._check_view(value))

    @property
    def theme(self) -> str:
        """The theme in effect: 'light' or 'dark' (the host's when the view's theme is 'auto')."""
        return self.widget.effective_theme

    @theme.setter
    def theme(self, value: str) -> None:
        self._set("theme", self._check_theme(value))

    def insert_image(self, slot: str = "A", spec: str = "16x12") -> str | None:
        """Append an ``<image:spec>`` placeholder (``'WxH'`` grid or ``'WxHpx'`` pixels) to prompt
        ``slot``; returns the placeholder, or None (and a message in the view) if ``spec`` is bad."""
        self._check_slot(slot)
        spec = str(spec).strip().removeprefix("<image:").removesuffix(">")
        try:
            parse_placeholder(spec, self.pipeline.config)
        except ImagePromptError as err:
            self.widget.image_info = str(err)
            return None
        return self._append(slot, f"<image:{spec}>")

    def insert_picture(self, slot: str, picture: Any, name: str | None = None) -> str | None:
        """Append a real picture (PNG/JPEG bytes, a path, a Pillow image) to prompt ``slot``, checked and
        stored (``picture_upload.picture_span``); returns its span, or None (one line in the view) if bad."""
        self._check_slot(slot)
        span = picture_span(self, slot, picture, name)
        return None if span is None else self._append(slot, span)

    def _append(self, slot: str, span: str) -> str:
        prompts = list(self.widget.prompts)
        k = self.slots.index(slot)
        sep = "" if not prompts[k] or prompts[k].endswith((" ", "\n")) else " "
        prompts[k] = f"{prompts[k]}{sep}{span} "
        self.widget.prompts = prompts  # the observer updates
        return span

    def export(self, fmt: str) -> dict:
        """The view as a file: ``{name, mime, data}`` (data base64) for 'html', 'png', 'pdf' or 'json'."""
        return export_view(self, fmt)

    # -- running ----------------------------------------------------------------------------------

    def _prepare(self, k: int, text: Any) -> tuple[str | None, str | None]:
        """(checked text, None) or (None, message)."""
        shown, raw = self._raw.get(k, (None, text))
        if shown != text:  # edited since set_prompts: the box's text counts
            raw = text
            if isinstance(text, str) and (sendable := without_lone_surrogates(text)) != text:
                # the box shows U+FFFD (the text can go back to the browser); the check sees the original
                self._raw[k] = (sendable, text)
                prompts = list(self.widget.prompts)
                prompts[k] = sendable
                self._busy = True
                try:
                    self.widget.prompts = prompts
                finally:
                    self._busy = False
        try:
            return check_prompt_text(raw, max_chars=self.max_chars, name=f"prompt {SLOTS[k]}"), None
        except PromptInputError as err:
            return None, str(err)

    def update(self) -> None:
        """Recompute what changed and redraw every panel (called by the view on any change)."""
        t0 = time.perf_counter()
        self.widget.busy = True
        texts = list(self.widget.prompts)
        prepared = [self._prepare(k, text) for k, text in enumerate(texts)]
        self._cache.run([text for text, _ in prepared if text is not None])
        results = []
        for k, (text, msg) in enumerate(prepared):
            if text is None:
                results.append(PromptResult(text=str(texts[k]), error=msg))
                continue
            res = self._cache.get(text)
            if res.error is not None and not res.error.startswith(f"prompt {SLOTS[k]}"):
                res = PromptResult(text=text, error=f"prompt {SLOTS[k]}: {res.error}")
            results.append(res)
        self._results = results
        self._figures = None
        self._render()
        self.explainer.refresh()
        self.last_update_ms = (time.perf_counter() - t0) * 1000
        self.n_updates += 1
        self.widget.status = self._status_text()
        self.widget.busy = False

    # -- drawing ----------------------------------------------------------------------------------

    def _render(self) -> None:
        t = get_theme(self.theme)
        panels: dict[str, str] = {"header": header_html(self.pipeline, self.layer_ids, self.hc, t)}
        where = {"layer": self.layer, "stream": self.stream, "all_gates": self.view == "all gates", "theme": t}
        for slot, res in zip(self.slots, self._results):
            panels[slot] = prompt_panel(res, slot, self.layer_ids, **where)
        self._summaries = {}
        ref = self._results[0]
        for slot, res in zip(self.slots[1:], self._results[1:]):
            key = f"diff {slot}-A"
            panels[key], summary = difference_panel(ref, res, slot, self.layer_ids, **where)
            if summary is not None:
                self._summaries[key] = summary
        self._panels = panels
        self._show(panels)

    def _show(self, panels: dict[str, str]) -> None:
        """Send the view what it draws: each prompt's payload (rebuilt only for new results), the
        difference panels and which model made them."""
        payloads = {}
        for slot, res in zip(self.slots, self._results):
            key = (slot, id(res))
            payloads[key] = self._payloads.get(key) or prompt_payload(res, slot, self.layer_ids)
        self._payloads = payloads
        self.widget.header = header_payload(self.pipeline)
        self.widget.panels = list(payloads.values())
        self.widget.diffs = {k: v for k, v in panels.items() if k.startswith("diff ")}

    def _status_text(self) -> str:
        bad = [r.error for r in self._results if not r.ok]
        ok = sum(r.ok for r in self._results)
        msg = f"{ok} of {len(self._results)} prompts shown; updated in {self.last_update_ms:.0f} ms"
        if bad:
            msg += f" - {len(bad)} need a fix (see the panels)"
        return msg

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
            raise InputError("no prompt runs: every prompt has an error (see .messages)")
        return pd.concat(parts, ignore_index=True)

    @property
    def figures(self) -> dict[str, Any]:
        """Figures of the current state, built on first access after each update: 'tokens' (a
        ``TokenView`` of all prompts that run: HTML + PNG, exportable), 'gates <slot>' (plotly
        stream x position heatmaps) and 'diff <slot>-A' (plotly and matplotlib difference heatmaps
        as 'diff B-A' and 'diff B-A (paper)')."""
        if self._figures is None:
            figs: dict[str, Any] = {}
            ok = [s for s, r in zip(self.slots, self._results) if r.ok]
            if ok:
                gates = self.gates_frame()
                title = _short(f"{self.pipeline.model_label}")
                figs["tokens"] = token_view(gates, layer=self.layer, stream=self.stream, theme=self.theme, title=title)
                for s in ok:
                    figs[f"gates {s}"] = gate_heatmap_interactive(gates, s, theme=self.theme)
            diff = provenance_of(self.pipeline).tag(self.difference)  # the figures stamp it
            for key in diff["compare"].unique() if len(diff) else []:
                sub = diff[diff["compare"] == key]
                figs[f"diff {key}"] = gate_difference_interactive(sub, theme=self.theme)
                figs[f"diff {key} (paper)"] = gate_difference_heatmap(sub, theme=self.theme).figure
            self._figures = figs
        return self._figures

    # -- display ------------------------------------------------------------------------------------

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude)
        if isinstance(bundle, tuple):  # anywidget answers (data, metadata)
            bundle = bundle[0]
        bundle = dict(bundle) if bundle else {}
        bundle.setdefault("text/html", self.html)  # a static view where widgets do not render
        bundle["text/plain"] = repr(self)
        return bundle

    def __repr__(self) -> str:
        return (
            f"PromptComparison({len(self.widget.prompts)} prompts, layer={self.layer}, stream={self.stream!r}, "
            f"view={self.view!r}, model={self.pipeline.model_label!r})"
        )


def app(checkpoint: Any = None, prompts: Sequence[str] | None = None, **kwargs: Any) -> PromptComparison:
    """The comparison for a standalone page: one call, the view in ``.widget``."""
    if prompts is None:
        return PromptComparison(checkpoint=checkpoint, **kwargs)
    return PromptComparison(prompts, checkpoint=checkpoint, **kwargs)
