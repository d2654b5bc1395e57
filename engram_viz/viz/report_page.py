"""The report page: one self-contained HTML string (no scripts, no remote resources).

:func:`render_html` lays out what ``engram-viz report`` produced: the provenance, the gate table
per category, the figures (embedded as PNG data URIs, their PNG/SVG files linked relatively), the
token-coloured text of every prompt, the collision and row-usage tables, and the list of files.
"""

from __future__ import annotations

import base64
import html
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engram_viz._files import flatten_tuples
from engram_viz.analysis.gates.summary import gate_overview

TITLE = "engram-viz report"

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

_SYNTHETIC_WARNING = (
    '<div class="warn"><b>Synthetic weights.</b> These weights are random, not trained: the gates '
    "show the arithmetic of the Engram path, not anything learned. Row ids, collisions and row usage "
    "depend only on the tokenizer and the layout and are exact.</div>"
)
_PROXY_STREAMS_WARNING = (
    '<div class="warn"><b>Proxy streams.</b> Each Engram layer read the token-embedding streams '
    "(the true input of layer 0), not the streams its preceding blocks would produce.</div>"
)


def _table_html(df: pd.DataFrame, max_rows: int = 40, floatfmt: str = "{:.4g}") -> str:
    """The first ``max_rows`` rows as an HTML table, with a note when rows were left out."""
    shown = flatten_tuples(df.head(max_rows))
    body = shown.to_html(index=False, classes="ev", border=0, float_format=lambda v: floatfmt.format(v), escape=True)
    more = (
        f'<div class="small">first {max_rows} of {len(df)} rows; all in the tables folder</div>'
        if len(df) > max_rows
        else ""
    )
    return body + more


_MEMORY_INTRO = (
    "Does a gate open more where the model's memory holds the n-gram? Text positions grouped by how often "
    "the tiny LM read their trigram in training (its batches, not the whole training text), and random-token "
    "controls (tables gate_memory, "
    "gate_count_curve, loss_by_category, memory_targets; memory_targets_by_order for the bigram and the 4-gram)."
)


def _provenance_html(prov: dict[str, Any]) -> str:
    """Model, streams, config, prompts and run as a definition list, then any warnings."""
    items = [
        ("Model and weights", prov["model"]),
        ("Residual streams", prov["streams"]),
        ("Config", f"{prov['config']} (dim {prov['dim']}, {prov['hc_mult']} streams, Engram layers {prov['layers']})"),
        ("Prompts", (f"{prov.get('prompt_set', 'custom')} set: {prov['prompts_file']} - {prov['n_prompts']} prompts, {prov['n_tokens']} positions "
                    f"({prov['n_image_positions']} in image spans); sha256 {prov['prompts_sha256'][:16]}")),
        ("Run", (f"device {prov['device']}, wkv mode {prov['wkv_mode']}; engram-viz {prov['engram_viz']}, "
                f"torch {prov['torch']}, Python {prov['python']}; {prov['created']}")),
    ]  # fmt: skip
    rows = "".join(f"<dt>{html.escape(k)}</dt><dd>{html.escape(str(v))}</dd>" for k, v in items)
    warn = _SYNTHETIC_WARNING if prov.get("synthetic") else ""
    if prov.get("streams_mode") == "embedding":
        warn += _PROXY_STREAMS_WARNING
    if prov.get("missing_glyphs"):
        warn += (
            '<div class="warn"><b>Missing glyphs.</b> No installed font has these characters, so the PNG/SVG '
            f"figures draw them as boxes (the HTML token views are unaffected): {html.escape(', '.join(prov['missing_glyphs']))}"
            "</div>"
        )
    return f'<dl class="prov">{rows}</dl>{warn}'


@dataclass
class _Figures:
    """The drawn figures (name -> (files, title, caption)) and the report folder they lie in."""

    figures: dict[str, tuple[list[Path], str, str]]
    out: Path

    def figure(self, name: str) -> str:
        """One ``<figure>``: the PNG as a data URI, the caption, links to every file of the figure."""
        paths, title, caption = self.figures[name]
        png = next(p for p in paths if p.suffix == ".png")
        uri = "data:image/png;base64," + base64.b64encode(png.read_bytes()).decode("ascii")
        links = " ".join(
            f'<a href="{html.escape(p.relative_to(self.out).as_posix())}">{p.suffix[1:].upper()}</a>' for p in paths
        )
        return (
            f'<figure><img alt="{html.escape(title)}" src="{uri}">'
            f"<figcaption><b>{html.escape(title)}.</b> {html.escape(caption)} <span class='small'>[{links}]</span>"
            "</figcaption></figure>\n"
        )

    def section(self, heading: str, names: list[str], intro: str = "") -> str:
        """A heading, an optional intro and the named figures that exist; "" when none does."""
        names = [n for n in names if n in self.figures]
        if not names:
            return ""
        intro_html = f"<p>{intro}</p>\n" if intro else ""
        return f"<h2>{html.escape(heading)}</h2>\n" + intro_html + "".join(self.figure(n) for n in names)

    def starting(self, prefix: str) -> list[str]:
        """Names of the figures whose name starts with ``prefix``, in drawing order."""
        return [n for n in self.figures if n.startswith(prefix)]


