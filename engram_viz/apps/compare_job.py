"""Two prompts compared in one call (``engram-viz compare "A" "B"``): both run through one
Pipeline, B aligned to A per token (``analysis.gates.comparison``), the difference view of the
prompt comparison (``viz.comparison_html.difference_html``) and, with ``out``, the comparison
written whole: ``.html`` (the header, both prompts' token text and the difference view, one
offline page) or ``.pdf`` / ``.svg`` / ``.png`` (``viz.gate_plots.gate_difference_heatmap`` of the
layer's streams)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from markupsafe import Markup

from engram_viz.analysis.gates.comparison import PromptResult, gate_difference
from engram_viz.errors import InputError
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.comparison_html import difference_html, header_html, prompt_panel
from engram_viz.viz.export import save_figure, save_html
from engram_viz.viz.gate_plots import gate_difference_heatmap
from engram_viz.viz.html_templates import render
from engram_viz.viz.style import get_theme

OUT_FORMATS = ("html", "pdf", "svg", "png")
STREAM = "mean"  # the one-line summary and the HTML view compare the mean of the streams


@dataclass(frozen=True)
class Comparison:
    """Prompts A and B as the comparison sees them, the compared layer and the difference view's
    summary (aligned / equal / replace / insert / delete counts, ``changed``, ``max_abs_diff`` and
    its ``max_at`` (position_a, position_b))."""

    a: PromptResult
    b: PromptResult
    layer_ids: tuple[int, ...]
    layer: int
    summary: dict
    view_html: str  # the difference view (a fragment)

    def line(self) -> str:
        """The comparison in one line: what aligned, what moved most and where."""
        s = self.summary
        where = "no aligned token's gate moved"
        if s["max_at"] is not None and s["max_abs_diff"] > 1e-6:
            i, j = s["max_at"]
            where = (
                f"largest |gate B - gate A| {s['max_abs_diff']:.3f} at B position {j} {self.b.pieces[j]!r}"
                f" (A position {i})"
            )
        return (
            f"layer {self.layer}, {STREAM} of streams: {s['aligned']} aligned tokens ({s['equal']} equal, "
            f"{s['replace']} replaced), {s['insert']} only in B, {s['delete']} only in A; "
            f"{s['changed']} with a different gate; {where}"
        )


def _out_format(out: str | os.PathLike) -> str:
    fmt = Path(out).suffix.lstrip(".").lower()
    if fmt not in OUT_FORMATS:
        raise InputError(f"out {str(out)!r}: expected a file ending in .{', .'.join(OUT_FORMATS)}")
    return fmt


def compare_prompts(
    a: str,
    b: str,
    *,
    pipeline: Pipeline,
    layer: int | None = None,
    theme: str = "light",
    out: str | os.PathLike | None = None,
) -> Comparison:
    """Run ``a`` and ``b`` through ``pipeline``, compare B against A at ``layer`` (default: the first
    Engram layer) and write ``out`` when given (its format from the suffix, checked before the run;
    atomic: the file is whole or absent)."""
    fmt = None if out is None else _out_format(out)
    layer_ids = tuple(int(x) for x in pipeline.config.engram_layer_ids)
    layer = layer_ids[0] if layer is None else int(layer)
    if layer not in layer_ids:
        raise InputError(f"layer {layer}: this model's Engram layers are {list(layer_ids)}")
    trace = pipeline.run([a, b])
    ra, rb = PromptResult.from_trace(a, trace, 0), PromptResult.from_trace(b, trace, 1)
    view, summary = difference_html(ra, rb, layer_ids, layer=layer, stream=STREAM, theme=theme)
    result = Comparison(ra, rb, layer_ids, layer, summary, view)
    if fmt == "html":
        save_html(_page(result, pipeline, theme), out)
    elif fmt is not None:
        diff = gate_difference(ra, rb, layer_ids)
        at_layer = diff[diff["layer"] == layer]
        at_layer.attrs = {**diff.attrs, **trace.to_frame("gates").attrs}  # the prompts' labels and provenance
        save_figure(gate_difference_heatmap(at_layer, theme=theme), out)
    return result


def _page(result: Comparison, pipeline: Pipeline, theme: str) -> str:
    """One offline page: which weights, prompt A and B as token text, the difference view."""
    t = get_theme(theme)
    hc = result.a.gates.shape[-1]
    where = {"layer": result.layer, "stream": STREAM, "all_gates": False, "theme": t}
    parts = [
        header_html(pipeline, result.layer_ids, hc, t),
        prompt_panel(result.a, "A", result.layer_ids, **where),
        prompt_panel(result.b, "B", result.layer_ids, **where),
        result.view_html,
    ]
    return str(render("tokens_page.html.j2", t=t, title="engram-viz: compare", body=Markup("".join(parts))))
