"""The main job: ``engram-viz report`` - run a prompt set, write tables, figures and one HTML report.

``write_report(out, checkpoint=None, prompts=None)`` runs the prompt set (default: the shipped set
that fits the weights, ``run.prompts``: ``default`` for the tiny LM, ``paper`` otherwise) through a :class:`~engram_viz.run.pipeline.Pipeline` on the
checkpoint folder (None: ``$ENGRAM_VIZ_CHECKPOINT``, else the embedded default weights), and writes into ``out``::

    report.html               one self-contained page: no scripts, no network; figures embedded as
                              PNG data URIs (the SVG beside each is linked), token-coloured text inline
    tables/<name>.parquet     tidy tables, each also as tables/<name>.csv:
                              gates, rows, tokens (from the Trace), gate_summary (mean gate per
                              category, layer, stream), usage_columns, layer_totals, rank_frequency,
                              hot_rows (RowUsage), collision_columns, heads_shared, collision_examples
                              (CollisionStats) - all over the text positions of the prompt set
    figures/<name>.png|.svg|.pdf  gate distributions, per-prompt gate heatmaps, exposure beside gates,
                              token-coloured text, collisions vs expected, coverage, rank-frequency,
                              touched-row maps (a name from a prompt id goes through
                              ``_files.safe_name``: one component inside figures/, unique)
    trace/                    the run's Trace (``Trace.load`` reads it back)
    prompts.<suffix>          a copy of the prompt file that ran
    manifest.json             provenance (model and weights, streams, prompt file, versions, Hub rows read)
                              and every file written, all paths relative to the folder

The folder is all or nothing (``engram_viz._files.atomic_folder``): the run is built in a hidden
folder beside ``out`` and swapped in when complete, so ``out`` always holds one whole run (the
previous one after a failed or interrupted run, none if there was none) and a rerun with other
prompts leaves no stale file; a second run into the same ``out`` meanwhile fails at once. The page and the manifest say which model
and weights and which stream source produced them; synthetic weights are flagged. The tables come
from :mod:`engram_viz.analysis.gates.summary`, :class:`RowUsage`, :class:`CollisionStats` and
:mod:`engram_viz.analysis.gates.gate_memory`; the page's sections are declared in
:mod:`engram_viz.apps.report_sections` and rendered by :mod:`engram_viz.viz.report_page`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import io
import json
import platform
import re
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from engram_viz import settings
from engram_viz._files import atomic_folder, atomic_write_bytes, atomic_write_text, safe_name, write_table
from engram_viz.analysis.gates.picture_twin import picture_twins
from engram_viz.analysis.gates.summary import gate_summary
from engram_viz.analysis.row_stats.collisions import CollisionStats
from engram_viz.analysis.row_stats.trace_ngrams import collision_exposure, population_from_trace
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.apps.quant_job import report_quant_study
from engram_viz.apps.report_sections import FigureSpec, report_sections, trace_gate_memory
from engram_viz.config import EngramConfig
from engram_viz.core.devices import resolve_device
from engram_viz.errors import ReportError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts, prompt_set_for, prompt_set_path
from engram_viz.run.provenance import provenance_of
from engram_viz.run.trace import Trace
from engram_viz.viz.export import check_offline_html, export_all
from engram_viz.viz.report_page import Figure, Section, render_html
from engram_viz.weights.resolve import weights_source

FIGURE_FORMATS = ("png", "svg", "pdf")


@dataclass
class Report:
    """What ``write_report`` produced: paths by kind, the Trace and the provenance."""

    out: Path
    html: Path
    tables: dict[str, list[Path]] = field(default_factory=dict)
    figures: dict[str, list[Path]] = field(default_factory=dict)
    trace: Trace | None = None
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> list[Path]:
        out = [self.html]
        for paths in (*self.tables.values(), *self.figures.values()):
            out.extend(paths)
        return out


# The job's steps, in the order write_report runs them.


def accumulate(trace: Trace, config: EngramConfig) -> tuple[RowUsage, CollisionStats]:
    """RowUsage and CollisionStats (sharing one n-gram count) over the trace's text positions."""
    usage = RowUsage(config)
    collisions = CollisionStats(config, counts=usage.counts)
    population_from_trace(trace, usage.counts)
    return usage, collisions


def _report_frames(trace: Trace, pipe: Pipeline) -> tuple[dict[str, pd.DataFrame], RowUsage]:
    """The report's tables by name (the Trace's frames, gate_summary, row usage, collisions) and
    the RowUsage they were read from (its figures need it)."""
    frames = trace.to_frames()
    frames["gate_summary"] = gate_summary(frames["gates"])
    usage, collisions = accumulate(trace, pipe.config)
    frames["usage_columns"] = usage.coverage()
    frames["layer_totals"] = usage.layer_totals()
    frames["rank_frequency"] = usage.rank_frequency()
    frames["hot_rows"] = usage.hot_rows(top=10, ngrams_per_row=3, tokenizer=pipe.tokenizer)
    frames["collision_columns"] = collisions.columns()
    frames["heads_shared"] = collisions.heads_shared()
    frames["collision_examples"] = collisions.examples(n_examples=2, ngrams_per_bucket=3, tokenizer=pipe.tokenizer)
    return frames, usage


