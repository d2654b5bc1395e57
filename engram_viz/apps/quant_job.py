"""``engram-viz quant-report``: what quantised Engram tables cost the tiny LM, as tables and a figure.

The recipe: load the tiny LM (its reference fp8 tables), the prompt set, the training read counts
(for the read-count groups; left out with a note when the sources are missing), run the study
(``analysis.quant.study``) for each candidate (GGML types applied on the fly, GGUF files, ``off``),
then write the tidy tables (parquet + CSV), the figure of quality against bits per weight
(PNG + SVG) and ``summary.json`` into one output folder, atomically (``_files.atomic_folder``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from engram_viz._files import atomic_folder, atomic_write_text, write_table
from engram_viz.analysis.gates.gate_memory import training_counts
from engram_viz.analysis.quant.candidates import DEFAULT_TYPES, OFF
from engram_viz.analysis.quant.study import QuantStudy, quant_study
from engram_viz.errors import EngramVizError, ReportError
from engram_viz.run.prompts import Prompt, load_prompts, prompt_set_path
from engram_viz.tiny.files import load_tiny_model
from engram_viz.tiny.model import TinyEngramLM
from engram_viz.viz.export import save_matplotlib
from engram_viz.viz.quant_plots import quality_vs_bits
from engram_viz.weights.resolve import resolve_weights
from engram_viz.weights.tiny_folder import checkpoint_label, is_tiny_lm_folder

DEFAULT_CANDIDATES = (*DEFAULT_TYPES, OFF)
MARKER = "summary.json"


def _tiny_lm(checkpoint: str | Path | None) -> tuple[TinyEngramLM, str]:
    chosen = resolve_weights(checkpoint)
    if not isinstance(chosen, (str, Path)) or not is_tiny_lm_folder(chosen):
        raise ReportError(
            f"quant-report measures loss on a tiny Engram LM folder (its fp8 tables are the reference); got {chosen}"
        )
    return load_tiny_model(chosen), checkpoint_label(chosen)


def run_quant_study(
    checkpoint: str | Path | None = None,
    candidates: Sequence[str | Path] = DEFAULT_CANDIDATES,
    prompts: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> tuple[QuantStudy, dict[str, Any]]:
    """The study and its summary facts (model label, prompts, whether read-count groups were made)."""
    say = log or (lambda _msg: None)
    model, label = _tiny_lm(checkpoint)
    path = Path(prompts) if prompts is not None else prompt_set_path("default")
    prompt_list = load_prompts(path)
    try:
        counts = training_counts(model.config, model.provenance)
        groups = "read-count groups from the model's training reads (3-grams)"
    except EngramVizError as err:  # the training sources are missing: one group, "all"
        counts, groups = None, f"no read-count groups ({err})"
    say(f"{len(prompt_list)} prompts x {len(candidates)} candidates on {label}")
    study = quant_study(model, prompt_list, candidates, counts)
    facts = {"model": label, "prompts": str(path), "candidates": [str(c) for c in candidates], "groups": groups}
    return study, facts


def report_quant_study(
    lm: TinyEngramLM | None, prompts: Sequence[Prompt], candidates: Sequence[str | Path], say: Callable[[str], None]
) -> QuantStudy:
    """The study for ``engram-viz report --quant``: the report's own tiny LM and prompts."""
    if lm is None:
        raise ReportError("--quant measures loss on the tiny LM run whole (streams model); these weights run no LM")
    try:
        counts = training_counts(lm.config, lm.provenance)
    except EngramVizError:
        counts = None
    say(f"quantised tables: {len(candidates)} candidates")
    return quant_study(lm, prompts, candidates, counts)


def write_quant_report(
    out: str | Path,
    checkpoint: str | Path | None = None,
    candidates: Sequence[str | Path] = DEFAULT_CANDIDATES,
    prompts: str | Path | None = None,
    log: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the study and write its tables, figure and ``summary.json`` into ``out``; returns the summary."""
    study, facts = run_quant_study(checkpoint, candidates, prompts, log)
    with atomic_folder(out, marker=MARKER) as build:
        for name, frame in study.tables().items():
            write_table(frame, build, name)
        axes = quality_vs_bits(study.summary)
        for fmt in ("png", "svg"):
            save_matplotlib(axes, build / f"quant_quality.{fmt}")
        summary = facts | {"summary": study.summary.to_dict(orient="records")}
        atomic_write_text(build / MARKER, json.dumps(summary, indent=2, default=float) + "\n")
    return summary


def summary_lines(summary: dict[str, Any]) -> str:
    """The closing table of the command: one line per candidate."""
    head = f"{'candidate':<18}{'bits':>6}{'GB':>7}{'row err':>9}{'gate p99':>10}{'moved':>7}{'crossed':>8}{'dloss':>10}{'KL':>10}"
    lines = [f"weights: {summary['model']}", head]
    for r in summary["summary"]:
        lines.append(
            f"{r['candidate']:<18}{r['bits_per_weight']:>6.2f}{r['table_gb']:>7.1f}{r['row_error']:>9.4f}"
            f"{r['gate_change_p99']:>10.4f}{int(r['streams_moved']):>7}{int(r['streams_crossed']):>8}"
            f"{r['delta_loss']:>+10.5f}{r['kl']:>10.2e}"
        )
    return "\n".join(lines) + "\n"
