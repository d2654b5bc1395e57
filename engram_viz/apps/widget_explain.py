"""Explain one token of the comparison's prompt A, and ablate one of its rows: the comparison app's
lower section (:class:`TokenExplainer`, built by :class:`~engram_viz.apps.widget.PromptComparison`).

- **Pick a token**: a dropdown of prompt A's text tokens (the panels are HTML widgets, which cannot
  report a click without custom JavaScript, and the page runs no scripts of its own).
- **Its 24 rows** at the comparison's layer: owner (n-gram order, head), row id, the decoded n-gram,
  its share of the gate's ``dot`` (the chosen stream; averaged over the streams for a reduction)
  and the gate with that row left out (``analysis.explain.explanation``: exact, see ``analysis.explain.attribution``).
  Prompt A is explained once per text (shares of every position); the left-out gates of a
  position are computed when it is picked.
- **Ablate a row**: pick one of the 24 and press 'ablate row': prompt A runs again with that row
  zeroed through the row-edit overlay (``weights.row_edits.edit_tables``: nothing is written, the
  table reads as stored afterwards, so the comparison's cached results stay true) and the
  difference view (``viz.comparison_html.difference_html``) colours A's tokens by
  ``gate(ablated) - gate(A)``. 'restore' clears it; a new text, layer, stream or theme redraws it.

Everything can be driven from Python: ``select(position)``, ``rows_frame()``, ``ablate(column)``,
``restore()``, ``.summary`` (the difference's counts), ``.rows_html`` / ``.diff_html`` values.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from markupsafe import Markup

from engram_viz.analysis.explain.explanation import Explanation, explain
from engram_viz.analysis.gates.comparison import PromptResult
from engram_viz.errors import InputError
from engram_viz.run.counterfactual import engram_tables
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.comparison_html import difference_html, message_html, panel_box
from engram_viz.viz.html_templates import macros, table_html
from engram_viz.viz.style import get_theme
from engram_viz.viz.token_labels import token_label, token_labels
from engram_viz.weights.row_edits import ZERO, edit_tables

ROW_VIEW_COLUMNS = ("column", "order", "head", "row", "ngram", "share", "loo_gate", "gate")
NO_TOKEN = ("pick a token of A", None)
_M = macros("widget.html.j2")


def row_view(ex: Explanation, position: int, layer: int, stream: int | str) -> pd.DataFrame:
    """The 24 rows of ``position`` at ``layer`` (:data:`ROW_VIEW_COLUMNS`): ``share`` = the row's
    ``dot_share / dot`` (one stream, or the mean over streams for 'mean' / 'max' / 'min'),
    ``loo_gate`` and ``gate`` the same way."""
    df = ex.rows_frame(position, layer)
    if not isinstance(stream, str):
        df = df[df["stream"] == stream]
    df = df.assign(share=np.where(df["dot"] != 0, df["dot_share"] / df["dot"].where(df["dot"] != 0, 1.0), 0.0))
    keys = ["column", "order", "head", "row", "ngram"]
    out = df.groupby(keys, sort=False)[["share", "loo_gate", "gate"]].mean().reset_index()
    return out[list(ROW_VIEW_COLUMNS)]


def run_ablated(pipeline: Pipeline, text: str, layer: int, row: int) -> PromptResult:
    """``text`` run through ``pipeline`` with row ``row`` of ``layer``'s table zeroed (overlay only)."""
    with edit_tables(engram_tables(pipeline), {int(layer): {int(row): ZERO}}):
        trace = pipeline.run([{"id": "A", "text": text}])
    return PromptResult.from_trace(text, trace)


def rows_table_html(rows: pd.DataFrame, token: str, position: int, layer: int, stream: Any, theme: Any) -> str:
    """The 24 rows as an HTML table (inline CSS), each share with a signed bar."""
    t = get_theme(theme)
    scale = max(float(rows["share"].abs().max()), 1e-9)
    bars = [_M.bar(round(60 * abs(s) / scale), t.negative if s < 0 else t.positive) for s in rows["share"].tolist()]
    shown = pd.DataFrame(
        {
            "col": rows["column"].tolist(),
            "order": [f"{o}-gram" for o in rows["order"].tolist()],
            "head": [f"h{h}" for h in rows["head"].tolist()],
            "row": rows["row"].tolist(),
            "n-gram": [repr(g) for g in rows["ngram"].tolist()],
            "share of dot": pd.Series(
                [Markup(f"{100 * s:+.1f}% {bar}") for s, bar in zip(rows["share"].tolist(), bars)],
                dtype=object,  # keeps the cells Markup
            ),
            "gate without": [f"{g:.4f}" for g in rows["loo_gate"].tolist()],
        }
    )
    table = table_html(
        shown,
        max_rows=len(shown),
        css_class="ev-rows",
        style=f"border-collapse:collapse;font-size:12px;color:{t.foreground}",
        row_attrs={"class": ["ev-row"] * len(shown), "data-column": shown["col"].tolist()},
    )
    what = f"stream {stream}" if not isinstance(stream, str) else "mean of streams"
    gate = float(rows["gate"].iloc[0]) if len(rows) else float("nan")
    body = _M.rows(t, repr(token_label(token)), position, layer, what, f"{gate:.4f}", table)
    return panel_box(t, body, f"the 24 rows of position {position}")


