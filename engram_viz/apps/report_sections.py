"""The report's sections, declared once: heading, intro and parts (figures to draw, tables, HTML).

:func:`report_sections` lists every section of ``report.html`` in page order: gate versus memory
(a tiny LM only), gates by category, gate distributions, token-coloured text (HTML, then figures),
gate heatmaps of the showcase prompts, real pictures beside their placeholder twins (when a prompt holds
one: the ``picture_twins`` table), collision exposure, hash collisions, row usage, row caches, and
quantised tables when candidates are given (``report --quant``). A figure is
a :class:`FigureSpec` (name, how to draw it, title, caption): the job draws and exports each one
and hands the page the drawn :class:`~engram_viz.viz.report_page.Figure` in its place.
:func:`trace_gate_memory` gives the gate-versus-memory analysis
(:func:`engram_viz.analysis.gates.gate_memory.gate_memory`) or None where it does not apply.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from typing import Any

import pandas as pd

from engram_viz.analysis.corpus.ngram_text import CASE_NOTE
from engram_viz.analysis.gates.gate_memory import (
    GROUPS,
    OFTEN,
    RANDOM_CATEGORY,
    GateMemory,
    gate_memory,
    training_counts,
)
from engram_viz.analysis.gates.picture_twin import twin_summary
from engram_viz.analysis.gates.summary import gate_overview
from engram_viz.analysis.quant.study import QuantStudy
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.apps.cache_sim_job import rows_frame_hit_rates
from engram_viz.config import EngramConfig
from engram_viz.errors import EngramVizError
from engram_viz.run.trace import Trace
from engram_viz.viz.cache_plots import hit_rate_vs_size
from engram_viz.viz.collision_plots import collisions_vs_expected
from engram_viz.viz.gate_plots import exposure_beside_gates, gate_distributions, gate_heatmap
from engram_viz.viz.memory_plots import gate_vs_memory
from engram_viz.viz.picture_plots import picture_twin_plot
from engram_viz.viz.quant_plots import quality_vs_bits
from engram_viz.viz.report_page import Html, Section, Table
from engram_viz.viz.token_figure import token_text_figure
from engram_viz.viz.tokens import token_html
from engram_viz.viz.usage_plots import coverage_per_column, row_rank_frequency, touched_rows_map

MAX_SHOWCASE = 8  # prompts drawn as heatmaps: the first of each category, at most this many
LAYER_TOTALS_NOTE = (
    "distinct_ngrams: the distinct (order, n-gram) keys at the text positions, each counted once (the 8 heads "
    "of an order read the same n-grams; the per-column table counts each n-gram in all 8). row_reads: text "
    "positions x 24 columns. rows_touched / rows: rows read at least once, of the layer's table."
)


@dataclass(frozen=True)
class FigureSpec:
    """A figure of the report before it is drawn: ``figures/<name>.png|.svg``, ``draw()`` makes it
    (returning the plot's Axes, or a Figure for the token text; the job exports either)."""

    name: str
    draw: Callable[[], Any]
    title: str
    caption: str


def missing(text: str) -> Html:
    """A short line in place of a figure or table that the prompt set cannot give (say what is missing)."""
    return Html(f'<p class="missing"><em>{escape(text)}</em></p>')


def showcase_prompts(trace: Trace, limit: int = MAX_SHOWCASE) -> list[str]:
    """The first prompt of each category (in file order), at most ``limit``."""
    seen, out = set(), []
    for pid, cat in zip(trace.prompt_ids, trace.categories):
        if cat not in seen:
            seen.add(cat)
            out.append(pid)
    return out[:limit]


def trace_gate_memory(trace: Trace, lm: Any, say: Callable[[str], None]) -> GateMemory | None:
    """Gate versus memory of ``trace``; None when ``lm`` (the tiny LM) is None or its training text
    is not installed (said through ``say``)."""
    if lm is None:
        return None
    try:
        counts = training_counts(lm.config, lm.provenance)
    except EngramVizError as err:
        say(f"gate-versus-memory section left out: {err}")
        return None
    return gate_memory(trace, lm, counts)


def _memory_section(memory: GateMemory, theme: str) -> Section:
    caption = (
        "Left: mean gate (over streams) on text positions whose trigram the tiny LM read in "
        f"training at least {OFTEN} times, 1-{OFTEN - 1} times or never, and on random-token "
        "controls, per Engram layer. Right: mean gate per bin of that training count, with the "
        "Spearman correlation of gate and log(1 + count); bars are 95% intervals of each bin's mean, n its "
        "positions, bins with none left off. Tables gate_memory, gate_count_curve, "
        "loss_by_category (loss saved by the open gates, nats, per prompt category and group); "
        "memory_targets_by_order groups the positions by their bigram, trigram and 4-gram instead."
    )
    figure = FigureSpec(
        "gate_vs_memory",
        lambda: gate_vs_memory(memory.summary, memory.curve, memory.rho, theme=theme),
        "Gate versus memory: do gates open on n-grams the model read?",
        caption,
    )
    intro = (
        "Does a gate open more where the model's memory holds the n-gram? Text positions grouped by how often "
        "the tiny LM read their trigram in training (its batches, not the whole training text), and random-token "
        "controls (tables gate_memory, gate_count_curve, loss_by_category, memory_targets; memory_targets_by_order "
        "for the bigram and the 4-gram)."
    )
    if not len(memory.summary):
        note = (
            "No text position of this prompt set has a trigram to count (image positions, or fewer than three "
            "text tokens in a row), so there is nothing to compare; add text prompts of three tokens or more."
        )
        return Section("gate-memory", "Gate versus memory", intro, (missing(note),))
    present = set(memory.summary["group"].astype(str))
    absent = [g for g in GROUPS if g not in present]
    notes = ()
    if absent:
        why = f" (the random group needs prompts of category {RANDOM_CATEGORY!r})" if "random" in absent else ""
        notes = (missing(f"No positions in the memory group(s) {', '.join(absent)} in this prompt set{why}."),)
    return Section("gate-memory", "Gate versus memory", intro, (figure, *notes))


def _gate_sections(trace: Trace, gates: pd.DataFrame, rows: pd.DataFrame, theme: str) -> list[Section]:
    """Gates by category, distributions, token-coloured text (HTML and figures), heatmaps."""
    show = showcase_prompts(trace)
    has_text = bool((~gates["is_image"].astype(bool)).any())
    no_text = missing("No text positions in this prompt set (image spans only): gates of text are what this shows.")
    categories = sorted(set(trace.categories))
    one_category = (
        (missing(f"One prompt category only ({categories[0]!r}): add prompts of other categories to compare."),)
        if len(categories) == 1
        else ()
    )
    by_category = Section(
        "gates-by-category",
        "Gates by category",
        "Mean gate over text positions per prompt category and Engram layer, per stream and over all "
        "streams (median, spread and extremes in tables/gate_summary).",
        (Table(gate_overview(gates), max_rows=80), *one_category) if has_text else (no_text,),
    )
    distributions = FigureSpec(
        "gate_distributions",
        lambda: gate_distributions(gates, by="category", theme=theme),
        "Gates by prompt category",
        "Per layer, the distribution of gate values over text positions, one box per stream. "
        "Image positions are left out (their gate is 0 by construction).",
    )
    token_text = tuple(
        Html(
            token_html(gates, None, layer=layer, stream="mean", rows=rows, theme=theme, full_page=False, fontsize=14.0),
            heading=f"Engram layer {layer}",
        )
        for layer in trace.layer_ids
    )
    token_figures = tuple(
        FigureSpec(
            f"tokens_L{layer}",
            lambda layer=layer: token_text_figure(
                gates, show, layer=layer, stream="mean", theme=theme, title=f"Gate (mean of streams), layer {layer}"
            ),
            f"Token-coloured text, layer {layer}",
            "Each token's background is its gate (mean over streams); image spans are one grey chip.",
        )
        for layer in trace.layer_ids
    )
    heatmaps = tuple(
        FigureSpec(
            f"gates_{pid}",
            lambda pid=pid: gate_heatmap(gates, pid, theme=theme),
            f"Gates of {pid!r}",
            "Stream x position heatmap of the gates, all Engram layers stacked; one cell and font size on every "
            "prompt (a long prompt wraps onto further panels); an image span is one grey column.",
        )
        for pid in show
    )
    token_intro = (
        "Every prompt, each token's background its gate (mean over the streams). Hover a token for its position, "
        "the per-stream gates, its collision exposure and its 24 row ids. Image spans show as one grey chip (gate 0)."
    )
    return [
        by_category,
        Section("gate-distributions", "Gate distributions", "", (distributions,) if has_text else (no_text,)),
        Section("token-text", "Token-coloured text", token_intro, token_text),
        Section("token-figures", "Token-coloured text (figures)", "", token_figures),
        Section("gate-heatmaps", "Gate heatmaps", "The first prompt of each category.", heatmaps),
    ]


def _picture_section(twins: pd.DataFrame, theme: str) -> Section:
    """Each prompt with a real picture beside its placeholder twin (``picture_twins``)."""
    streams = str(twins.attrs.get("provenance", {}).get("streams", ""))
    merged = "picture spans carry image features" in streams
    intro = (
        "Each prompt holding a real picture beside its placeholder twin: the same prompt with <image:WxHpx> "
        "of the picture's size in its place (the same span, hashes and shut gates, no image features). The "
        "gates of the text after the picture differ only through the image features reaching it. "
        + (
            "These streams merge the picture's features (see the streams label)."
            if merged
            else "These streams merge no image features, so the twins agree (see the streams label); "
            "streams='block0' on a checkpoint with the vision tower merges them."
        )
    )
    figures = tuple(
        FigureSpec(
            f"picture_twin_{k}",
            lambda pid=pid: picture_twin_plot(twins, pid, theme=theme),
            f"{pid!r} beside its placeholder twin",
            "Gate of the prompt with the picture minus gate of its placeholder twin, per text position after "
            "the picture; thin lines: streams, bold: their mean.",
        )
        for k, pid in enumerate(pd.unique(twins["prompt"]))
    )
    return Section(
        "picture-twins", "Pictures beside their placeholder twins", intro, (Table(twin_summary(twins)), *figures)
    )


def _exposure_section(trace: Trace, gates: pd.DataFrame, theme: str) -> Section:
    """Collision exposure beside the gates of the first text prompt (none without an exposure column)."""
    show = showcase_prompts(trace)
    if "exposure" not in gates.columns or not show:
        return Section("collision-exposure", "Collision exposure")
    if not (~gates["is_image"].astype(bool)).any():
        note = missing("No text positions in this prompt set (image spans only): no n-gram to collide.")
        return Section("collision-exposure", "Collision exposure", "", (note,))
    first_text = next((p for p, c in zip(trace.prompt_ids, trace.categories) if c != "image"), show[0])
    figure = FigureSpec(
        f"exposure_{first_text}",
        lambda: exposure_beside_gates(gates, first_text, theme=theme),
        f"Collision exposure beside gates, {first_text!r}",
        "Bars: how many of a position's 24 rows also hold a different n-gram of the prompt set; "
        "r is the correlation of exposure with the mean gate over text positions.",
    )
    return Section("collision-exposure", "Collision exposure", "", (figure,))


def _collision_section(frames: dict[str, pd.DataFrame], theme: str) -> Section:
    """Collisions per (layer, order), against an ideal hash, and decoded examples."""
    parts: list[Any] = []
    cols = frames["collision_columns"]
    if not len(cols):
        note = missing("No text n-grams in this prompt set (image spans only): nothing to hash.")
        return Section("collisions", "Hash collisions", "", (note,))
    sums = ["occupied", "shared_buckets", "expected_shared_buckets", "colliding_ngrams"]
    per_order = cols.groupby(["layer", "order"], as_index=False).agg(
        distinct_ngrams=("distinct_ngrams", "max"), **{c: (c, "sum") for c in sums}
    )
    note = (
        "distinct_ngrams: the order's distinct n-grams, each counted once (every head of the order hashes the "
        "same ones); occupied, shared_buckets, expected_shared_buckets and colliding_ngrams: summed over its 8 heads."
    )
    parts.append(Table(per_order, note=note))
    parts.append(
        FigureSpec(
            "collisions_vs_expected",
            lambda: collisions_vs_expected(cols, theme=theme),
            "Hash collisions vs an ideal uniform hash",
            "Per (order, head) column: buckets holding two or more distinct n-grams of the prompt set "
            "(bars) against the expectation for a uniform hash into the same prime number of buckets.",
        )
    )
    if len(frames["collision_examples"]):
        note = f"{CASE_NOTE[0].upper()}{CASE_NOTE[1:]}."
        parts.append(Table(frames["collision_examples"], "Colliding n-grams (decoded)", 30, note))
    intro = (
        "The key of an n-gram is its tuple of compressed ids (pads included), never its hash; a bucket collides "
        "when it holds two or more distinct keys of the prompt set. Expected figures are those of an ideal "
        "uniform hash into the same prime number of buckets."
    )
    return Section("collisions", "Hash collisions", intro, tuple(parts))


def _usage_section(frames: dict[str, pd.DataFrame], usage: RowUsage, config: EngramConfig, theme: str) -> Section:
    """Rows touched per layer, coverage, rank-frequency, the touched-row map, the hottest rows."""
    parts: list[Any] = []
    usage_cols = frames["usage_columns"]
    if not len(usage_cols) or not usage_cols["rows_touched"].sum():
        note = missing("No text n-grams in this prompt set (image spans only): no table row is read.")
        return Section("row-usage", "Row usage", "", (note,))
    parts.append(Table(frames["layer_totals"], note=LAYER_TOTALS_NOTE))
    parts += [
        FigureSpec(
            "coverage",
            lambda: coverage_per_column(usage_cols, theme=theme),
            "Row coverage per column",
            "Fraction of each column's rows read by the prompt set (rows touched / prime), on a linear axis from 0.",
        ),
        FigureSpec(
            "rank_frequency",
            lambda: row_rank_frequency(frames["rank_frequency"], theme=theme),
            "Row rank-frequency",
            "Hits of the r-th most read row, per layer (log-log), n-grams of only BOS and pad (every prompt's "
            "start) left out (RowUsage.rank_frequency(specials=True) keeps them).",
        )
        if len(frames["rank_frequency"])
        else missing("Row rank-frequency left out: every row read holds an n-gram of only BOS and pad."),
        FigureSpec(
            "touched_rows",
            lambda: touched_rows_map(usage, config, theme=theme),
            "Where the touched rows lie",
            "Each strip is one (order, head) column's row range split into bins; colour = fraction of rows touched.",
        ),
    ]
    if len(frames["hot_rows"]):
        note = (
            "n-grams of only BOS and pad (every prompt's start) are left out (RowUsage.hot_rows(specials=True) "
            f"keeps them). {CASE_NOTE[0].upper()}{CASE_NOTE[1:]}."
        )
        parts.append(Table(frames["hot_rows"], "Hottest rows and the n-grams that landed there", 30, note))
    return Section("row-usage", "Row usage", "", tuple(parts))


QUANT_COLUMNS = ["candidate", "bits_per_weight", "table_gb", "row_error", "gate_change_p99", "streams_moved"]
QUANT_COLUMNS += ["streams_crossed", "delta_loss", "kl"]


def _quant_section(study: QuantStudy, theme: str) -> Section:
    caption = (
        "Each candidate table against the tiny LM's fp8 tables over the report's prompts: KL of the next-token "
        "distribution (nats, left) and the 99th percentile of the largest gate change per position (right), "
        "against bits per weight; the legend gives the size of one V4.1-Flash table stored so. Tables "
        "quant_summary, quant_row_error (per order and head), quant_by_category, quant_by_group."
    )
    figure = FigureSpec(
        "quant_quality", lambda: quality_vs_bits(study.summary, theme=theme), "Quality against bits per weight", caption
    )
    intro = (
        "What quantised Engram tables cost: the fp8 rows quantised with gguf's own quantisers (read back as a GGUF "
        "file's table is) or GGUF files, and Engram off as the end point: row error, gates moved by more than 0.05 "
        "or crossing 0.5, next-token loss change and KL."
    )
    return Section("quant", "Quantised tables", intro, (figure, Table(study.summary[QUANT_COLUMNS].round(6))))


def _cache_section(frames: dict[str, pd.DataFrame], config: EngramConfig, theme: str) -> Section:
    """Row-cache hit rate against size for the prompt set's own row accesses (libCacheSim)."""
    try:
        hit = rows_frame_hit_rates(frames["rows"], config)
    except EngramVizError as err:  # no libcachesim, or no rows to read
        return Section("row-caches", "Row caches", "", (missing(f"Row caches left out: {err}"),))
    table = hit.pivot_table(index=["layer", "cache_rows"], columns="policy", values="hit_rate", sort=False)
    figure = FigureSpec(
        "cache_hit_rate",
        lambda: hit_rate_vs_size(hit, theme=theme),
        "Row-cache hit rate against size",
        "The prompt set's row reads in token order, one cache per Engram layer, per policy (libCacheSim); "
        "Belady (dashed) is the offline optimum, the dotted line an infinite cache (only first reads miss).",
    )
    intro = (
        "If the tables sat on host memory or disk behind a cache of hot rows, how many of this prompt set's "
        "reads would it serve? Sizes up to the rows the prompts read; `engram-viz cache-sim` runs a corpus."
    )
    return Section("row-caches", "Row caches", intro, (Table(table.reset_index(), max_rows=40), figure))


def report_sections(
    trace: Trace,
    frames: dict[str, pd.DataFrame],
    usage: RowUsage,
    config: EngramConfig,
    theme: str,
    memory: GateMemory | None = None,
    quant: QuantStudy | None = None,
) -> list[Section]:
    """Every section of the report in page order (see the module docstring); ``frames``: the
    report's tables by name (``gates``, ``rows``, ``collision_columns``, ``collision_examples``,
    ``usage_columns``, ``hot_rows`` are used)."""
    gates = frames["gates"]
    return [
        *([_memory_section(memory, theme)] if memory is not None else []),
        *_gate_sections(trace, gates, frames["rows"], theme),
        *([_picture_section(frames["picture_twins"], theme)] if len(frames.get("picture_twins", ())) else []),
        _exposure_section(trace, gates, theme),
        _collision_section(frames, theme),
        _usage_section(frames, usage, config, theme),
        *([_quant_section(quant, theme)] if quant is not None else []),
        _cache_section(frames, config, theme),
    ]
