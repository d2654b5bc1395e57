"""What the notebooks (``notebooks/``) share, so that they hold a story and no logic.

- **Weights**: ``load_pipeline()`` runs on ``$ENGRAM_VIZ_CHECKPOINT`` (a checkpoint folder) when it
  is set, else on the embedded default (``Pipeline()``); ``provenance(x)`` is a box saying which
  model, weights and residual streams produced a Trace / Pipeline, and warns when the weights are
  synthetic. ``stamp(fig, label)`` writes the same label onto a figure.
- **Display**: ``show(fig, fallback)`` shows a plotly figure interactively *and* carries a static
  PNG (the matplotlib ``fallback``, or the plotly figure itself via kaleido when none is given
  and Chromium is there) in the same output, so a static viewer (GitHub) still shows a picture;
  ``setup()`` makes plotly emit its JSON mime type only (no ``<script>`` in any output).
- **Corpus**: ``corpus_sample()`` counts the n-grams of the default corpus (``corpus``: KJV +
  Chinese Debian Reference), capped at ``$ENGRAM_VIZ_CORPUS_TOKENS`` tokens per file (default
  60,000) so a notebook runs in seconds; falls back to the shipped prompt set when the Debian
  packages are missing, and says so.
- **Figures**: ``figures_dir()`` is ``$ENGRAM_VIZ_FIGURES_DIR`` or ``figures/`` at the repository
  root (notebook 07 writes there; CI points it at a temporary folder).
- **Small analyses** the stories need: ``stream_selectivity`` (which stream's gate separates
  multi-token patterns from random-token controls), ``ngram_windows_table`` (the n-gram windows
  of one prompt, blocked slots marked) and ``after_image_vs_fresh_start`` (the rows of the text
  after an image equal those of the same text starting a sequence).
"""

from __future__ import annotations

import base64
import html
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ENV_CHECKPOINT = "ENGRAM_VIZ_CHECKPOINT"
ENV_FIGURES = "ENGRAM_VIZ_FIGURES_DIR"
ENV_CORPUS_TOKENS = "ENGRAM_VIZ_CORPUS_TOKENS"
REPO = Path(__file__).resolve().parents[2]
PATTERN_CATEGORIES = ("english_entities", "chinese_entities", "idioms")
CONTROL_CATEGORIES = ("random_token",)


# ---------------------------------------------------------------------------------- set-up


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
        from matplotlib.figure import Figure

        shell.display_formatter.formatters["image/png"].for_type(Figure, lambda fig: _png(fig, dpi))


def load_pipeline(checkpoint: Any = None, **kwargs: Any):
    """A :class:`~engram_viz.run.pipeline.Pipeline` on ``checkpoint``, else ``$ENGRAM_VIZ_CHECKPOINT``,
    else the embedded default weights."""
    from engram_viz.apps.widgets import pipeline_from_env

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
    from engram_viz.config import load_config

    return Provenance(_LayoutOnly(load_config(config), data))


# ---------------------------------------------------------------------------------- figures


def stamp(fig: Any, label: str) -> Any:
    """Write ``label`` (shortened) on a figure: a matplotlib figure gets a small line in its
    bottom-left corner, a plotly figure a subtitle, a TokenView its title. Returns the figure."""
    from matplotlib.figure import Figure

    from engram_viz.viz.tokens import TokenView

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
    from engram_viz.viz.export import render_plotly, save_matplotlib

    if hasattr(fig, "savefig"):
        import tempfile

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
        import json

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
    path = Path(os.environ.get(ENV_FIGURES) or default or REPO / "figures")
    path.mkdir(parents=True, exist_ok=True)
    return path


# ------------------------------------------------------------------------------------ corpus


def corpus_tokens(default: int = 60_000) -> int:
    """Tokens read per corpus file: ``$ENGRAM_VIZ_CORPUS_TOKENS`` or ``default``."""
    raw = os.environ.get(ENV_CORPUS_TOKENS)
    if not raw:
        return default
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(f"${ENV_CORPUS_TOKENS}={raw!r}: expected a positive integer (tokens per file)") from None
    if n < 1:
        raise ValueError(f"${ENV_CORPUS_TOKENS}={raw!r}: expected a positive integer (tokens per file)")
    return n