class TokenExplainer:
    """The 'explain a token' section of a :class:`~engram_viz.apps.widget.PromptComparison`
    (module docstring). ``widget`` is its ipywidgets tree; :meth:`refresh` follows the comparison."""

    def __init__(self, comparison: Any):
        import ipywidgets as W

        self.cmp = comparison
        self.position = W.Dropdown(description="explain", options=[NO_TOKEN], layout=W.Layout(width="320px"))
        self.row = W.Dropdown(description="row", options=[], layout=W.Layout(width="460px"))
        self.ablate_button = W.Button(description="ablate row", icon="eraser", disabled=True)
        self.restore_button = W.Button(description="restore", icon="undo", disabled=True)
        self.rows_html = W.HTML()
        self.diff_html = W.HTML()
        controls = W.HBox([self.position, self.row, self.ablate_button, self.restore_button])
        self.widget = W.VBox([controls, self.rows_html, self.diff_html], layout=W.Layout(width="100%"))
        for w, name in (
            (self.widget, "ev-explainer"),
            (self.position, "ev-explain-token"),
            (self.row, "ev-explain-row"),
        ):
            w.add_class(name)  # for pages and tests to find them
        self._text: str | None = None
        self._explanation: Explanation | None = None
        self.ablated: tuple[int, int] | None = None  # (layer, row) zeroed in the difference view
        self.summary: dict | None = None
        self.edited: PromptResult | None = None  # prompt A run with the ablation
        self.position.observe(lambda _: self._show(), names="value")
        self.ablate_button.on_click(lambda _: self.ablate())
        self.restore_button.on_click(lambda _: self.restore())

    @property
    def _a(self) -> PromptResult:
        return self.cmp.results["A"]

    def refresh(self) -> None:
        """Follow the comparison: new options when prompt A's text changed, else redraw."""
        a = self._a
        text = a.text if a.ok else None
        if text != self._text:
            self._text, self._explanation, self.ablated, self.summary = text, None, None, None
            options = [NO_TOKEN]
            if a.ok:
                labels = token_labels(a.pieces)[0]
                options += [(f"{i}: {labels[i]}", i) for i in range(len(a.pieces)) if not a.is_image[i]]
            self.position.options = options  # resets the value to None, which redraws
            self.position.value = None
        self._show()

    def select(self, position: int | None) -> None:
        """Explain token ``position`` of prompt A (None: nothing)."""
        valid = [v for _, v in self.position.options]
        if position not in valid:
            raise InputError(f"position {position!r} is not a text token of prompt A; expected one of {valid[1:]}")
        self.position.value = position

    def explanation(self) -> Explanation:
        """Prompt A explained (shares of every position; cached per text)."""
        if self._explanation is None:
            self._explanation = explain(self.cmp.pipeline, {"id": "A", "text": self._text})
        return self._explanation

    def rows_frame(self) -> pd.DataFrame:
        """The picked token's 24 rows at the comparison's layer (:func:`row_view`)."""
        if self.position.value is None:
            raise InputError("no token picked; call select(position) first")
        return row_view(self.explanation(), int(self.position.value), self.cmp.layer, self.cmp.stream)

    def ablate(self, column: int | None = None) -> dict:
        """Zero the row of ``column`` (0..23; default: the row dropdown's) of the picked token at the
        comparison's layer, re-run prompt A and show the difference; returns its summary."""
        rows = self.rows_frame()
        column = self.row.value if column is None else int(column)
        hit = rows[rows["column"] == column]
        if column is None or hit.empty:
            raise InputError(f"column {column!r} unknown; expected one of 0..{len(rows) - 1}")
        self.ablated = (self.cmp.layer, int(hit["row"].iloc[0]))
        self._draw_difference()
        return dict(self.summary or {})

    def restore(self) -> None:
        """Clear the ablation and its difference view."""
        self.ablated, self.summary = None, None
        self._draw_difference()

    def _show(self) -> None:
        theme = get_theme(self.cmp.theme)
        self.ablate_button.disabled = self.position.value is None
        if self._text is None:
            self.rows_html.value = message_html("fix prompt A to explain its tokens", theme, "explain a token")
            self.row.options = []
        elif self.position.value is None:
            self.rows_html.value = message_html(
                "pick a token of prompt A above to see its 24 rows", theme, "explain a token"
            )
            self.row.options = []
        else:
            rows = self.rows_frame()
            p = int(self.position.value)
            self.rows_html.value = rows_table_html(rows, self._a.pieces[p], p, self.cmp.layer, self.cmp.stream, theme)
            keep = self.row.value
            self.row.options = [
                (f"{r.column}: {r.order}-gram h{r.head} row {r.row} {r.ngram!r} {100 * r.share:+.0f}%", int(r.column))
                for r in rows.itertuples()
            ]
            self.row.value = keep if keep in [v for _, v in self.row.options] else int(rows["column"].iloc[0])
        self._draw_difference()

    def _draw_difference(self) -> None:
        self.restore_button.disabled = self.ablated is None
        if self.ablated is None or self._text is None:
            self.diff_html.value, self.summary = "", None
            return
        layer, row = self.ablated
        self.edited = edited = run_ablated(self.cmp.pipeline, self._text, layer, row)
        label = f"A, layer {layer} row {row} zeroed"
        self.diff_html.value, self.summary = difference_html(
            self._a,
            edited,
            self.cmp.layer_ids,
            layer=self.cmp.layer,
            stream=self.cmp.stream,
            all_gates=self.cmp.view == "all gates",
            theme=self.cmp.theme,
            labels=("A", label),
        )
