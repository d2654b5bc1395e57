"""Figures of engram_viz.viz on synthetic tidy frames built from real tokenizer pieces (English,
Chinese, code, an image span) and real hashed row ids of the tiny preset."""

from __future__ import annotations

import io
import logging
import warnings
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from matplotlib.image import AxesImage

from engram_viz.config import load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import EngramVizError
from engram_viz.viz import (
    THEMES,
    CJKFontMissingError,
    CJKFontWarning,
    TokenView,
    cjk_font,
    collisions_vs_expected,
    coverage_per_column,
    exposure_beside_gates,
    gate_distributions,
    gate_heatmap,
    gate_heatmap_interactive,
    heads_shared_vs_expected,
    paper_rc,
    require_cjk_font,
    row_rank_frequency,
    token_cells,
    token_html,
    token_text_figure,
    token_view,
    touched_rows_map,
)
from engram_viz.viz import style as style_module
from engram_viz.viz.frames import COLLISION_COLUMNS, COVERAGE_COLUMNS, gate_table, reduce_streams
from engram_viz.viz.style import figure_of
from engram_viz.viz.token_heatmap import CELL_IN, TICK_PT, WIDTH_IN
from engram_viz.viz.usage_plots import _bin_sizes

PROMPTS = {
    "zh-inventions": ("zh-entity", "四大发明是造纸术、指南针、火药和印刷术。"),
    "zh-zhang": ("zh-entity", "张仲景是东汉末年的医学家。"),
    "en-alexander": ("en-entity", "Alexander the Great was born in Pella in 356 BC.\nHe died in Babylon."),
    "code": ("code", "if a < b: print('<br> & $x$')"),
}
IMAGE_PROMPT, IMAGE_AT, IMAGE_LEN = "en-alexander", 3, 6
LAYERS = (1, 3)  # the tiny preset's Engram layers
N_STREAMS = 4
GLYPH_MISSING = "missing from font"


def _pieces(tokenizer, pid: str, text: str) -> list[str]:
    pieces = tokenizer.pieces(tokenizer.encode(text))
    if pid == IMAGE_PROMPT:
        pieces = pieces[:IMAGE_AT] + ["<image>"] * IMAGE_LEN + pieces[IMAGE_AT:]
    return pieces


def build_gates(tokenizer, seed: int = 0) -> pd.DataFrame:
    """gates: prompt, position, token, is_image, layer, stream, gate, exposure, category."""
    rng = np.random.default_rng(seed)
    recs = []
    for pid, (category, text) in PROMPTS.items():
        for pos, piece in enumerate(_pieces(tokenizer, pid, text)):
            image = piece == "<image>"
            for layer in LAYERS:
                exposure = 0 if image else int(rng.integers(0, 25))
                for stream in range(N_STREAMS):
                    gate = 0.0 if image else float(rng.uniform())
                    recs.append((pid, pos, piece, image, layer, stream, gate, exposure, category))
    cols = ["prompt", "position", "token", "is_image", "layer", "stream", "gate", "exposure", "category"]
    return pd.DataFrame(recs, columns=cols)


