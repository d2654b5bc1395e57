"""What the notebooks (``notebooks/``) share, so that they hold a story and no logic: the glue
between the suite and a notebook page. The analyses the stories run live in ``engram_viz.analysis``
(``selectivity``, ``trace_ngrams``, ``fresh_start``, ``corpus_counts.corpus_sample``).

- **Weights**: ``load_pipeline()`` runs on ``$ENGRAM_VIZ_CHECKPOINT`` (a checkpoint folder) when it
  is set, else on the embedded default (``Pipeline()``); ``provenance(x)`` is a box saying which
  model, weights and residual streams produced a Trace / Pipeline, and warns when the weights are
  synthetic (``viz.stamps``; the figures drawn from a Trace's frames stamp themselves).
- **Display**: ``show(fig, fallback)`` shows a plotly figure interactively *and* carries a static
  PNG (the matplotlib ``fallback``: a plot's Axes or a Figure; or the plotly figure itself via kaleido when none is given
  and Chromium is there) in the same output, so a static viewer (GitHub) still shows a picture;
  ``setup()`` makes plotly emit its JSON mime type only (no ``<script>`` in any output).
- **Figures**: ``figures_dir()`` is ``$ENGRAM_VIZ_FIGURES_DIR`` or ``out/figures/`` at the
  repository root (git-ignored: a run never writes over the README's tracked ``figures/``, which
  a maintainer regenerates with ``ENGRAM_VIZ_FIGURES_DIR=figures``; CI points it at a temporary
  folder); ``export_figures`` writes and checks them.
"""

from __future__ import annotations

import base64
import json
import tempfile
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from engram_viz import settings
from engram_viz._files import safe_name
from engram_viz.config import DATA_DIR, load_config
from engram_viz.run import provenance as run_provenance
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.export import (
    BrowserNotFoundError,
    check_offline_html,
    export_all,
    figure_kind,
    render_plotly,
    save_matplotlib,
)
from engram_viz.viz.stamps import ProvenanceBox
from engram_viz.viz.style import figure_of

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


def load_pipeline(checkpoint: Any = None, **kwargs: Any) -> Pipeline:
    """A :class:`~engram_viz.run.pipeline.Pipeline` on ``checkpoint``, else ``$ENGRAM_VIZ_CHECKPOINT``,
    else the embedded default weights (the one rule of ``weights.resolve``)."""
    return Pipeline(checkpoint, **kwargs)


def provenance(source: Any) -> ProvenanceBox:
    """The provenance box of a Trace, a Pipeline or a frame from a Trace (display it, or print it)."""
    return ProvenanceBox(source)


def layout_provenance(config: Any, data: str = "") -> ProvenanceBox:
    """The provenance box of a weight-free result (hash ids, collisions, row usage): exact for the
    layout of ``config``; ``data`` says what was counted."""
    return ProvenanceBox(run_provenance.layout_provenance(load_config(config), data))


def _png(fig: Any, dpi: int = 110) -> bytes:
    fig = figure_of(fig)  # a plot's Axes: its figure
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
    """Display a plotly ``fig`` interactively with a PNG of ``fallback`` (a matplotlib plot of the
    same data, its Axes or its Figure; else the plotly figure through kaleido) in the same output."""
    return Interactive(fig, fallback, dpi)


def figures_dir(default: str | Path | None = None) -> Path:
    """``$ENGRAM_VIZ_FIGURES_DIR``, else ``default``, else ``out/figures/`` at the repository root
    (git-ignored; created). Never the tracked ``figures/`` unless the variable says so."""
    path = Path(settings.figures_dir() or default or REPO / "out" / "figures")
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
    """Write every figure with ``export.export_all`` (matplotlib, a Figure or a plot's Axes: pdf,
    svg, png; plotly: html, and png/svg through kaleido when Chromium is there; TokenView: html,
    png, pdf, svg) and check each file; returns figure, format, path, bytes, check. A plotly figure
    without Chromium is written as HTML only and says so. A figure's files are named by its key
    through ``_files.safe_name`` (one component inside ``out_dir``, unique: ``../x`` stays inside)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recs, taken = [], set()
    for name, fig in figures.items():
        stem = out / safe_name(str(name), taken)
        try:
            paths = export_all(fig, stem, formats, dpi=dpi)
        except BrowserNotFoundError as err:
            paths = export_all(fig, stem, ["html"]) if figure_kind(fig) == "plotly" else []
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
