"""Explain one token of a comparison's prompt, and ablate one of its rows: what the gate view
(``apps.gate_view``) shows when a token is clicked (:class:`TokenExplainer`, built by
:class:`~engram_viz.apps.widget.PromptComparison`).

- **Click a token** (or ``select(position, slot)``): its 24 rows at every Engram layer: owner
  (n-gram order, head), row id, the decoded n-gram, its share of the gate's ``dot`` per stream and
  the gate with that row left out (``analysis.explain.explanation``: exact, see
  ``analysis.explain.attribution``). A prompt is explained once per text (shares of every position).
- **Ablate a row** (its button, or ``ablate(column)``): the prompt runs again with that row zeroed
  through the row-edit overlay (``weights.row_edits.edit_tables``: nothing is written, the table
  reads as stored afterwards, so the comparison's cached results stay true). Beside the button the
  view shows the token's gate before and after; below, the difference view
  (``viz.comparison_html.difference_html``) colours the prompt's tokens by ``gate(ablated) - gate``.
  ``restore()`` clears it; a new layer, stream or theme redraws it without re-running.

``rows_frame()``, ``.summary`` (the difference's counts), ``.rows_html`` / ``.diff_html`` (static
HTML, what an HTML export holds) read the state from Python.
"""

from __future__ import annotations

from collections import OrderedDict
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
from engram_viz.viz.token_labels import token_label
from engram_viz.viz.view_payload import explanation_payload
from engram_viz.weights.row_edits import ZERO, edit_tables