def corpus_sample(config: Any = "v41-flash", tokens_per_file: int | None = None, tokenizer: Any = None):
    """``(CorpusStats, description)``: the first ``tokens_per_file`` tokens of each default corpus
    file (the KJV, the Chinese Debian Reference), counted into one ``NgramCounts``. Without the
    Debian packages: the shipped prompt set's texts, and the description says so."""
    import tempfile

    from engram_viz.analysis.corpus import CorpusError, count_corpus, default_corpus_files, default_corpus_sources
    from engram_viz.analysis.ngrams import NgramCounts
    from engram_viz.config import load_config
    from engram_viz.core.tokenizer import get_tokenizer
    from engram_viz.run.prompts import load_prompts

    cfg = load_config(config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    cap = tokens_per_file or corpus_tokens()
    try:
        files = default_corpus_files()
        names = [s["name"] for s in default_corpus_sources()]
        desc = f"default corpus: first {cap:,} tokens of each of " + "; ".join(names)
    except CorpusError as err:
        tmp = Path(tempfile.mkdtemp(prefix="engram-viz-corpus-"))
        text = "\n\n".join(p.text for p in load_prompts() if p.text)
        (tmp / "prompts.txt").write_text(text, encoding="utf-8")
        files = [tmp / "prompts.txt"]
        desc = f"FALLBACK corpus (the shipped prompt set): the default corpus is not installed ({err})"
    counts, stats = None, None
    for f in files:
        st = count_corpus([f], cfg, tok, max_tokens=cap, batch_chars=1 << 17, progress=False, counts=counts)
        counts = st.counts
        if stats is None:
            stats = st
        else:
            stats.files += st.files
            stats.tokens += st.tokens
            stats.documents += st.documents
            stats.raw_counts += st.raw_counts
            stats.elapsed_s += st.elapsed_s
    assert isinstance(counts, NgramCounts)
    return stats, desc


# -------------------------------------------------------------------------------- analyses


def stream_selectivity(
    gates: pd.DataFrame,
    patterns: Sequence[str] = PATTERN_CATEGORIES,
    controls: Sequence[str] = CONTROL_CATEGORIES,
    *,
    label: str | None = None,
) -> pd.DataFrame:
    """Per (layer, stream): how well the gate separates multi-token-pattern positions from controls.

    Two definitions: by prompt category (default: text positions of the ``patterns`` categories -
    named entities, idioms - against those of the random-token controls), or, with ``label``, by a
    boolean column of the frame (True = pattern, False = control, missing = left out; e.g. from
    ``ngram_frequency``: the n-gram ending at the position is frequent in a corpus vs never seen).

    Returns layer, stream, mean_pattern, mean_control, difference, auc (probability that a random
    pattern position has a higher gate than a random control position; 0.5 = no separation),
    pattern_positions, control_positions and rank (1 = most selective), sorted by auc descending.
    """
    text = gates[~gates["is_image"].astype(bool)]
    if label is not None:
        if label not in text.columns:
            raise ValueError(f"the gates frame has no column {label!r}; it has {list(text.columns)}")
        flag = text[label]
        pos, neg = text[flag.eq(True)], text[flag.eq(False)]
        what = f"{label} True and False"
    else:
        pos = text[text["category"].isin(patterns)]
        neg = text[text["category"].isin(controls)]
        what = f"both {list(patterns)} and {list(controls)} prompts"
    if pos.empty or neg.empty:
        raise ValueError(
            f"stream_selectivity needs text positions of {what}; "
            f"the frame has categories {sorted(pd.unique(gates['category']))}"
        )
    rows = []
    for (layer, stream), p in pos.groupby(["layer", "stream"]):
        n = neg[(neg["layer"] == layer) & (neg["stream"] == stream)]["gate"].to_numpy(dtype=float)
        x = p["gate"].to_numpy(dtype=float)
        ranks = pd.Series(np.concatenate([x, n])).rank().to_numpy()  # Mann-Whitney U via ranks (ties averaged)
        auc = (ranks[: len(x)].sum() - len(x) * (len(x) + 1) / 2) / (len(x) * len(n))
        rows.append(
            {
                "layer": int(layer),
                "stream": int(stream),
                "mean_pattern": float(x.mean()),
                "mean_control": float(n.mean()),
                "difference": float(x.mean() - n.mean()),
                "auc": float(auc),
                "pattern_positions": len(x),
                "control_positions": len(n),
            }
        )
    out = pd.DataFrame(rows).sort_values("auc", ascending=False, ignore_index=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out


def ngram_frequency(trace: Any, counts: Any, order: int = 3) -> pd.DataFrame:
    """For every text position of a trace, how often the ``order``-gram ending there occurs in a
    corpus (``counts``: an ``NgramCounts``, e.g. ``corpus_sample()[0].counts``): prompt, position,
    ngram_count; -1 where the n-gram is blocked (it reaches before the start or onto an image)."""
    from engram_viz.analysis.ngrams import sequence_windows, window_ngrams

    max_ngram = int(counts.config.engram_max_ngram_size)
    if not 2 <= order <= max_ngram:
        raise ValueError(f"order must be in 2..{max_ngram}, got {order}")
    pad = int(trace.meta.get("pad_compressed", counts.pad_id))
    recs = []
    for i, pid in enumerate(trace.prompt_ids):
        n = int(trace.lengths[i])
        mask = trace.token_types[i, :n].numpy() < 0
        c = np.where(mask, trace.compressed_ids[i, :n].numpy(), -1)
        windows, _ = sequence_windows(c, pad, max_ngram, mask)
        found = counts.count_of(window_ngrams(windows, order))
        t = np.arange(n)
        blocked = t < order - 1
        for s in range(1, order):
            blocked |= np.r_[np.ones(s, bool), ~mask[: n - s]] if n else blocked
        found = np.where(blocked | ~mask, -1, found)
        recs.append(pd.DataFrame({"prompt": pid, "position": t, "ngram_count": found}))
    return pd.concat(recs, ignore_index=True)


def ngram_windows_table(trace: Any, prompt: str | int = 0, tokenizer: Any = None) -> pd.DataFrame:
    """The n-gram windows one prompt's positions hash, one row per position: position, token,
    is_image, then for each order 2..max the n-gram it reads (decoded, or 'BLOCKED' when a slot of
    it lies before the sequence start or on an image position). Exactly the hasher's rule
    (``ngrams.ngram_windows``)."""
    from engram_viz.analysis.ngrams import sequence_windows

    i = trace.index(prompt) if isinstance(prompt, str) else int(prompt)
    n = int(trace.lengths[i])
    pad = int(trace.meta.get("pad_compressed", 2))
    c = trace.compressed_ids[i, :n].numpy()
    mask = trace.token_types[i, :n].numpy() < 0
    max_ngram = 4
    windows, _ = sequence_windows(np.where(mask, c, -1), pad, max_ngram, mask)
    pieces = trace.pieces[i]
    # slot s of a window is blocked when it reaches before the start or across an image
    blocked = np.zeros((n, max_ngram), dtype=bool)
    for t in range(n):
        for s in range(max_ngram):
            blocked[t, s] = t - s < 0 or not mask[t - s] or (s and blocked[t, s - 1])
    rows = []
    for t in range(n):
        rec = {"position": t, "token": pieces[t], "is_image": bool(not mask[t])}
        for order in range(2, max_ngram + 1):
            if blocked[t, :order].any():
                rec[f"{order}-gram"] = "BLOCKED"
            else:
                rec[f"{order}-gram"] = "".join(pieces[t - order + 1 : t + 1])
        rows.append(rec)
    _ = windows
    return pd.DataFrame(rows)


def after_image_vs_fresh_start(
    pipe: Any, text_after: str, before: str = "A photo: ", grid: str = "4x3"
) -> pd.DataFrame:
    """The first tokens after an image hash as a sequence start: the row ids of ``text_after``
    following ``before <image:grid>`` against those of ``text_after`` run alone without BOS
    (a fresh sequence). One row per token of ``text_after``: position after the image, token,
    equal_rows (all 24 x n_layers row ids equal), and orders blocked (n-grams reaching into the
    image). Uses the hasher directly (no weights needed)."""
    import torch

    from engram_viz.core.hashing import hash_prompt
    from engram_viz.run.images import build_input

    with_img = build_input(f"{before}<image:{grid}>{text_after}", pipe.tokenizer, pipe.config, bos=True)
    alone = build_input(text_after, pipe.tokenizer, pipe.config, bos=False)
    start = with_img.spans[-1].stop
    ids_img = torch.from_numpy(with_img.input_ids)[None]
    rows_img = hash_prompt(pipe.config, pipe.tokenizer.token_map, ids_img, torch.from_numpy(with_img.token_mask)[None])
    rows_alone = hash_prompt(pipe.config, pipe.tokenizer.token_map, torch.from_numpy(alone.input_ids)[None])
    n = min(len(alone.input_ids), len(with_img.input_ids) - start)
    pieces = pipe.tokenizer.pieces(alone.input_ids[:n].tolist())
    recs = []
    for k in range(n):
        a, b = rows_img[0, start + k], rows_alone[0, k]
        recs.append(
            {
                "position": start + k,
                "k_after_image": k,
                "token": pieces[k],
                "same_token": bool(with_img.input_ids[start + k] == alone.input_ids[k]),
                "equal_rows": bool(torch.equal(a, b)),
                "orders_reaching_image": [o for o in pipe.config.ngram_orders if o - 1 > k],
            }
        )
    return pd.DataFrame(recs)


# ---------------------------------------------------------------------------------- export


def check_file(path: str | Path) -> str:
    """'ok' when an exported file is valid and not empty (PDF header and a page, SVG parses as XML,
    PNG signature, HTML without a remote script), else what is wrong."""
    import xml.etree.ElementTree as ET

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
        from engram_viz.viz.export import check_offline_html

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
    from engram_viz.viz.export import BrowserNotFoundError, export_all, figure_kind

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
