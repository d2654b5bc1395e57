"""What the notebooks (``notebooks/``) share, so that they hold a story and no logic: the glue
between the suite and a notebook page. The analyses the stories run live in ``engram_viz.analysis``
(``selectivity``, ``trace_ngrams``, ``fresh_start``, ``corpus_counts.corpus_sample``).

- **Weights**: ``load_pipeline()`` runs on ``$ENGRAM_VIZ_CHECKPOINT`` (a checkpoint folder) when it
  is set, else on the embedded default (``Pipeline()``); ``provenance(x)`` is a box saying which
  model, weights and residual streams produced a Trace / Pipeline, and warns when the weights are
  synthetic. ``stamp(fig, label)`` writes the same label onto a figure.
- **Display**: ``show(fig, fallback)`` shows a plotly figure interactively *and* carries a static
  PNG (the matplotlib ``fallback``, or the plotly figure itself via kaleido when none is given
  and Chromium is there) in the same output, so a static viewer (GitHub) still shows a picture;
  ``setup()`` makes plotly emit its JSON mime type only (no ``<script>`` in any output).
- **Figures**: ``figures_dir()`` is ``$ENGRAM_VIZ_FIGURES_DIR`` or ``figures/`` at the repository
  root (notebook 07 writes there; CI points it at a temporary folder); ``export_figures`` writes
  and checks them.
"""

from __future__ import annotations

import base64
import html
import json
import re
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from engram_viz import settings
from engram_viz.apps.widget import pipeline_from_env
from engram_viz.config import DATA_DIR, load_config
from engram_viz.viz.export import (
    BrowserNotFoundError,
    check_offline_html,
    export_all,
    figure_kind,
    render_plotly,
    save_matplotlib,
)
from engram_viz.viz.tokens import TokenView

REPO = DATA_DIR.parent  # the repository root (data/ lives there)


def setup(dpi: int = 110) -> None:
    """Notebook defaults: plotly figures render as their JSON mime type only (JupyterLab draws them
    with its plotly extension; no script tag, no CDN, nothing inlined), and the suite's matplotlib
    figures (built without pyplot) show as PNG at ``dpi``, saved under their theme's settings."""
    try:
        import plotly.io as pio

        pio.renderers.default = "plotly_mimetype"
    except ImportError:  # pragma: no cover - plotly is in the notebook extra
        pass
    try:
        from IPython import get_ipython
    except ImportError:  # pragma: no cover - IPython comes with the notebook extra
        return
    shell = get_ipython()
    if shell is not None:
        shell.display_formatter.formatters["image/png"].for_type(Figure, lambda fig: _png(fig, dpi))


def load_pipeline(checkpoint: Any = None, **kwargs: Any):
    """A :class:`~engram_viz.run.pipeline.Pipeline` on ``checkpoint``, else ``$ENGRAM_VIZ_CHECKPOINT``,
    else the embedded default weights."""
    return pipeline_from_env(checkpoint, **kwargs)


def short_label(label: str) -> str:
    """A model label without its folder path (``... at /root/.cache/...`` dropped)."""
    return re.sub(r"\s+(at|from)\s+/\S+$", "", str(label)).strip()


def _labels(x: Any) -> tuple[str, str, bool]:
    model = getattr(x, "model_label", "") or ""
    streams = getattr(x, "streams_label", "") or ""
    meta = getattr(x, "meta", {}) or {}
    synthetic = bool(meta.get("synthetic")) or bool(getattr(getattr(x, "checkpoint", None), "synthetic", False))
    return model, streams, synthetic or "SYNTHETIC" in model


class Provenance:
    """Which model, weights and streams produced a result; shows as a box (HTML) or text."""

    def __init__(self, source: Any):
        self.model, self.streams, self.synthetic = _labels(source)
        self.config = getattr(getattr(source, "config", None), "name", None) or (getattr(source, "meta", {}) or {}).get(
            "config", "?"
        )

    def _repr_html_(self) -> str:
        warn = (
            '<div style="margin-top:6px;color:#8a4b00"><b>Synthetic weights:</b> random, not trained. Gates show '
            "the arithmetic of the Engram path, not anything learned; row ids, collisions and row usage are exact "
            "(they depend only on the tokenizer and the layout).</div>"
            if self.synthetic
            else ""
        )
        return (
            '<div style="border:1px solid #dfe3ea;background:#f5f7fa;border-radius:6px;padding:8px 12px;'
            'font-size:13px;color:#1b1b1b"><b>Model and weights:</b> '
            f"{html.escape(self.model)}<br><b>Residual streams:</b> {html.escape(self.streams or '(set on first run)')}"
            f"<br><b>Config:</b> {html.escape(str(self.config))}{warn}</div>"
        )

    def __repr__(self) -> str:
        lines = [f"model and weights: {self.model}", f"residual streams: {self.streams}", f"config: {self.config}"]
        if self.synthetic:
            lines.append("SYNTHETIC weights: gates are not learned; hashes, collisions and row usage are exact")
        return "\n".join(lines)


def provenance(source: Any) -> Provenance:
    """The provenance box of a Trace or a Pipeline (display it, or print it)."""
    return Provenance(source)


