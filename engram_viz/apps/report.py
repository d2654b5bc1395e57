"""The main job: ``engram-viz report`` - run a prompt set, write tables, figures and one HTML report.

``write_report(out, checkpoint=None, prompts=None)`` runs the prompt set (default: the shipped
``data/prompts/default.jsonl``) through a :class:`~engram_viz.run.pipeline.Pipeline` on the embedded
default weights or a checkpoint folder, and writes into ``out``::

    report.html               one self-contained page: no scripts, no network; figures embedded as
                              PNG data URIs (the SVG beside each is linked), token-coloured text inline
    tables/<name>.parquet     tidy tables, each also as tables/<name>.csv:
                              gates, rows, tokens (from the Trace), gate_summary (mean gate per
                              category, layer, stream), usage_columns, rank_frequency, hot_rows
                              (RowUsage), collision_columns, heads_shared, collision_examples
                              (CollisionStats) - all over the text positions of the prompt set
    figures/<name>.png|.svg   gate distributions, per-prompt gate heatmaps, exposure beside gates,
                              token-coloured text, collisions vs expected, coverage, rank-frequency,
                              touched-row maps
    trace/                    the run's Trace (``Trace.load`` reads it back)
    manifest.json             provenance (model and weights, stream source, prompt file, versions)
                              and every file written

Every file is written atomically (temporary file, then ``os.replace``). The page and the manifest
say which model and weights and which stream source produced them; synthetic weights are flagged.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import html
import io
import json
import os
import platform
import re
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.run.trace import Trace

TABLE_FORMATS = ("parquet", "csv")
FIGURE_FORMATS = ("png", "svg")
MAX_SHOWCASE = 8  # prompts drawn as heatmaps: the first of each category, at most this many


class ReportError(RuntimeError):
    """The report could not be produced (bad prompts, an unreadable checkpoint, a failed write)."""


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


# ------------------------------------------------------------------------------------ writing


def _file_mode() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _atomic_write(path: Path, write: Callable[[str], None]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, _file_mode())  # mkstemp makes 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _table_safe(df: pd.DataFrame) -> pd.DataFrame:
    """Parquet/CSV-friendly copy: tuples (n-gram ids) become space-separated strings."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype == object and len(out) and isinstance(out[col].iloc[0], (tuple, list, np.ndarray)):
            out[col] = out[col].map(lambda v: " ".join(str(int(x)) for x in v))
    return out


def write_table(df: pd.DataFrame, stem: Path, formats: Sequence[str] = TABLE_FORMATS) -> list[Path]:
    """``stem.parquet`` and ``stem.csv`` (atomic each)."""
    df = _table_safe(df)
    paths = []
    for fmt in formats:
        path = stem.with_name(f"{stem.name}.{fmt}")
        if fmt == "parquet":
            _atomic_write(path, lambda tmp: df.to_parquet(tmp, index=False))
        elif fmt == "csv":
            _atomic_write(path, lambda tmp: df.to_csv(tmp, index=False))
        else:
            raise ValueError(f"table format {fmt!r} unknown; expected one of {TABLE_FORMATS}")
        paths.append(path)
    return paths


# ------------------------------------------------------------------------------------ analysis