def _head(prov: dict[str, Any]) -> str:
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html.escape(TITLE)}: {html.escape(prov['config'])}</title>\n<style>{_CSS}</style>\n</head>\n<body>\n"
        f"<h1>{html.escape(TITLE)}</h1>\n"
        '<div class="small">Engram memory path of DeepSeek-V4.1-Flash: per-stream gates, hash collisions and '
        "table row usage over a prompt set.</div>\n"
        "<h2>Provenance</h2>\n"
    )


def _gates_by_category(gates: pd.DataFrame) -> str:
    return (
        "<h2>Gates by category</h2>\n"
        "<p>Mean gate over text positions per prompt category and Engram layer, per stream and over all "
        "streams (median, spread and extremes in tables/gate_summary).</p>\n"
        + _table_html(gate_overview(gates), max_rows=80)
    )


def _token_text(token_sections: dict[int, str]) -> str:
    intro = (
        "<h2>Token-coloured text</h2>\n<p>Every prompt, each token's background its gate (mean over the "
        "streams). Hover a token for its position, the per-stream gates, its collision exposure and its 24 "
        "row ids. Image spans show as one grey chip (gate 0).</p>\n"
    )
    return intro + "".join(f"<h3>Engram layer {layer}</h3>\n{body}\n" for layer, body in token_sections.items())


def _collisions(frames: dict[str, pd.DataFrame], figs: _Figures) -> str:
    intro = (
        "<h2>Hash collisions</h2>\n<p>The key of an n-gram is its tuple of compressed ids (pads included), "
        "never its hash; a bucket collides when it holds two or more distinct keys of the prompt set. "
        "Expected figures are those of an ideal uniform hash into the same prime number of buckets.</p>\n"
    )
    parts = [intro]
    cols = frames["collision_columns"]
    if len(cols):
        agg = cols.groupby(["layer", "order"], as_index=False)[
            ["distinct_ngrams", "occupied", "shared_buckets", "expected_shared_buckets", "colliding_ngrams"]
        ].sum()
        parts.append(_table_html(agg))
    parts.append(figs.section("", ["collisions_vs_expected"]))
    if len(frames["collision_examples"]):
        parts.append("<h3>Colliding n-grams (decoded)</h3>\n" + _table_html(frames["collision_examples"], 30))
    return "".join(parts)


def _row_usage(frames: dict[str, pd.DataFrame], figs: _Figures) -> str:
    parts = ["<h2>Row usage</h2>\n"]
    usage_cols = frames["usage_columns"]
    if len(usage_cols):
        agg = usage_cols.groupby("layer", as_index=False)[["distinct_ngrams", "hits", "rows_touched", "prime"]].sum()
        agg["coverage"] = agg["rows_touched"] / agg["prime"]
        parts.append(_table_html(agg.rename(columns={"prime": "rows"})))
    parts.append(figs.section("", ["coverage", "rank_frequency", "touched_rows"]))
    if len(frames["hot_rows"]):
        parts.append("<h3>Hottest rows and the n-grams that landed there</h3>\n" + _table_html(frames["hot_rows"], 30))
    return "".join(parts)


def _file_list(out: Path) -> str:
    listing = "".join(
        f"<li>{html.escape(p.relative_to(out).as_posix())}</li>" for p in sorted(out.rglob("*")) if p.is_file()
    )
    return f"<h2>Files</h2>\n<ul class='small'>{listing}</ul>\n</body>\n</html>\n"


def render_html(
    prov: dict[str, Any],
    frames: dict[str, pd.DataFrame],
    figures: dict[str, tuple[list[Path], str, str]],
    token_sections: dict[int, str],
    out: Path,
) -> str:
    """The report page (one string, no scripts, no remote resources).

    ``prov``: the provenance of the manifest; ``frames``: the report tables by name (``gates``,
    ``collision_columns``, ``collision_examples``, ``usage_columns``, ``hot_rows`` are shown);
    ``figures``: name -> (files, title, caption); ``token_sections``: layer -> token-coloured HTML;
    ``out``: the report folder (links are relative to it; its files are listed at the end).
    """
    figs = _Figures(figures, out)
    return "".join(
        [
            _head(prov),
            _provenance_html(prov),
            figs.section("Gate versus memory", ["gate_vs_memory"], _MEMORY_INTRO),
            _gates_by_category(frames["gates"]),
            figs.section("Gate distributions", ["gate_distributions"]),
            _token_text(token_sections),
            figs.section("Token-coloured text (figures)", sorted(figs.starting("tokens_L"))),
            figs.section("Gate heatmaps", figs.starting("gates_"), "The first prompt of each category."),
            figs.section("Collision exposure", figs.starting("exposure_")),
            _collisions(frames, figs),
            _row_usage(frames, figs),
            _file_list(out),
        ]
    )
