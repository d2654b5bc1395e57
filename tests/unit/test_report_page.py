"""The report page renders any declared list of sections from templates; the one table and warning."""

from __future__ import annotations

import base64
import html
import re

import numpy as np
import pandas as pd
import pytest

from engram_viz.viz.html_templates import synthetic_warning, table_html
from engram_viz.viz.report_page import Figure, Html, Section, Table, render_html
from engram_viz.viz.style import THEMES

PROV = {
    "model": "tiny LM 'x' <b>",
    "streams": "the model's own streams",
    "streams_mode": "embedding",
    "synthetic": True,
    "config": "tiny",
    "dim": 64,
    "hc_mult": 4,
    "layers": [1, 3],
    "prompts_file": "p.jsonl",
    "prompt_set": "custom",
    "n_prompts": 2,
    "n_tokens": 10,
    "n_image_positions": 0,
    "prompts_sha256": "0" * 64,
    "device": "cpu",
    "wkv_mode": "fp8",
    "engram_viz": "0",
    "torch": "2",
    "python": "3.11",
    "created": "today",
    "missing_glyphs": ["\u0924"],
}


def test_table_html_formats_escapes_and_says_what_was_left_out():
    df = pd.DataFrame({"name": ["<b>a</b>", "c"], "x": [0.123456, np.nan], "n": [1, 2]})
    out = table_html(df)
    assert "<td>&lt;b&gt;a&lt;/b&gt;</td><td>0.1235</td><td>1</td>" in out and "<td>NaN</td>" in out
    assert "<th>name</th><th>x</th><th>n</th>" in out and "first" not in out
    assert "first 1 of 2 rows; all in the tables folder" in table_html(df, max_rows=1)


def test_synthetic_warning_takes_the_theme_colours():
    light, dark = synthetic_warning("light"), synthetic_warning("dark")
    assert "Synthetic weights." in light and THEMES["light"].warn_background in light
    assert THEMES["dark"].warn_background in dark and THEMES["light"].warn_background not in dark
    line = synthetic_warning("light", boxed=False)
    assert THEMES["light"].warn_text in line and 'class="warn"' not in line


def test_sections_render_in_order_and_empty_ones_are_left_out(tmp_path):
    png = tmp_path / "figures" / "f.png"
    png.parent.mkdir()
    png.write_bytes(b"\x89PNG fake")
    (tmp_path / "figures" / "f.svg").write_text("<svg/>")
    fig = Figure("f", (png, tmp_path / "figures" / "f.svg"), "A 'title'", "Its caption.")
    sections = [
        Section("first", "First", "An intro.", (Table(pd.DataFrame({"a": [1]}), "A table", note="a: one"), fig)),
        Section("empty", "Never shown"),
        Section("second", "Second", "", (Html('<span class="ev-tok">t</span>', "Layer 1"),)),
    ]
    page = render_html(PROV, sections, tmp_path)
    ids = [page.index(f'<section id="{s}">') for s in ("provenance", "first", "second", "files")]
    assert ids == sorted(ids) and "Never shown" not in page and '<section id="empty">' not in page
    assert '<h3 id="first-0">A table<a class="anchor" href="#first-0">#</a></h3>' in page
    assert '<h3 id="second-0">Layer 1' in page and '<span class="ev-tok">t</span>' in page
    assert '<p class="note">a: one</p>' in page and '<figure id="fig-f">' in page
    toc = page[page.index('<nav class="toc"') : page.index("</nav>")]
    for anchor in ("provenance", "first", "first-0", "fig-f", "second", "second-0", "files"):
        assert f'href="#{anchor}"' in toc and (f'id="{anchor}"' in page)
    assert "Never shown" not in toc and not re.search(r"<h[1-3][^>]*>\s*(<a [^>]*>#</a>)?\s*</h[1-3]>", page)
    assert "data:image/png;base64," + base64.b64encode(b"\x89PNG fake").decode() in page
    assert '<a href="figures/f.png">PNG</a> <a href="figures/f.svg">SVG</a>' in page
    assert html.escape(PROV["model"]) in page and html.escape(PROV["streams"]) in page  # html.escape's entities
    assert "Synthetic weights." in page and "Proxy streams." in page and "Missing glyphs." in page
    assert "<li>figures/f.png</li>" in page and "<script" not in page
    assert THEMES["dark"].background in render_html(PROV, sections, tmp_path, theme="dark")


def test_a_part_of_unknown_kind_is_refused(tmp_path):
    with pytest.raises(TypeError, match="Figure, Table or Html"):
        render_html(PROV, [Section("s", "S", "", ("figure name",))], tmp_path)