_GLYPH_RE = re.compile(r"Glyph \d+ \((.+?)\) missing from font")


def _missing_glyphs(caught: list[warnings.WarningMessage]) -> list[str]:
    """Matplotlib's missing-glyph warnings, one name each (e.g. from random-token controls in
    scripts no installed font covers); every other warning is shown again as usual."""
    names: dict[str, None] = {}
    for w in caught:
        found = _GLYPH_RE.search(str(w.message))
        if found:
            names[found.group(1)] = None
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return list(names)


def _draw_figures(
    sections: list[Section], out: Path, say: Callable[[str], None]
) -> tuple[list[Section], dict[str, Figure], list[str]]:
    """Draw and export each figure of the sections (one at a time, in page order, each said) into
    ``out/figures``: the sections with the drawn figures in place of their specs, the figures by
    name, and the characters that no installed font has (drawn as boxes)."""
    figures: dict[str, Figure] = {}  # by file name: the spec's name (a prompt id in it) through safe_name
    drawn_of: dict[int, Figure] = {}  # by id of the spec
    taken: set[str] = set()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specs = [p for s in sections for p in s.parts if isinstance(p, FigureSpec)]
        for k, spec in enumerate(specs, 1):
            name = safe_name(spec.name, taken)
            say(f"figure {k}/{len(specs)}: {name}")
            axes = spec.draw()  # a plot's Axes (or array of them; export writes their figure), or a Figure
            files = tuple(export_all(axes, out / "figures" / name, FIGURE_FORMATS))
            figures[name] = drawn_of[id(spec)] = Figure(name, files, spec.title, spec.caption)
            del axes
    drawn = [
        replace(s, parts=tuple(drawn_of[id(p)] if isinstance(p, FigureSpec) else p for p in s.parts)) for s in sections
    ]
    return drawn, figures, _missing_glyphs(caught)


def _package_version() -> str:
    try:
        return version("engram-viz")
    except PackageNotFoundError:  # not installed as a distribution
        return "unknown"


def _provenance(
    trace: Trace, pipe: Pipeline, prompts_file: Path, mode: str, missing_glyphs: list[str]
) -> dict[str, Any]:
    """Which model, weights, streams, prompts and software produced the report."""
    return {
        "model": trace.model_label,
        "synthetic": provenance_of(trace).synthetic or provenance_of(pipe).synthetic,  # the checkpoint's flag
        "streams": trace.streams_label,
        "streams_mode": pipe.streams_mode,
        "config": pipe.config.name,
        "dim": pipe.config.dim,
        "hc_mult": pipe.config.hc_mult,
        "layers": list(trace.layer_ids),
        "prompts_file": f"prompts{prompts_file.suffix}",  # the copy in the run folder (relative, as every path)
        "prompts_source": prompts_file.name,
        "prompt_set": prompts_file.stem if prompts_file.parent == prompt_set_path("default").parent else "custom",
        "prompts_sha256": hashlib.sha256(prompts_file.read_bytes()).hexdigest(),
        "n_prompts": trace.batch_size,
        "n_tokens": int(trace.lengths.sum()),
        "n_image_positions": int((trace.is_image & trace.valid).sum()),
        "device": str(pipe.device),
        "wkv_mode": mode,
        "engram_viz": _package_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "missing_glyphs": missing_glyphs,
        # a Hub checkpoint: the rows read from the Hub and from the row cache, per tensor (weights.remote_rows)
        "hub_rows": reads.summary() if (reads := getattr(pipe.checkpoint, "remote_reads", None)) else None,
    }


def _write_manifest(out: Path, prov: dict[str, Any], tables: dict[str, list[Path]], figures: dict[str, Figure]) -> Path:
    manifest = {
        "provenance": prov,
        "tables": {k: [p.relative_to(out).as_posix() for p in v] for k, v in tables.items()},
        "figures": {k: [p.relative_to(out).as_posix() for p in v.files] for k, v in figures.items()},
        "trace": "trace/",
        "html": "report.html",
    }
    return atomic_write_text(out / "manifest.json", json.dumps(manifest, indent=1))


def _write_page(page: str, out: Path) -> Path:
    """``out/report.html``, after checking that the page is offline and script-free."""
    check_offline_html(page, "report.html")
    if "<script" in page.lower():
        raise ReportError("report.html would contain a <script> element; the report must be script-free")
    return atomic_write_text(out / "report.html", page)