def build_rows(tokenizer) -> pd.DataFrame:
    """rows: prompt, position, layer, order, head, row - real row ids of the tiny layout (text prompts)."""
    cfg = load_config("tiny")
    recs = []
    for pid, (_, text) in PROMPTS.items():
        ids = torch.tensor([tokenizer.encode(text)])
        rows = hash_prompt(cfg, tokenizer.token_map, ids)[0].numpy()  # [T, n_layers, 24]
        for pos in range(rows.shape[0]):
            for li, layer in enumerate(cfg.engram_layer_ids):
                for col in range(rows.shape[2]):
                    recs.append((pid, pos, layer, col // 8 + 2, col % 8, int(rows[pos, li, col])))
    return pd.DataFrame(recs, columns=["prompt", "position", "layer", "order", "head", "row"])


def build_tables(rows: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """usage (layer, row, hits), coverage and collisions per column, brute force from ``rows``."""
    layout = EngramLayout(load_config("tiny"))
    usage = rows.groupby(["layer", "row"]).size().rename("hits").reset_index()
    cov, col = [], []
    for li, layer in enumerate(layout.layer_ids):
        for order in layout.config.ngram_orders:
            for head in range(layout.n_heads):
                prime = int(layout.column_primes[li, layout.column(order, head)])
                at = rows[(rows["layer"] == layer) & (rows["order"] == order) & (rows["head"] == head)]
                touched = int(at["row"].nunique())
                cov.append((layer, order, head, prime, touched, touched / prime))
                k, q = len(at), 1 - 1 / prime  # positions stand in for distinct n-grams: shapes only
                shared = int((at["row"].value_counts() > 1).sum())
                col.append(
                    (
                        layer,
                        order,
                        head,
                        prime,
                        k,
                        touched,
                        shared,
                        prime * (1 - q**k),
                        prime - prime * q**k - k * q ** (k - 1),
                    )
                )
    coverage = pd.DataFrame(cov, columns=list(COVERAGE_COLUMNS))
    collisions = pd.DataFrame(col, columns=list(COLLISION_COLUMNS))
    return usage, coverage, collisions


@pytest.fixture(scope="module")
def gates(tokenizer) -> pd.DataFrame:
    return build_gates(tokenizer)


@pytest.fixture(scope="module")
def rows(tokenizer) -> pd.DataFrame:
    return build_rows(tokenizer)


@pytest.fixture(scope="module")
def tables(rows):
    return build_tables(rows)


def all_paper_plots(gates, tables, theme: str) -> dict[str, object]:
    """What each paper plot returns (its Axes; the token text its Figure)."""
    usage, coverage, collisions = tables
    return {
        "token_text": token_text_figure(gates, theme=theme, title="Engram gates"),
        "gate_heatmap": gate_heatmap(gates, "en-alexander", theme=theme),
        "gate_distributions": gate_distributions(gates, theme=theme),
        "exposure_beside_gates": exposure_beside_gates(gates, "zh-zhang", theme=theme),
        "collisions_vs_expected": collisions_vs_expected(collisions, theme=theme),
        "coverage_per_column": coverage_per_column(coverage, theme=theme),
        "row_rank_frequency": row_rank_frequency(usage, theme=theme),
        "touched_rows_map": touched_rows_map(usage, "tiny", bins=64, theme=theme),
        "heads_shared_vs_expected": heads_shared_vs_expected(_heads_shared(), theme=theme),
    }


def _heads_shared() -> pd.DataFrame:
    """A heads_shared frame of the tiny layout's shape (made-up counts: the layout is what is checked)."""
    recs = [
        (layer, order, h, 1000 // (h + 1), 900.0 / (h + 1)) for layer in (1, 3) for order in (2, 3, 4) for h in range(9)
    ]
    return pd.DataFrame(recs, columns=["layer", "order", "heads_shared", "ngrams", "expected_ngrams"])


def _clashes(fig: Figure) -> list[str]:
    """Legends, figure labels and the stamp that overlap a panel or each other, or leave the figure."""
    renderer = fig.canvas.get_renderer()
    boxes = [(f"axes {k}", ax.get_tightbbox(renderer)) for k, ax in enumerate(fig.axes)]
    loose = [(f"legend {k}", g.get_window_extent(renderer)) for k, g in enumerate(fig.legends)]
    loose += [(repr(t.get_text()[:20]), t.get_window_extent(renderer)) for t in fig.texts if t.get_text()]
    out = [name for name, box in loose if box.x0 < -1 or box.y0 < -1 or box.x1 > fig.bbox.x1 + 1]
    out += [f"{a} / {b}" for a, box in loose for b, other in boxes if box.overlaps(other)]
    return out + [
        f"{a} / {b}" for i, (a, box) in enumerate(loose) for b, other in loose[i + 1 :] if box.overlaps(other)
    ]


needs_cjk = pytest.mark.skipif(
    cjk_font() is None, reason="no CJK font installed (Debian fonts-noto-cjk; ./.ci/system-deps.sh installs it)"
)


# ------------------------------------------------------------------------------ style and fonts


def test_paper_rc_embeds_truetype_and_keeps_svg_text():
    rc = paper_rc("light")
    assert rc["pdf.fonttype"] == 42 and rc["ps.fonttype"] == 42
    assert rc["svg.fonttype"] == "none"
    assert rc["font.family"][0] == "DejaVu Sans"
    assert rc["image.cmap"] == "cividis"
    assert paper_rc("dark")["figure.facecolor"] == THEMES["dark"].background


@needs_cjk
def test_cjk_font_is_found_and_in_the_family_fallback():
    name = require_cjk_font()
    assert "CJK" in name or "Hei" in name or "Han" in name
    assert name in paper_rc()["font.family"]


def test_missing_cjk_font_warns_and_raises_with_the_fix(monkeypatch):
    monkeypatch.setattr(style_module, "cjk_font", lambda: None)
    monkeypatch.setattr(style_module, "_WARNED_NO_CJK", False)
    with pytest.warns(CJKFontWarning, match="fonts-noto-cjk"):
        families = style_module.font_families()
    assert families == ["DejaVu Sans"]
    with pytest.raises(CJKFontMissingError, match="fonts-noto-cjk"):
        style_module.require_cjk_font()


def test_unknown_theme_is_a_clear_error(gates):
    with pytest.raises(ValueError, match="theme 'sepia' is unknown"):
        gate_heatmap(gates, "zh-zhang", theme="sepia")


# ------------------------------------------------------------------------------- paper figures


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_every_paper_figure_builds_in_both_themes(gates, tables, theme):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a missing glyph, a bad font or a deprecation fails the test
        plots = all_paper_plots(gates, tables, theme)
    for name, drawn in plots.items():
        fig = figure_of(drawn)
        assert isinstance(fig, Figure), name
        assert fig.engram_viz_theme == theme, name
        assert np.allclose(fig.get_facecolor()[:3], _rgb(THEMES[theme].background)), name
        if isinstance(drawn, Figure):  # the token text places its own lines
            continue
        assert not _clashes(fig), (name, _clashes(fig))


def _rgb(hex_colour: str) -> tuple[float, float, float]:
    return tuple(int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5))


@needs_cjk
def test_chinese_tokens_render_with_real_glyphs(gates, caplog):
    chinese = gates[gates["prompt"].str.startswith("zh")]
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        figs = [token_text_figure(chinese), gate_heatmap(chinese, "zh-inventions").figure, token_view(chinese).figure()]
        pdf = io.BytesIO()
        for fig in figs:
            for fmt in ("png", "svg", "pdf"):
                buf = pdf if fmt == "pdf" and fig is figs[0] else io.BytesIO()
                fig.savefig(buf, format=fmt)
    messages = [str(w.message) for w in caught] + [r.getMessage() for r in caplog.records]
    assert not [m for m in messages if GLYPH_MISSING in m or "findfont" in m], messages
    assert b"CJK" in pdf.getvalue()  # the CJK font is embedded, so the glyphs are real


def test_token_text_figure_lays_out_every_token(gates):
    fig = token_text_figure(gates, ["zh-zhang", "en-alexander"], layer=3, stream=2)
    texts = [t.get_text() for t in fig.texts]
    assert "[image \u00d76]" in texts
    assert "张" in texts and "仲" in texts and " Great" in texts
    assert any("zh-zhang" in t and "layer 3" in t and "stream 2" in t for t in texts)
    assert fig.get_figwidth() == pytest.approx(6.5)


def test_token_text_figure_shows_dollar_signs_literally(gates):
    fig = token_text_figure(gates, "code")
    texts = [t for t in fig.texts if "$" in t.get_text()]
    assert texts and all(not t.get_parse_math() for t in texts)


def test_gate_heatmap_shows_an_image_span_as_one_grey_column_and_labels_tokens(gates):
    ax = gate_heatmap(gates, "en-alexander")
    image = next(a for a in ax.get_children() if isinstance(a, AxesImage))
    data = image.get_array()
    n = len(gate_table(gates, "en-alexander", 1))
    assert data.shape == (len(LAYERS) * N_STREAMS, n - IMAGE_LEN + 1)  # the span is one column
    assert data.mask[:, IMAGE_AT].all() and not data.mask[:, :IMAGE_AT].any()
    assert [t.get_text() for t in ax.get_yticklabels()][:2] == ["L1 s0", "L1 s1"]
    labels = [t.get_text() for t in ax.get_xticklabels()]
    assert labels[0] == "Alexander" and ".\u21b5" in labels  # the newline made visible
    assert labels[IMAGE_AT] == f"[image \u00d7{IMAGE_LEN}]"
    table = gate_table(gates, "en-alexander", 3)
    np.testing.assert_allclose(data[N_STREAMS + 1, :IMAGE_AT], table[1].to_numpy()[:IMAGE_AT])
    np.testing.assert_allclose(data[N_STREAMS + 1, IMAGE_AT + 1 :], table[1].to_numpy()[IMAGE_AT + IMAGE_LEN :])


def test_gate_heatmap_keeps_its_font_and_cell_size_and_wraps_long_prompts(gates):
    long = gates[gates["prompt"] == "en-alexander"].copy()
    long = pd.concat([long.assign(position=long["position"] + k * 100) for k in range(6)], ignore_index=True)
    long = long.assign(is_image=False)
    short_ax = gate_heatmap(gates, "zh-zhang")
    panels = gate_heatmap(long, "en-alexander")
    assert len(panels) > 1 and short_ax.figure.get_figwidth() < WIDTH_IN == panels[0].figure.get_figwidth()
    cells = []
    for ax in (short_ax, *panels):
        assert {t.get_fontsize() for t in ax.get_xticklabels()} == {TICK_PT}
        x0, x1 = ax.get_xlim()
        cells.append(ax.get_position().width * ax.figure.get_figwidth() / (x1 - x0))  # inches per token
    assert max(cells) / min(cells) < 1.1 and CELL_IN * 0.9 < min(cells) < CELL_IN * 1.4  # one cell size on every prompt


def test_gate_heatmap_one_layer(gates):
    ax = gate_heatmap(gates, "zh-zhang", layer=3)
    image = next(a for a in ax.get_children() if isinstance(a, AxesImage))
    assert image.get_array().shape[0] == N_STREAMS


def test_gate_distributions_draw_one_box_per_group_stream_and_layer(gates):
    axes = gate_distributions(gates, by="category")
    n_groups = gates["category"].nunique()
    boxes = sum(len([p for p in ax.patches]) for ax in axes)
    assert boxes == n_groups * N_STREAMS * len(LAYERS)
    with pytest.raises(ValueError, match="lacks column"):
        gate_distributions(gates.drop(columns="category"))
    assert len(gate_distributions(gates, by="prompt", layer=1)) == 1


def test_exposure_beside_gates_needs_exposure(gates):
    axes = exposure_beside_gates(gates, "en-alexander", layer=1)
    bars = [p.get_height() for p in axes[1].patches]
    expected = gate_table(gates, "en-alexander", 1)["exposure"].tolist()
    assert bars == expected[:IMAGE_AT] + [0] + expected[IMAGE_AT + IMAGE_LEN :]  # the image span: one empty column
    assert "r = " in axes[0].get_title(loc="left")
    with pytest.raises(ValueError, match="exposure"):
        exposure_beside_gates(gates.drop(columns="exposure"), "zh-zhang")


def test_exposure_the_same_everywhere_is_said_not_drawn(gates):
    axes = exposure_beside_gates(gates.assign(exposure=24), "en-alexander", layer=1)
    assert not axes[1].patches and "nan" not in axes[0].get_title(loc="left")
    assert any("24/24 at every text position" in t.get_text() for t in axes[1].texts)


def test_collision_and_coverage_bars_equal_the_frames(tables):
    _, coverage, collisions = tables
    (ax,) = collisions_vs_expected(collisions, layer=1)
    at = collisions[collisions["layer"] == 1].sort_values(["order", "head"])
    assert [p.get_height() for p in ax.patches] == at["shared_buckets"].tolist()
    offsets = ax.collections[0].get_offsets()
    np.testing.assert_allclose(offsets[:, 1], at["expected_shared_buckets"].to_numpy())
    once = int(at.groupby("order")["distinct_ngrams"].max().sum())  # each n-gram once, not once per head
    assert ax.get_title(loc="left").endswith(f"; {once:,} distinct n-grams")
    (ax,) = coverage_per_column(coverage, layer=3)
    at = coverage[coverage["layer"] == 3].sort_values(["order", "head"])
    np.testing.assert_allclose([p.get_height() for p in ax.patches], at["coverage"].to_numpy())


def test_accumulator_frames_are_accepted(tokenizer):
    from engram_viz.analysis.row_stats.collisions import CollisionStats
    from engram_viz.analysis.row_stats.usage import RowUsage

    usage = RowUsage("tiny")
    collisions = CollisionStats("tiny", counts=usage.counts)
    for _, text in PROMPTS.values():
        usage.add_compressed(tokenizer.compress(tokenizer.encode(text))[None])
    axes = collisions_vs_expected(collisions.columns())
    assert len(axes[0].patches) == 24
    assert len(coverage_per_column(usage.coverage())) == 2
    assert row_rank_frequency(usage.rank_frequency()).lines
    assert row_rank_frequency(usage).lines
    assert len(touched_rows_map(usage, "tiny", layer=1, bins=32)) == 1


def test_plots_draw_into_given_axes_and_return_them(gates, tables):
    usage, coverage, collisions = tables
    ax = Figure().add_subplot()
    assert gate_heatmap(gates, "zh-zhang", layer=1, ax=ax) is ax
    assert any(isinstance(a, AxesImage) for a in ax.get_children())
    pair = Figure().subplots(2, 1)
    assert collisions_vs_expected(collisions, ax=pair) is pair
    assert [len(a.patches) for a in pair] == [24, 24]
    assert coverage_per_column(coverage, layer=3, ax=ax) is ax and len(ax.patches) == 24
    one = Figure().add_subplot()
    assert row_rank_frequency(usage, layer=1, ax=one) is one and one.lines
    with pytest.raises(ValueError, match="2 matplotlib Axes"):
        gate_distributions(gates, ax=one)


def test_cjk_font_missing_is_an_engram_viz_error():
    assert issubclass(CJKFontMissingError, EngramVizError) and issubclass(CJKFontMissingError, RuntimeError)


def test_row_rank_frequency_is_sorted_hits(tables):
    usage = tables[0]
    line = row_rank_frequency(usage, layer=1).lines[0]
    want = np.sort(usage.loc[usage["layer"] == 1, "hits"].to_numpy())[::-1]
    np.testing.assert_array_equal(line.get_ydata(), want)
    np.testing.assert_array_equal(line.get_xdata(), np.arange(1, len(want) + 1))


def test_touched_rows_map_matches_a_brute_force_count(tables):
    usage = tables[0]
    bins = 40
    (ax,) = touched_rows_map(usage, "tiny", layer=3, bins=bins)
    image = next(a for a in ax.get_children() if isinstance(a, AxesImage))
    shown = image.get_array()
    assert shown.shape == (24, bins)
    layout = EngramLayout(load_config("tiny"))
    li, col = 1, 13
    lo, prime = layout.offsets[li, col], layout.column_primes[li, col]
    touched = np.zeros(prime, bool)
    rows = usage.loc[usage["layer"] == 3, "row"].to_numpy()
    touched[rows[(rows >= lo) & (rows < lo + prime)] - lo] = True
    frac = np.array([touched[np.arange(prime) * bins // prime == b].mean() for b in range(bins)])
    np.testing.assert_allclose(np.ma.filled(shown[col], 0.0), frac)


def test_touched_rows_map_on_the_v41_table_stays_binned():
    layout = EngramLayout(load_config("v41-flash"))
    last = int(layout.rows_per_layer[1]) - 1
    usage = pd.DataFrame({"layer": [14, 14, 14], "row": [0, 123_456_789, last], "hits": [1, 5, 2]})
    (ax,) = touched_rows_map(usage, layout, bins=256, weight="hits")
    image = next(a for a in ax.get_children() if isinstance(a, AxesImage))
    assert image.get_array().shape == (24, 256)
    assert image.get_array().count() == 3
    with pytest.raises(ValueError, match="out of range for layer 14"):
        touched_rows_map(usage.assign(row=[0, 1, last + 1]), layout)


@pytest.mark.parametrize("prime,bins", [(2003, 512), (16000057, 512), (7, 7), (5, 9)])
def test_bin_sizes_partition_the_column(prime, bins):
    sizes = _bin_sizes(prime, bins)
    assert sizes.sum() == prime and len(sizes) == bins
    idx = np.arange(min(prime, 100_000)) * bins // prime
    counts = np.bincount(idx, minlength=bins)
    if prime <= 100_000:
        np.testing.assert_array_equal(counts, sizes)


def test_selection_errors_name_the_input(gates):
    with pytest.raises(ValueError, match="pass prompt="):
        gate_heatmap(gates)
    with pytest.raises(ValueError, match="layer.*7"):
        gate_heatmap(gates, "zh-zhang", layer=7)
    with pytest.raises(ValueError, match="'nope' is not in the gates frame"):
        gate_heatmap(gates, "nope")
    with pytest.raises(ValueError, match="lacks column"):
        gate_heatmap(gates.drop(columns="token"), "zh-zhang")
    with pytest.raises(TypeError, match="DataFrame"):
        gate_heatmap(gates.to_dict(), "zh-zhang")
    with pytest.raises(ValueError, match="stream 9"):
        token_text_figure(gates, "zh-zhang", stream=9)
    with pytest.raises(ValueError, match="repeats"):
        gate_heatmap(pd.concat([gates, gates.head(1)]), "zh-inventions")


# ---------------------------------------------------------------------------- token text, HTML


def test_token_cells_collapse_image_spans_and_carry_tooltips(gates, rows):
    cells = token_cells(gates, "en-alexander", 1, "mean", rows=None)
    images = [c for c in cells if c.is_image]
    assert len(images) == 1 and images[0].text == "[image \u00d76]"
    assert len(cells) == len(gate_table(gates, "en-alexander", 1)) - IMAGE_LEN + 1
    breaks = [c.text for c in cells if c.line_break]
    assert breaks == [".\u21b5"]
    table = gate_table(gates, "en-alexander", 1)
    text = table[~table["is_image"]]
    np.testing.assert_allclose([c.value for c in cells if not c.is_image], reduce_streams(text, "mean"))
    first = cells[0].tooltip
    assert "'Alexander'" in first and "position 0" in first and "s3 " in first and "/24 rows shared" in first
    with_rows = token_cells(gates, "zh-zhang", 3, 0, rows=rows)
    assert "2-gram rows" in with_rows[0].tooltip and "4-gram rows" in with_rows[0].tooltip
    ids = rows[(rows["prompt"] == "zh-zhang") & (rows["layer"] == 3) & (rows["position"] == 0)]["row"]
    assert all(str(r) in with_rows[0].tooltip for r in ids)


class _TagBalance(HTMLParser):
    VOID = frozenset({"meta", "br", "img", "link", "input", "hr"})

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.titles, self.tags, self.text = [], [], [], set(), []

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        self.titles += [v for k, v in attrs if k == "title"]
        if tag not in self.VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag):
        if not self.stack or self.stack.pop() != tag:
            self.errors.append(tag)

    def handle_data(self, data):
        self.text.append(data)


def _parse(document: str) -> _TagBalance:
    parser = _TagBalance()
    parser.feed(document)
    parser.close()
    return parser


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_token_html_is_self_contained_and_escaped(gates, rows, theme):
    page = token_html(gates, layer=1, rows=rows, theme=theme, title="Gates <of> Engram")
    parsed = _parse(page)
    assert not parsed.errors and not parsed.stack
    assert parsed.tags <= {"html", "head", "meta", "title", "style", "body", "div", "section", "span", "br", "h2"}
    assert "<script" not in page and "src=" not in page and "href=" not in page and "url(" not in page
    assert page.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in page
    text = "".join(parsed.text)
    assert "四大" in text and "仲" in text and "Alexander" in text
    assert "('<" in text and " &" in text and " $" in text  # code tokens are shown, not parsed as markup
    assert "Gates &lt;of&gt; Engram" in page
    assert THEMES[theme].background in page
    n_text_tokens = int((~gates.query("layer == 1 and stream == 0")["is_image"]).sum())
    assert len(parsed.titles) == n_text_tokens + 1  # plus one chip for the image span
    assert any("2-gram rows" in t for t in parsed.titles)


def test_token_html_fragment_for_notebooks(gates):
    fragment = token_html(gates, "zh-zhang", full_page=False)
    assert not fragment.startswith("<!DOCTYPE") and "<html" not in fragment
    assert not _parse(fragment).errors


def test_token_view_shows_html_and_a_png_fallback(gates):
    view = token_view(gates, ["zh-inventions", "en-alexander"], theme="dark")
    assert isinstance(view, TokenView)
    bundle = view._repr_mimebundle_()
    assert bundle["image/png"].startswith(b"\x89PNG\r\n\x1a\n")
    assert "四大" in bundle["text/html"] and "<html" not in bundle["text/html"]
    assert "2 prompt(s)" in bundle["text/plain"]
    with pytest.raises(ValueError, match="not in the gates frame"):
        token_view(gates, "missing")


# ------------------------------------------------------------------------------------- plotly


def test_interactive_heatmap_hover_has_token_position_stream_gate_rows_exposure(gates, rows):
    fig = gate_heatmap_interactive(gates, "en-alexander", rows=rows, theme="dark")
    _, heat = fig.data
    template = heat.hovertemplate
    for key in ("token", "customdata[3]", "%{y}", "gate", "collision exposure", "customdata[2]"):
        assert key in template
    assert list(heat.y[:2]) == ["L1 s0", "L1 s1"] and len(heat.y) == len(LAYERS) * N_STREAMS
    z = np.array(heat.z, dtype=object)
    assert (
        all(v is None for v in z[:, IMAGE_AT])
        and z.shape[1] == len(gate_table(gates, "en-alexander", 1)) - IMAGE_LEN + 1
    )
    custom_image = np.asarray(heat.customdata, dtype=object)[0, IMAGE_AT]
    assert custom_image[0] == f"[image \u00d7{IMAGE_LEN}]" and custom_image[3].startswith("positions ")
    custom = np.asarray(heat.customdata, dtype=object)
    table = gate_table(gates, "en-alexander", 1)
    assert custom[0, 0, 0] == "Alexander"
    assert custom[0, 0, 1] == f"{int(table['exposure'].iat[0])}/24"
    ids = rows[(rows["prompt"] == "en-alexander") & (rows["layer"] == 1) & (rows["position"] == 0)]["row"]
    assert all(str(r) in custom[0, 0, 2] for r in ids)
    annotations = [a.text for a in fig.layout.annotations]
    assert len(annotations) == len(table) - IMAGE_LEN + 1 and "Alexander" in annotations  # a span: one label
    assert custom[0, 0, 3] == "position 0"
    assert fig.layout.paper_bgcolor == THEMES["dark"].background


def test_interactive_heatmap_escapes_token_markup(gates):
    fig = gate_heatmap_interactive(gates, "code", layer=3)
    texts = [a.text for a in fig.layout.annotations]
    assert " &lt;" in texts and "(&#x27;&lt;" not in texts and "('&lt;" in texts
    assert not any("<" in t for t in texts if not t.startswith("<i>"))  # an image span's label is in italics
    assert len(fig.data[1].y) == N_STREAMS