ROW_VIEW_COLUMNS = ("column", "order", "head", "row", "ngram", "share", "loo_gate", "gate")
EXPLAINED_TEXTS = 4  # explanations kept (one per prompt text)
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
    """The 'explain a token' part of a :class:`~engram_viz.apps.widget.PromptComparison` (module
    docstring); :meth:`refresh` follows the comparison, the view's clicks call :meth:`select` and
    :meth:`ablate`."""

    def __init__(self, comparison: Any):
        self.cmp = comparison
        self.slot: str | None = None
        self.position: int | None = None
        self._text: str | None = None  # the explained prompt's text
        self._explained: OrderedDict[str, Explanation] = OrderedDict()
        self.ablated: tuple[int, int, int] | None = None  # (layer, column, row) zeroed
        self.edited: PromptResult | None = None  # the prompt run with the ablation
        self.summary: dict | None = None
        self.rows_html = ""
        self.diff_html = ""
        self._nonce: Any = None

    # -- what the view asks (its traits 'selected' and 'ablate_request') --------------------------

    def on_selected(self, change: Any) -> None:
        want = change["new"] or {}
        if (want.get("slot"), want.get("position")) != (self.slot, self.position):
            self._answer(lambda: self.select(want.get("position"), want.get("slot", "A")))

    def on_ablate_request(self, change: Any) -> None:
        req = change["new"] or {}
        if req.get("restore"):
            self._answer(self.restore)
        elif req:
            if (req.get("slot"), req.get("position")) != (self.slot, self.position):
                self._answer(lambda: self.select(req.get("position"), req.get("slot", "A")))
            self._answer(lambda: self.ablate(req.get("column"), nonce=req.get("nonce")))

    def _answer(self, call: Any) -> None:
        """Run what the browser asked; a user error goes to the status line, not to a traceback."""
        view = self.cmp.widget
        view.busy = True
        try:
            call()
        except InputError as err:
            view.status = str(err)
        finally:
            view.busy = False

    def _result(self) -> PromptResult | None:
        return self.cmp.results.get(self.slot) if self.slot is not None else None

    def refresh(self) -> None:
        """Follow the comparison: a selection whose prompt changed or no longer runs is cleared;
        otherwise the rows and the difference are redrawn for the current layer, stream and theme."""
        res = self._result()
        if self.slot is not None and (res is None or not res.ok or res.text != self._text):
            self._clear()
        self._draw()

    def _clear(self) -> None:
        self.slot = self.position = self._text = None
        self.ablated = self.edited = self.summary = None
        view = self.cmp.widget
        view.selected, view.explanation, view.ablation = {}, {}, {}

    def select(self, position: int | None, slot: str = "A") -> None:
        """Explain token ``position`` of prompt ``slot`` (None: clear the selection)."""
        if position is None:
            self._clear()
            self._draw()
            return
        res = self.cmp.results.get(slot)
        if res is None or not res.ok:
            raise InputError(f"prompt {slot!r} does not run (see .messages); pick a token of a prompt that runs")
        valid = [i for i in range(len(res.pieces)) if not res.is_image[i]]
        if isinstance(position, bool) or not isinstance(position, (int, np.integer)) or int(position) not in valid:
            raise InputError(
                f"position {position!r} is not a text token of prompt {slot}; expected one of 0..{len(res.pieces) - 1}"
                " outside image spans"
            )
        self.slot, self.position, self._text = slot, int(position), res.text
        self.ablated = self.edited = self.summary = None
        view = self.cmp.widget
        view.selected = {"slot": slot, "position": self.position}
        view.explanation = explanation_payload(self.explanation(), slot, self.position)
        view.ablation = {}
        self._draw()

    def explanation(self) -> Explanation:
        """The selected prompt explained (shares of every position; kept per text)."""
        if self._text is None:
            raise InputError("no token picked; call select(position) first")
        if self._text not in self._explained:
            self._explained[self._text] = explain(self.cmp.pipeline, {"id": self.slot, "text": self._text})
            while len(self._explained) > EXPLAINED_TEXTS:
                self._explained.popitem(last=False)
        self._explained.move_to_end(self._text)
        return self._explained[self._text]

    def rows_frame(self) -> pd.DataFrame:
        """The picked token's 24 rows at the comparison's layer and stream (:func:`row_view`)."""
        if self.position is None:
            raise InputError("no token picked; call select(position) first")
        return row_view(self.explanation(), self.position, self.cmp.layer, self.cmp.stream)

    def ablate(self, column: int | None = None, nonce: Any = None) -> dict:
        """Zero the row of ``column`` (0..23; default: the row with the largest share) of the picked
        token at the comparison's layer, re-run its prompt and show the difference; returns its summary."""
        rows = self.rows_frame()
        if column is None:
            column = int(rows["column"].iloc[int(rows["share"].abs().to_numpy().argmax())])
        hit = rows[rows["column"] == column] if isinstance(column, (int, np.integer)) else rows.iloc[:0]
        if hit.empty:
            raise InputError(f"column {column!r} unknown; expected one of 0..{len(rows) - 1}")
        layer, row = self.cmp.layer, int(hit["row"].iloc[0])
        self.ablated, self._nonce = (layer, int(column), row), nonce
        self.edited = run_ablated(self.cmp.pipeline, self._text, layer, row)
        self._draw()
        return dict(self.summary or {})

    def restore(self) -> None:
        """Clear the ablation and its difference view."""
        self.ablated = self.edited = self.summary = None
        self.cmp.widget.ablation = {}
        self._draw()

    def _draw(self) -> None:
        theme = get_theme(self.cmp.theme)
        if self.position is None:
            self.rows_html = message_html("click a token of a prompt to see its 24 rows", theme, "explain a token")
        else:
            rows = self.rows_frame()
            piece = self._result().pieces[self.position]
            self.rows_html = rows_table_html(rows, piece, self.position, self.cmp.layer, self.cmp.stream, theme)
        self._draw_difference(theme)

    def _draw_difference(self, theme: Any) -> None:
        res = self._result()
        if self.ablated is None or self.edited is None or res is None:
            self.diff_html, self.summary = "", None
            return
        layer, column, row = self.ablated
        self.diff_html, self.summary = difference_html(
            res,
            self.edited,
            self.cmp.layer_ids,
            layer=self.cmp.layer,
            stream=self.cmp.stream,
            all_gates=self.cmp.view == "all gates",
            theme=theme,
            labels=(self.slot, f"{self.slot}, layer {layer} row {row} zeroed"),
        )
        li = self.cmp.layer_ids.index(layer)
        self.cmp.widget.ablation = {
            "slot": self.slot,
            "position": self.position,
            "layer": layer,
            "column": column,
            "row": row,
            "before": np.round(res.gates[self.position, li].astype(float), 4).tolist(),
            "after": np.round(self.edited.gates[self.position, li].astype(float), 4).tolist(),
            "changed": int(self.summary["changed"]),
            "max_abs_diff": round(float(self.summary["max_abs_diff"]), 4),
            "html": self.diff_html,
            "nonce": self._nonce,
        }