def gate_overview(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean gate per (category, layer), one column per stream and one over all streams (text positions)."""
    text = gates[~gates["is_image"]]
    piv = text.pivot_table(index=["category", "layer"], columns="stream", values="gate", aggfunc="mean")
    piv.columns = [f"stream {c}" for c in piv.columns]
    piv["all streams"] = text.groupby(["category", "layer"])["gate"].mean()
    piv.insert(0, "positions", text.groupby(["category", "layer"])["position"].size() // text["stream"].nunique())
    return piv.reset_index()


def gate_summary(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean, median and spread of gates per (category, layer, stream) over text positions."""
    text = gates[~gates["is_image"]]
    g = text.groupby(["category", "layer", "stream"], sort=True)["gate"]
    out = g.agg(["count", "mean", "median", "std", "min", "max"]).reset_index()
    return out.rename(columns={"count": "positions"})


def accumulate(trace: Trace, config: Any) -> tuple[Any, Any]:
    """RowUsage and CollisionStats (sharing one n-gram count) over the trace's text positions."""
    from engram_viz.analysis.collisions import CollisionStats
    from engram_viz.analysis.usage import RowUsage

    usage = RowUsage(config)
    collisions = CollisionStats(config, counts=usage.counts)
    pad = int(trace.meta.get("pad_compressed", config.engram_pad_id))
    for i, n in enumerate(trace.lengths.tolist()):
        mask = trace.token_types[i, :n].numpy() < 0
        c = np.where(mask, trace.compressed_ids[i, :n].numpy(), pad)
        usage.add_compressed(c, mask)
    return usage, collisions


def showcase_prompts(trace: Trace, limit: int = MAX_SHOWCASE) -> list[str]:
    """The first prompt of each category (in file order), at most ``limit``."""
    seen, out = set(), []
    for pid, cat in zip(trace.prompt_ids, trace.categories):
        if cat not in seen:
            seen.add(cat)
            out.append(pid)
    return out[:limit]


# ------------------------------------------------------------------------------------ figures


def _figures(
    trace: Trace, frames: dict[str, pd.DataFrame], usage: Any, config: Any, theme: str
) -> dict[str, tuple[Any, str, str]]:
    """name -> (figure, title, caption). Built lazily by the caller, one at a time."""
    from engram_viz.viz import paper, tokens

    gates, rows = frames["gates"], frames["rows"]
    show = showcase_prompts(trace)
    specs: dict[str, tuple[Callable[[], Any], str, str]] = {
        "gate_distributions": (
            lambda: paper.gate_distributions(gates, by="category", theme=theme),
            "Gates by prompt category",
            (
                "Per layer, the distribution of gate values over text positions, one box per stream. "
                "Image positions are left out (their gate is 0 by construction)."
            ),
        ),
    }
    for layer in trace.layer_ids:
        specs[f"tokens_L{layer}"] = (
            lambda layer=layer: tokens.token_text_figure(
                gates, show, layer=layer, stream="mean", theme=theme, title=f"Gate (mean of streams), layer {layer}"
            ),
            f"Token-coloured text, layer {layer}",
            "Each token's background is its gate (mean over streams); image spans are one grey chip.",
        )
    for pid in show:
        specs[f"gates_{pid}"] = (
            lambda pid=pid: paper.gate_heatmap(gates, pid, theme=theme),
            f"Gates of {pid!r}",
            "Stream x position heatmap of the gates, all Engram layers stacked; image positions grey.",
        )
    if "exposure" in gates.columns and show:
        first_text = next((p for p, c in zip(trace.prompt_ids, trace.categories) if c != "image"), show[0])
        specs[f"exposure_{first_text}"] = (
            lambda: paper.exposure_beside_gates(gates, first_text, theme=theme),
            f"Collision exposure beside gates, {first_text!r}",
            (
                "Bars: how many of a position's 24 rows also hold a different n-gram of the prompt set; "
                "r is the correlation of exposure with the mean gate over text positions."
            ),
        )
    specs["collisions_vs_expected"] = (
        lambda: paper.collisions_vs_expected(frames["collision_columns"], theme=theme),
        "Hash collisions vs an ideal uniform hash",
        (
            "Per (order, head) column: buckets holding two or more distinct n-grams of the prompt set "
            "(bars) against the expectation for a uniform hash into the same prime number of buckets."
        ),
    )
    specs["coverage"] = (
        lambda: paper.coverage_per_column(frames["usage_columns"], theme=theme, log=True),
        "Row coverage per column",
        "Fraction of each column's rows read by the prompt set (rows touched / prime).",
    )
    specs["rank_frequency"] = (
        lambda: paper.row_rank_frequency(usage, theme=theme),
        "Row rank-frequency",
        "Hits of the r-th most read row, per layer (log-log).",
    )
    specs["touched_rows"] = (
        lambda: paper.touched_rows_map(usage, config, theme=theme),
        "Where the touched rows lie",
        "Each strip is one (order, head) column's row range split into bins; colour = fraction of rows touched.",
    )
    _ = rows
    return specs


def _png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# ------------------------------------------------------------------------------------ HTML

_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,"Noto Sans","Noto Sans CJK SC",sans-serif;
margin:0 auto;max-width:1100px;padding:24px;color:#1b1b1b;background:#fff;line-height:1.45}
h1{font-size:24px;margin:0 0 4px 0} h2{font-size:19px;margin:32px 0 8px 0;border-bottom:1px solid #ddd}
h3{font-size:15px;margin:20px 0 6px 0}
.prov{background:#f5f7fa;border:1px solid #dfe3ea;border-radius:6px;padding:10px 14px;font-size:14px}
.prov dt{font-weight:600;float:left;clear:left;width:170px} .prov dd{margin:0 0 4px 180px}
.warn{background:#fff4e5;border:1px solid #f0b35b;border-radius:6px;padding:8px 12px;margin:10px 0;font-size:14px}
table.ev{border-collapse:collapse;font-size:12.5px;margin:6px 0} table.ev th,table.ev td{border:1px solid #ddd;
padding:2px 6px;text-align:right} table.ev th{background:#f0f2f5} table.ev td:first-child{text-align:left}
figure{margin:12px 0 20px 0} figure img{max-width:100%;border:1px solid #eee}
figcaption{font-size:13px;color:#555} .small{font-size:12px;color:#666}
"""


def _table_html(df: pd.DataFrame, max_rows: int = 40, floatfmt: str = "{:.4g}") -> str:
    shown = _table_safe(df.head(max_rows))
    body = shown.to_html(index=False, classes="ev", border=0, float_format=lambda v: floatfmt.format(v), escape=True)
    more = (
        f'<div class="small">first {max_rows} of {len(df)} rows; all in the tables folder</div>'
        if len(df) > max_rows
        else ""
    )
    return body + more


def _provenance_html(prov: dict[str, Any]) -> str:
    items = [
        ("Model and weights", prov["model"]),
        ("Residual streams", prov["streams"]),
        ("Config", f"{prov['config']} (dim {prov['dim']}, {prov['hc_mult']} streams, Engram layers {prov['layers']})"),
        ("Prompts", (f"{prov['prompts_file']} - {prov['n_prompts']} prompts, {prov['n_tokens']} positions "
                    f"({prov['n_image_positions']} in image spans); sha256 {prov['prompts_sha256'][:16]}")),
        ("Run", (f"device {prov['device']}, wkv mode {prov['wkv_mode']}; engram-viz {prov['engram_viz']}, "
                f"torch {prov['torch']}, Python {prov['python']}; {prov['created']}")),
    ]  # fmt: skip
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items)
    warn = ""
    if prov.get("synthetic"):
        warn = (
            '<div class="warn"><b>Synthetic weights.</b> These weights are random, not trained: the gates '
            "show the arithmetic of the Engram path, not anything learned. Row ids, collisions and row usage "
            "depend only on the tokenizer and the layout and are exact.</div>"
        )
    if prov.get("streams_mode") == "embedding":
        warn += (
            '<div class="warn"><b>Proxy streams.</b> Each Engram layer read the token-embedding streams '
            "(the true input of layer 0), not the streams its preceding blocks would produce.</div>"
        )
    if prov.get("missing_glyphs"):
        warn += (
            '<div class="warn"><b>Missing glyphs.</b> No installed font has these characters, so the PNG/SVG '
            f"figures draw them as boxes (the HTML token views are unaffected): {html.escape(', '.join(prov['missing_glyphs']))}"
            "</div>"
        )
    return f'<dl class="prov">{rows}</dl>{warn}'


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


def render_html(
    prov: dict[str, Any],
    frames: dict[str, pd.DataFrame],
    figures: dict[str, tuple[list[Path], str, str]],
    token_sections: dict[int, str],
    out: Path,
) -> str:
    """The report page (one string, no scripts, no remote resources)."""
    title = "engram-viz report"
    parts = [
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n',
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n',
        f"<title>{html.escape(title)}: {html.escape(prov['config'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n",
        f"<h1>{html.escape(title)}</h1>\n",
        (
            '<div class="small">Engram memory path of DeepSeek-V4.1-Flash: per-stream gates, hash collisions and '
            "table row usage over a prompt set.</div>\n"
        ),
        "<h2>Provenance</h2>\n",
        _provenance_html(prov),
        "<h2>Gates by category</h2>\n",
        (
            "<p>Mean gate over text positions per prompt category and Engram layer, per stream and over all "
            "streams (median, spread and extremes in tables/gate_summary).</p>\n"
        ),
        _table_html(gate_overview(frames["gates"]), max_rows=80),
    ]

    def fig_html(name: str) -> str:
        paths, ftitle, caption = figures[name]
        png = next(p for p in paths if p.suffix == ".png")
        links = " ".join(
            f'<a href="{html.escape(p.relative_to(out).as_posix())}">{p.suffix[1:].upper()}</a>' for p in paths
        )
        return (
            f'<figure><img alt="{html.escape(ftitle)}" src="{_png_data_uri(png)}">'
            f"<figcaption><b>{html.escape(ftitle)}.</b> {html.escape(caption)} <span class='small'>[{links}]</span>"
            "</figcaption></figure>\n"
        )

    def section(heading: str, names: list[str], intro: str = "") -> None:
        names = [n for n in names if n in figures]
        if not names:
            return
        parts.append(f"<h2>{html.escape(heading)}</h2>\n")
        if intro:
            parts.append(f"<p>{intro}</p>\n")
        parts.extend(fig_html(n) for n in names)

    section("Gate distributions", ["gate_distributions"])
    parts.append(
        "<h2>Token-coloured text</h2>\n<p>Every prompt, each token's background its gate (mean over the "
        "streams). Hover a token for its position, the per-stream gates, its collision exposure and its 24 "
        "row ids. Image spans show as one grey chip (gate 0).</p>\n"
    )
    for layer, body in token_sections.items():
        parts.append(f"<h3>Engram layer {layer}</h3>\n{body}\n")
    section("Token-coloured text (figures)", sorted(n for n in figures if n.startswith("tokens_L")))
    section("Gate heatmaps", [n for n in figures if n.startswith("gates_")], "The first prompt of each category.")
    section("Collision exposure", [n for n in figures if n.startswith("exposure_")])
    parts.append(
        "<h2>Hash collisions</h2>\n<p>The key of an n-gram is its tuple of compressed ids (pads included), "
        "never its hash; a bucket collides when it holds two or more distinct keys of the prompt set. "
        "Expected figures are those of an ideal uniform hash into the same prime number of buckets.</p>\n"
    )
    cols = frames["collision_columns"]
    if len(cols):
        agg = cols.groupby(["layer", "order"], as_index=False)[
            ["distinct_ngrams", "occupied", "shared_buckets", "expected_shared_buckets", "colliding_ngrams"]
        ].sum()
        parts.append(_table_html(agg))
    section("", ["collisions_vs_expected"])
    if len(frames["collision_examples"]):
        parts.append("<h3>Colliding n-grams (decoded)</h3>\n" + _table_html(frames["collision_examples"], 30))
    parts.append("<h2>Row usage</h2>\n")
    usage_cols = frames["usage_columns"]
    if len(usage_cols):
        agg = usage_cols.groupby("layer", as_index=False)[["distinct_ngrams", "hits", "rows_touched", "prime"]].sum()
        agg["coverage"] = agg["rows_touched"] / agg["prime"]
        parts.append(_table_html(agg.rename(columns={"prime": "rows"})))
    section("", ["coverage", "rank_frequency", "touched_rows"])
    if len(frames["hot_rows"]):
        parts.append("<h3>Hottest rows and the n-grams that landed there</h3>\n" + _table_html(frames["hot_rows"], 30))
    listing = "".join(
        f"<li>{html.escape(p.relative_to(out).as_posix())}</li>" for p in sorted(out.rglob("*")) if p.is_file()
    )
    parts.append(f"<h2>Files</h2>\n<ul class='small'>{listing}</ul>\n</body>\n</html>\n")
    return "".join(parts)


# ------------------------------------------------------------------------------------ main job


def _sha256_file(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


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
) -> Report:
    """Run the prompt set and write the report into ``out`` (see the module docstring)."""
    import torch

    from engram_viz.run.pipeline import Pipeline
    from engram_viz.run.prompts import DEFAULT_PROMPTS, load_prompts
    from engram_viz.viz.export import check_offline_html, export_all

    say = log or (lambda msg: None)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prompts_file = Path(prompts) if prompts is not None else DEFAULT_PROMPTS
    prompt_set = load_prompts(prompts_file)
    say(f"loading weights ({'default' if checkpoint is None else checkpoint})")
    pipe = Pipeline(checkpoint, streams=streams, device=device, mode=mode, batch_size=batch_size)
    say(f"running {len(prompt_set)} prompts on {pipe.device}")
    trace = pipe.run(prompt_set, names=["engram.*.dot"], progress=progress)
    say("saving trace and tables")
    trace.save(out / "trace")
    frames = trace.to_frames()
    frames["gate_summary"] = gate_summary(frames["gates"])
    usage, collisions = accumulate(trace, pipe.config)
    frames["usage_columns"] = usage.coverage()
    frames["rank_frequency"] = usage.rank_frequency()
    frames["hot_rows"] = usage.hot_rows(top=10, ngrams_per_row=3, tokenizer=pipe.tokenizer)
    frames["collision_columns"] = collisions.columns()
    frames["heads_shared"] = collisions.heads_shared()
    frames["collision_examples"] = collisions.examples(n_examples=2, ngrams_per_bucket=3, tokenizer=pipe.tokenizer)
    tables = {name: write_table(df, out / "tables" / name) for name, df in frames.items()}

    say("drawing figures")
    figures: dict[str, tuple[list[Path], str, str]] = {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name, (make, title, caption) in _figures(trace, frames, usage, pipe.config, theme).items():
            fig = make()
            figures[name] = (export_all(fig, out / "figures" / name, FIGURE_FORMATS), title, caption)
            del fig
    missing_glyphs = _missing_glyphs(caught)
    if missing_glyphs:
        say(
            f"figures draw {len(missing_glyphs)} characters as boxes (no installed font has them): {', '.join(missing_glyphs)}"
        )

    from engram_viz.viz.tokens import token_html

    token_sections = {
        layer: token_html(frames["gates"], None, layer=layer, stream="mean", rows=frames["rows"], theme=theme,
                          full_page=False, fontsize=14.0)
        for layer in trace.layer_ids
    }  # fmt: skip
    n_img = int((trace.is_image & trace.valid).sum())
    prov = {
        "model": trace.model_label,
        "synthetic": bool(trace.meta.get("synthetic")) or "SYNTHETIC" in trace.model_label,
        "streams": trace.streams_label,
        "streams_mode": pipe.streams_mode,
        "config": pipe.config.name,
        "dim": pipe.config.dim,
        "hc_mult": pipe.config.hc_mult,
        "layers": list(trace.layer_ids),
        "prompts_file": str(prompts_file),
        "prompts_sha256": _sha256_file(prompts_file),
        "n_prompts": trace.batch_size,
        "n_tokens": int(trace.lengths.sum()),
        "n_image_positions": n_img,
        "device": str(pipe.device),
        "wkv_mode": mode,
        "engram_viz": _package_version(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "created": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "missing_glyphs": missing_glyphs,
    }
    manifest = {
        "provenance": prov,
        "tables": {k: [p.relative_to(out).as_posix() for p in v] for k, v in tables.items()},
        "figures": {k: [p.relative_to(out).as_posix() for p in v[0]] for k, v in figures.items()},
        "trace": "trace/",
        "html": "report.html",
    }
    _atomic_write(out / "manifest.json", lambda tmp: Path(tmp).write_text(json.dumps(manifest, indent=1)))
    page = render_html(prov, frames, figures, token_sections, out)
    check_offline_html(page, "report.html")
    if "<script" in page.lower():
        raise ReportError("report.html would contain a <script> element; the report must be script-free")
    html_path = _atomic_write(out / "report.html", lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    say(f"wrote {html_path}")
    return Report(
        out=out,
        html=html_path,
        tables=tables,
        figures={k: v[0] for k, v in figures.items()},
        trace=trace,
        provenance=prov,
    )


def _package_version() -> str:
    try:
        from importlib.metadata import version

        return version("engram-viz")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "unknown"


def summary_text(report: Report) -> str:
    """A few lines for the terminal."""
    buf = io.StringIO()
    p = report.provenance
    buf.write(f"report: {report.html}\n")
    buf.write(f"model: {p['model']}\nstreams: {p['streams']}\n")
    buf.write(f"{p['n_prompts']} prompts, {p['n_tokens']} positions; {len(report.tables)} tables, ")
    buf.write(f"{len(report.figures)} figures (png + svg) in {report.out}\n")
    return buf.getvalue()