def write_report(
    out: str | Path = "out/report",
    checkpoint: Any = None,
    prompts: str | Path | None = None,
    *,
    device: str | None = None,
    mode: str = "fp8",
    theme: str = "light",
    streams: str = "auto",
    batch_size: int = 8,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
    quant: Sequence[str | Path] | None = None,
) -> Report:
    """Run the prompt set and write the report into ``out`` (see the module docstring); ``quant``:
    candidate tables (``analysis.quant.candidates``) for a section on what they cost (tiny LM only)."""
    say = log or (lambda msg: None)
    resolve_device(device)  # a device that cannot work: one DeviceError before anything is written
    final = Path(out)
    with atomic_folder(final, marker="manifest.json", pause=settings.pause_at) as build:
        report = _build_report(
            build, checkpoint, prompts, device, mode, theme, streams, batch_size, progress, say, quant
        )
    report = _moved(report, build, final)
    say(f"wrote {report.html}")
    return report


def _build_report(
    out: Path,
    checkpoint: Any,
    prompts: str | Path | None,
    device: str | None,
    mode: str,
    theme: str,
    streams: str,
    batch_size: int,
    progress: bool,
    say: Callable[[str], None],
    quant: Sequence[str | Path] | None = None,
) -> Report:
    """The whole job, written into ``out`` (the folder being built)."""
    prompt_set = load_prompts(prompts) if prompts is not None else None
    say(f"loading weights ({weights_source(checkpoint)})")  # None: $ENGRAM_VIZ_CHECKPOINT, else embedded
    pipe = Pipeline(checkpoint, streams=streams, device=device, mode=mode, batch_size=batch_size)
    # no prompts given: the shipped set that fits the weights (run.prompts)
    prompts_file = Path(prompts) if prompts is not None else prompt_set_path(prompt_set_for(pipe.lm is not None))
    prompt_set = prompt_set if prompt_set is not None else load_prompts(prompts_file)
    say(f"running {len(prompt_set)} prompts on {pipe.device}")
    settings.pause_at("report:run")
    trace = pipe.run(prompt_set, names=["engram.*.dot"], progress=progress)
    trace = trace.with_extras(exposure=collision_exposure(trace, pipe.config))  # saved with the trace, a gates column

    say("saving the trace")
    trace.save(out / "trace")
    atomic_write_bytes(out / f"prompts{prompts_file.suffix}", prompts_file.read_bytes())
    say("counting row usage and collisions")
    frames, usage = _report_frames(trace, pipe)
    twins = picture_twins(pipe, prompt_set)  # prompts with a real picture beside their placeholder twins
    frames.update({"picture_twins": twins} if len(twins) else {})
    memory = trace_gate_memory(trace, pipe.lm, say)  # tiny LM only
    frames.update(memory.tables() if memory is not None else {})
    study = report_quant_study(pipe.lm, prompt_set, quant, say) if quant else None
    frames.update(study.tables() if study is not None else {})
    say(f"writing {len(frames)} tables (parquet + csv)")
    tables = {name: write_table(df, out / "tables", name) for name, df in frames.items()}
    settings.pause_at("report:tables")

    sections = report_sections(trace, frames, usage, pipe.config, theme, memory, study)
    sections, figures, missing_glyphs = _draw_figures(sections, out, say)
    if missing_glyphs:
        say(
            f"figures draw {len(missing_glyphs)} characters as boxes (no installed font has them): {', '.join(missing_glyphs)}"
        )
    settings.pause_at("report:figures")

    prov = _provenance(trace, pipe, prompts_file, mode, missing_glyphs)
    say("writing the page")
    _write_manifest(out, prov, tables, figures)
    html_path = _write_page(render_html(prov, sections, out, theme), out)
    return Report(
        out=out,
        html=html_path,
        tables=tables,
        figures={k: list(v.files) for k, v in figures.items()},
        trace=trace,
        provenance=prov,
    )


def _moved(report: Report, build: Path, final: Path) -> Report:
    """``report`` with its paths under ``final``, where the built folder now is."""

    def move(paths: list[Path]) -> list[Path]:
        return [final / p.relative_to(build) for p in paths]

    return Report(
        out=final,
        html=final / report.html.relative_to(build),
        tables={k: move(v) for k, v in report.tables.items()},
        figures={k: move(v) for k, v in report.figures.items()},
        trace=report.trace,
        provenance=report.provenance,
    )


def summary_text(report: Report) -> str:
    """A few lines for the terminal."""
    buf = io.StringIO()
    p = report.provenance
    buf.write(f"report: {report.html}\n")
    buf.write(f"model: {p['model']}\nstreams: {p['streams']}\n")
    buf.write(f"{p['n_prompts']} prompts, {p['n_tokens']} positions; {len(report.tables)} tables, ")
    buf.write(f"{len(report.figures)} figures ({' + '.join(FIGURE_FORMATS)}) in {report.out}\n")
    return buf.getvalue()
