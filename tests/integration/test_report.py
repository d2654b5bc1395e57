"""report: the main job writes an offline HTML report, tidy tables and figures, stating its provenance."""

from __future__ import annotations

import html
import json
import re
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from engram_viz._files import TABLE_FORMATS
from engram_viz.apps.report_job import _missing_glyphs
from engram_viz.cli import main
from engram_viz.config import load_config
from engram_viz.run.prompts import load_prompts
from engram_viz.run.trace import Trace

REMOTE = re.compile(r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\(\s*["']?\s*(?:https?:)?//""", re.IGNORECASE)


@pytest.fixture(scope="module")
def report_dir(tmp_path_factory) -> Path:
    """``engram-viz report --out DIR`` on the default prompt set and weights, as the README runs it."""
    out = tmp_path_factory.mktemp("report") / "out"
    cmd = [sys.executable, "-m", "engram_viz.cli", "report", "--out", str(out), "--device", "cpu"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "report:" in proc.stdout and "engram-viz report: running" in proc.stderr
    return out


def test_html_is_self_contained_and_states_provenance(report_dir):
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    manifest = json.loads((report_dir / "manifest.json").read_text())
    prov = manifest["provenance"]
    assert "<script" not in page.lower()
    assert not REMOTE.search(page), REMOTE.search(page)
    assert html.escape(prov["model"]) in page and html.escape(prov["streams"]) in page
    if prov["synthetic"]:
        assert "Synthetic weights." in page
    # every figure is embedded as a data URI; its files are linked relatively
    assert page.count("data:image/png;base64,") == len(manifest["figures"])
    for name in manifest["figures"]:
        assert f'href="figures/{name}.svg"' in page
    # token-coloured text of every prompt, for every layer, with tooltips
    prompts = load_prompts()
    for p in prompts:
        assert html.escape(p.id) in page
    assert page.count('class="ev-tok"') > 1000
    assert prov["n_prompts"] == len(prompts) and prov["n_image_positions"] > 0


def test_tables(report_dir):
    manifest = json.loads((report_dir / "manifest.json").read_text())
    expected = {"gates", "rows", "tokens", "gate_summary", "usage_columns", "rank_frequency", "hot_rows"}
    expected |= {"collision_columns", "heads_shared", "collision_examples"}
    assert expected <= set(manifest["tables"])
    for name in expected:
        for fmt in TABLE_FORMATS:
            assert (report_dir / "tables" / f"{name}.{fmt}").is_file(), (name, fmt)
    gates = pd.read_parquet(report_dir / "tables" / "gates.parquet")
    assert list(gates.columns[:3]) == ["prompt", "category", "position"]
    assert {"token", "is_image", "layer", "stream", "gate", "exposure"} <= set(gates.columns)
    assert (gates.loc[gates.is_image, "gate"] == 0).all() and gates.is_image.any()
    assert set(gates.category) == {p.category for p in load_prompts()}
    csv = pd.read_csv(report_dir / "tables" / "gates.csv")
    assert len(csv) == len(gates)
    rows = pd.read_parquet(report_dir / "tables" / "rows.parquet")
    assert {"prompt", "position", "layer", "order", "head", "row"} <= set(rows.columns)
    # the saved Trace agrees with the tables
    trace = Trace.load(report_dir / "trace")
    pd.testing.assert_frame_equal(trace.to_frame("gates").reset_index(drop=True), gates)


def test_figures(report_dir):
    manifest = json.loads((report_dir / "manifest.json").read_text())
    assert {"gate_distributions", "collisions_vs_expected", "coverage", "rank_frequency"} <= set(manifest["figures"])
    assert any(n.startswith("gates_") for n in manifest["figures"])
    assert any(n.startswith("tokens_L") for n in manifest["figures"])
    for name in manifest["figures"]:
        png = (report_dir / "figures" / f"{name}.png").read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
        svg = report_dir / "figures" / f"{name}.svg"
        assert ET.parse(svg).getroot().tag.endswith("svg")
        assert "<script" not in svg.read_text(encoding="utf-8").lower()
    assert not [p for p in report_dir.rglob("*") if p.name.endswith(".tmp")]


def test_custom_prompts_and_errors(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "\n".join(
            json.dumps(x, ensure_ascii=False)
            for x in [
                {"id": "a", "category": "mine", "text": "The Great Wall of China."},
                {"id": "b", "category": "mine", "text": "四大发明 <image:2x2> 造纸术"},
            ]
        ),
        encoding="utf-8",
    )
    out = tmp_path / "r"
    assert main(["report", "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    assert "2 prompts" in capsys.readouterr().out
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "<script" not in page.lower()
    assert "造纸" in page  # Chinese tokens are shown as text
    trace = Trace.load(out / "trace")
    assert trace.prompt_ids == ["a", "b"] and trace.categories == ["mine", "mine"]

    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    out2 = tmp_path / "r2"
    assert main(["report", "--prompts", str(bad), "--out", str(out2), "--quiet"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert not (out2 / "report.html").exists()
    assert main(["report", "--checkpoint", str(tmp_path / "nope"), "--out", str(out2), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_missing_glyphs_are_named_once_and_other_warnings_pass_through():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            warnings.warn("Glyph 2340 (\\N{DEVANAGARI LETTER TA}) missing from font(s) DejaVu Sans.", UserWarning)
        warnings.warn("something else", UserWarning)
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        names = _missing_glyphs(caught)
    assert names == ["\\N{DEVANAGARI LETTER TA}"]
    assert [str(w.message) for w in again] == ["something else"]


def test_gate_versus_memory_section_comes_first_on_the_tiny_default(report_dir):
    """The default weights are the tiny LM: the report picks the ``default`` prompt set, says so,
    and its first figure after the provenance is gate versus memory, with its tables."""
    manifest = json.loads((report_dir / "manifest.json").read_text())
    assert manifest["provenance"]["prompt_set"] == "default"
    assert {"gate_memory", "gate_count_curve", "loss_by_category", "memory_targets"} <= set(manifest["tables"])
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    assert "default set: " in page
    first = page.index('href="figures/gate_vs_memory.svg"')
    assert first < page.index('href="figures/gate_distributions.svg"')
    summary = pd.read_parquet(report_dir / "tables" / "gate_memory.parquet")
    assert set(summary["group"]) == {"often", "seldom", "never", "random"}
    assert (summary["n"] > 0).all() and summary["mean_gate"].between(0, 1).all()
    # per n-gram order: the trigram's rows are memory_targets itself, the other orders differ
    by_order = pd.read_parquet(report_dir / "tables" / "memory_targets_by_order.parquet")
    targets = pd.read_parquet(report_dir / "tables" / "memory_targets.parquet")
    assert sorted(set(by_order["order"])) == [2, 3, 4]
    trigram = by_order[by_order["order"] == 3].drop(columns="order").reset_index(drop=True)
    pd.testing.assert_frame_equal(trigram, targets)
    assert not np.allclose(by_order[by_order["order"] == 2]["spearman"], targets["spearman"])


SMALL_SETS = {  # prompt sets that lack a category, a comparison group or trigrams of text
    "one_chinese_sentence": ([{"id": "zh", "category": "chinese", "text": "你好"}], "no text position"),
    "one_image_prompt": ([{"id": "img", "category": "image", "text": "<image:16x12>"}], "no text position"),
    "one_category": (
        [
            {"id": "a", "category": "mine", "text": "The Great Wall of China."},
            {"id": "b", "category": "mine", "text": "Confucius said the gentleman is not a vessel."},
        ],
        "memory group(s)",
    ),
}


@pytest.mark.parametrize("name", sorted(SMALL_SETS))
def test_report_on_small_prompt_sets_says_what_is_missing(name, tmp_path, capsys):
    rows, said = SMALL_SETS[name]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    out = tmp_path / "r"
    assert main(["report", "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    page = html.unescape((out / "report.html").read_text(encoding="utf-8"))
    notes = re.findall(r'<p class="missing"><em>(.*?)</em>', page, re.DOTALL)
    assert any(said in n.lower() for n in notes), notes
    assert any("one prompt category only" in n.lower() for n in notes), notes


def test_prompt_ids_with_separators_write_nothing_outside_out(tmp_path, capsys):
    """Figures named from prompt ids (``gates_<id>``, ``exposure_<id>``) go through safe_name: a
    ``..`` or ``/`` in an id writes nothing outside --out, and ids equal after sanitising stay apart."""
    ids = ["../../../../escaped", "a/b", "a_b", "..", "/abs"]  # the first lands beside --out today
    cats = ["c1", "c2", "c3", "c4", "c5"]  # each the first of its category: all drawn as heatmaps
    prompts = tmp_path / "work" / "p.jsonl"
    prompts.parent.mkdir()
    prompts.write_text(
        "\n".join(json.dumps({"id": i, "category": c, "text": f"The Great Wall {c}."}) for i, c in zip(ids, cats)),
        encoding="utf-8",
    )
    out = tmp_path / "work" / "deep" / "r"
    before = {p for p in tmp_path.rglob("*")}
    assert main(["report", "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    capsys.readouterr()
    outside = {p for p in tmp_path.rglob("*") if out not in p.parents and p != out} - before
    assert outside == {out.parent}, sorted(map(str, outside))  # only the parent --out was made in
    figures = out / "figures"
    assert all(p.parent == figures for p in figures.rglob("*"))
    manifest = json.loads((out / "manifest.json").read_text())
    heatmaps = [k for k in manifest["figures"] if k.startswith("gates_")]
    assert len(heatmaps) == len(ids) and len({k.casefold() for k in heatmaps}) == len(ids)
    assert "gates_a_b" in heatmaps
    for files in manifest["figures"].values():
        for f in files:
            assert (out / f).resolve().parent == figures.resolve()
    assert Trace.load(out / "trace").prompt_ids == ids


def test_distinct_ngrams_of_the_report_equal_an_independent_count(report_dir):
    from _brute import ref_counts

    trace = Trace.load(report_dir / "trace")
    assert json.loads((report_dir / "manifest.json").read_text())["provenance"]["config"] == "tiny-engram"
    config = load_config(Path(__file__).resolve().parents[2] / "data" / "tiny-engram")  # the embedded default
    lengths = trace.lengths.tolist()
    seqs = [trace.compressed_ids[b, :n].tolist() for b, n in enumerate(lengths)]
    masks = [(~trace.is_image[b, :n]).tolist() for b, n in enumerate(lengths)]
    distinct = len(ref_counts(config, seqs, masks))  # (order, n-gram) keys at text positions, by hand
    totals = pd.read_parquet(report_dir / "tables" / "layer_totals.parquet")
    assert totals["distinct_ngrams"].tolist() == [distinct] * len(config.engram_layer_ids)
    per_column = pd.read_parquet(report_dir / "tables" / "usage_columns.parquet")
    assert per_column.groupby("layer")["distinct_ngrams"].sum().tolist() == [8 * distinct] * len(totals)
    page = (report_dir / "report.html").read_text(encoding="utf-8")
    assert f"<td>{distinct:,}</td>" in page or f"<td>{distinct}</td>" in page


@pytest.fixture(scope="module")
def report_page(report_dir):
    """The report opened in Debian's Chromium (Playwright), with its screenshot in out/test-artifacts."""
    from browser_helpers import ARTIFACTS, chromium_path, launch

    executable = chromium_path()
    if executable is None:
        pytest.skip("Debian's chromium is not installed (/usr/bin/chromium); .ci/system-deps.sh installs it")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p, executable)
        page = browser.new_page(viewport={"width": 1200, "height": 900})
        page.goto((report_dir / "report.html").as_uri())
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "report-top.png"))
        yield page
        browser.close()


# text of every <text> of an SVG figure that pokes out of the figure (a clipped stamp, label or legend)
_OUTSIDE = """() => { const svg = document.documentElement, box = svg.getBoundingClientRect();
  return [...svg.querySelectorAll('text')].map(t => [t.textContent, t.getBoundingClientRect()])
    .filter(([s, r]) => s.trim() && (r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1
      || r.bottom > box.bottom + 1)).map(([s]) => s); }"""


def test_report_in_chromium_token_chips_headings_contents_and_figures(report_dir, report_page):
    chips = report_page.eval_on_selector_all(".ev-tok", "els => els.map(e => e.textContent)")
    assert len(chips) > 1000 and not [c for c in chips if "\ufffd" in c]
    assert "BOS" in chips and not [c for c in chips if "begin\u2581of" in c]
    headings = report_page.eval_on_selector_all("h1, h2, h3", "els => els.map(e => e.textContent.replace('#', ''))")
    assert all(h.strip() for h in headings)
    targets = report_page.eval_on_selector_all("nav.toc a", "els => els.map(e => e.getAttribute('href'))")
    assert len(targets) > 20 and all(report_page.locator(t).count() == 1 for t in targets)
    figure_page = report_page.context.browser.new_page()
    for svg in sorted((report_dir / "figures").glob("*.svg")):
        figure_page.goto(svg.as_uri())
        assert figure_page.evaluate(_OUTSIDE) == [], svg.name
    figure_page.close()


def test_report_paths_are_relative_to_its_folder(report_dir):
    for name in ("report.html", "manifest.json"):
        text = (report_dir / name).read_text(encoding="utf-8")
        assert str(report_dir) not in text and str(Path.cwd()) not in text and str(Path.home()) not in text, name
    manifest = json.loads((report_dir / "manifest.json").read_text())
    assert (report_dir / manifest["provenance"]["prompts_file"]).is_file()
    assert {Path(p).suffix for p in manifest["figures"]["coverage"]} == {".png", ".svg", ".pdf"}