class _LayoutOnly:
    def __init__(self, config: Any, data: str):
        self.model_label = f"none needed: exact for the {config.name} layout and the V4 tokenizer (no weights are read)"
        self.streams_label = f"none (no forward); data: {data}"
        self.meta = {"config": config.name}


def layout_provenance(config: Any, data: str = "") -> Provenance:
    """The provenance box of a weight-free result (hash ids, collisions, row usage): exact for the
    layout of ``config``; ``data`` says what was counted."""
    return Provenance(_LayoutOnly(load_config(config), data))


def stamp(fig: Any, label: str) -> Any:
    """Write ``label`` (shortened) on a figure: a matplotlib figure gets a small line in its
    bottom-left corner, a plotly figure a subtitle, a TokenView its title. Returns the figure."""
    text = short_label(label)
    if isinstance(fig, Figure):
        colour = "#9a9a9a" if getattr(fig, "engram_viz_theme", "light") == "dark" else "#6b6b6b"
        fig.text(0.003, 0.003, text, fontsize=5.5, color=colour, ha="left", va="bottom", parse_math=False)
    elif isinstance(fig, TokenView):
        fig.title = f"{fig.title} \u2014 {text}" if fig.title else text
    elif hasattr(fig, "update_layout"):
        title = fig.layout.title.text or ""
        fig.update_layout(title={"text": title, "subtitle": {"text": html.escape(text)}}, margin={"t": 70})
    else:
        raise TypeError(f"cannot stamp a {type(fig).__name__}; expected a matplotlib/plotly figure or a TokenView")
    return fig


def _png(fig: Any, dpi: int = 110) -> bytes:
    if hasattr(fig, "savefig"):
        with tempfile.TemporaryDirectory() as tmp:
            path = save_matplotlib(fig, Path(tmp) / "f.png", dpi=dpi)
            return path.read_bytes()
    (data,) = render_plotly(fig, ["png"])
    return data


class Interactive:
    """A plotly figure with a static PNG beside it in one output (see ``show``)."""

    def __init__(self, fig: Any, fallback: Any = None, dpi: int = 110):
        self.fig, self.fallback, self.dpi = fig, fallback, dpi

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        import plotly.io as pio

        bundle = {
            "application/vnd.plotly.v1+json": json.loads(pio.to_json(self.fig, validate=False)),
            "text/plain": f"plotly figure: {self.fig.layout.title.text or ''}",
        }
        try:
            png = _png(self.fallback if self.fallback is not None else self.fig, self.dpi)
        except Exception:  # noqa: BLE001 - no Chromium for kaleido: the interactive output still shows
            png = None
        if png:
            bundle["image/png"] = base64.b64encode(png).decode("ascii")
        return bundle


def show(fig: Any, fallback: Any = None, dpi: int = 110) -> Interactive:
    """Display a plotly ``fig`` interactively with a PNG of ``fallback`` (a matplotlib figure of
    the same data; else the plotly figure through kaleido) in the same output."""
    return Interactive(fig, fallback, dpi)


def figures_dir(default: str | Path | None = None) -> Path:
    """``$ENGRAM_VIZ_FIGURES_DIR``, else ``default``, else ``figures/`` at the repository root (created)."""
    path = Path(settings.figures_dir() or default or REPO / "figures")
    path.mkdir(parents=True, exist_ok=True)
    return path


def check_file(path: str | Path) -> str:
    """'ok' when an exported file is valid and not empty (PDF header and a page, SVG parses as XML,
    PNG signature, HTML without a remote script), else what is wrong."""
    path = Path(path)
    data = path.read_bytes()
    if not data:
        return "empty"
    kind = path.suffix.lower()
    if kind == ".pdf":
        return "ok" if data.startswith(b"%PDF") and b"/Type /Page" in data else "not a PDF with pages"
    if kind == ".svg":
        try:
            ET.fromstring(data)
        except ET.ParseError as err:
            return f"SVG does not parse: {err}"
        return "ok"
    if kind == ".png":
        return "ok" if data.startswith(b"\x89PNG\r\n\x1a\n") else "not a PNG"
    if kind == ".html":
        try:
            check_offline_html(data.decode("utf-8"), str(path))
        except ValueError as err:
            return str(err)
        return "ok"
    return "ok"


def export_figures(
    figures: dict[str, Any], out_dir: str | Path, formats: Sequence[str] | None = None, dpi: float = 200
) -> pd.DataFrame:
    """Write every figure with ``export.export_all`` (matplotlib: pdf, svg, png; plotly: html, and
    png/svg through kaleido when Chromium is there; TokenView: html, png, pdf, svg) and check each
    file; returns figure, format, path, bytes, check. A plotly figure without Chromium is written
    as HTML only and says so."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recs = []
    for name, fig in figures.items():
        try:
            paths = export_all(fig, out / name, formats, dpi=dpi)
        except BrowserNotFoundError as err:
            paths = export_all(fig, out / name, ["html"]) if figure_kind(fig) == "plotly" else []
            recs.append({"figure": name, "format": "png/svg", "path": "", "bytes": 0, "check": f"skipped: {err}"})
        for p in paths:
            recs.append(
                {
                    "figure": name,
                    "format": p.suffix.lstrip("."),
                    "path": str(p),
                    "bytes": p.stat().st_size,
                    "check": check_file(p),
                }
            )
    return pd.DataFrame(recs, columns=["figure", "format", "path", "bytes", "check"])
