"""engram_viz.viz.export: valid, non-empty files in every format; atomic writes; offline HTML."""

from __future__ import annotations

import io
import os
import re
import struct
import warnings
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from matplotlib.artist import Artist

from engram_viz._files import atomic_writer
from engram_viz.errors import EngramVizError
from engram_viz.viz import (
    THEMES,
    cjk_font,
    export,
    gate_heatmap,
    gate_heatmap_interactive,
    token_text_figure,
    token_view,
)
from engram_viz.viz.export import (
    BrowserNotFoundError,
    check_offline_html,
    chromium_path,
    export_all,
    plotly_html,
    save_figure,
    save_html,
)

TEXTS = {"zh": "四大发明是造纸术、指南针。张仲景是东汉末年的医学家。", "en": "Alexander the Great, 356 BC."}
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
SVG_NS = "{http://www.w3.org/2000/svg}"

needs_chromium = pytest.mark.skipif(
    chromium_path() is None,
    reason="no Chrome/Chromium for kaleido (Debian chromium; ./.ci/system-deps.sh installs it, or set BROWSER_PATH)",
)
needs_cjk = pytest.mark.skipif(
    cjk_font() is None, reason="no CJK font installed (Debian fonts-noto-cjk; ./.ci/system-deps.sh installs it)"
)


@pytest.fixture(scope="module")
def gates(tokenizer) -> pd.DataFrame:
    """gates: prompt, position, token, is_image, layer, stream, gate, exposure - real token pieces."""
    rng = np.random.default_rng(7)
    recs = []
    for pid, text in TEXTS.items():
        for pos, piece in enumerate(tokenizer.pieces(tokenizer.encode(text))):
            for layer in (1, 14):
                exposure = int(rng.integers(0, 25))
                for stream in range(4):
                    recs.append((pid, pos, piece, False, layer, stream, float(rng.uniform()), exposure))
    return pd.DataFrame(
        recs, columns=["prompt", "position", "token", "is_image", "layer", "stream", "gate", "exposure"]
    )


# ------------------------------------------------------------------------------------ checkers


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) from the IHDR chunk of a PNG."""
    assert data[:8] == PNG_SIGNATURE, "not a PNG"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def pdf_pages(data: bytes) -> int:
    assert data.startswith(b"%PDF-"), "not a PDF"
    assert data.rstrip().endswith(b"%%EOF")
    return len(re.findall(rb"/Type\s*/Page(?![a-zA-Z])", data))


def svg_root(data: bytes) -> ET.Element:
    root = ET.fromstring(data)
    assert root.tag == f"{SVG_NS}svg"
    return root


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(".") or p.suffix == ".tmp")


# ---------------------------------------------------------------------------------- matplotlib


@pytest.mark.parametrize("theme", ["light", "dark"])
def test_matplotlib_figure_exports_valid_pdf_svg_png(gates, tmp_path, theme):
    ax = gate_heatmap(gates, "zh", layer=1, theme=theme)
    paths = export_all(ax, tmp_path / "heatmap", dpi=100)  # an Axes exports its figure
    assert [p.name for p in paths] == ["heatmap.pdf", "heatmap.svg", "heatmap.png"]
    pdf, svg, png = (p.read_bytes() for p in paths)
    assert pdf_pages(pdf) == 1
    assert b"/FontFile2" in pdf and b"/Subtype /Type3" not in pdf  # TrueType embedded (fonttype 42)
    root = svg_root(svg)
    texts = "".join("".join(t.itertext()) for t in root.iter(f"{SVG_NS}text"))
    assert "四大" in texts  # svg.fonttype 'none': tokens stay text
    w, h = ax.figure.get_size_inches()
    assert png_size(png) == (int(w * 100), int(h * 100))
    assert leftovers(tmp_path) == []
    from PIL import Image

    corner = Image.open(io.BytesIO(png)).convert("RGB").getpixel((1, 1))
    want = tuple(int(THEMES[theme].background[i : i + 2], 16) for i in (1, 3, 5))
    assert corner == want


@needs_cjk
def test_exported_chinese_tokens_have_real_glyphs(gates, tmp_path):
    fig = token_text_figure(gates, ["zh", "en"])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        paths = export_all(fig, tmp_path / "tokens", dpi=120)
    assert not [str(w.message) for w in caught if "missing from font" in str(w.message)]
    pdf = paths[0].read_bytes()
    assert re.search(rb"/FontName /[A-Z]{6}\+NotoSans\w*CJK", pdf) or b"CJK" in pdf
    w, h = fig.get_size_inches()
    assert png_size(paths[2].read_bytes()) == (int(w * 120), int(h * 120))


def test_exports_are_reproducible(gates, tmp_path):
    fig = gate_heatmap(gates, "en", layer=14).figure
    first = export_all(fig, tmp_path / "a", ["pdf", "svg"])
    second = export_all(fig, tmp_path / "b", ["pdf", "svg"])
    for x, y in zip(first, second):
        assert x.read_bytes() == y.read_bytes(), x.name


def test_exported_files_get_normal_permissions(gates, tmp_path):
    path = save_figure(gate_heatmap(gates, "en", layer=1), tmp_path / "perm.png", dpi=50)
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask


# ---------------------------------------------------------------------------------- token view


def test_token_view_exports_html_png_pdf_svg(gates, tmp_path):
    view = token_view(gates, theme="dark", title="四大发明")
    paths = export_all(view, tmp_path / "view")
    assert [p.suffix for p in paths] == [".html", ".png", ".pdf", ".svg"]
    page = paths[0].read_text("utf-8")
    assert page.startswith("<!DOCTYPE html>") and "四大" in page and "<script" not in page
    png_size(paths[1].read_bytes())
    assert pdf_pages(paths[2].read_bytes()) == 1
    svg_root(paths[3].read_bytes())


# -------------------------------------------------------------------------------------- plotly


def test_plotly_html_inlines_plotlyjs_and_loads_nothing_remote(gates, tmp_path):
    fig = gate_heatmap_interactive(gates, "zh")
    (path,) = export_all(fig, tmp_path / "interactive", ["html"])
    page = path.read_text("utf-8")
    assert not re.search(r"""<script[^>]+src=["']?(https?:)?//""", page)
    assert '<script src="http' not in page and "cdn.plot.ly" not in page.split("</script>")[-1]
    assert len(page) > 1_000_000  # plotly.js itself is in the page
    assert "Plotly.newPlot" in page and "\\u56db\\u5927" in page  # the token 四大, JSON-escaped
    check_offline_html(page)


@needs_chromium
def test_plotly_static_png_svg_pdf_via_kaleido(gates, tmp_path):
    fig = gate_heatmap_interactive(gates, "zh", theme="dark")
    paths = export_all(fig, tmp_path / "static", ["png", "svg", "pdf"], width=640, height=420, scale=2)
    png, svg, pdf = (p.read_bytes() for p in paths)
    assert png_size(png) == (1280, 840)
    svg_root(svg)
    assert pdf_pages(pdf) >= 1
    assert leftovers(tmp_path) == []


def test_plotly_static_export_without_a_browser_is_a_clear_error(gates, tmp_path, monkeypatch):
    monkeypatch.setattr(export, "chromium_path", lambda: None)
    fig = gate_heatmap_interactive(gates, "en")
    with pytest.raises(BrowserNotFoundError, match="chromium.*BROWSER_PATH"):
        save_figure(fig, tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []


# ----------------------------------------------------------------------------- atomic writes


class _Boom(Artist):
    """An artist whose drawing fails, after the PDF/SVG writer has already written its header."""

    def draw(self, renderer):
        raise RuntimeError("boom while drawing")


@pytest.mark.parametrize("fmt", ["pdf", "svg", "png"])
def test_interrupted_matplotlib_export_leaves_no_partial_file(gates, tmp_path, fmt):
    target = tmp_path / f"fig.{fmt}"
    target.write_bytes(b"previous good file")
    fig = gate_heatmap(gates, "en", layer=1).figure
    fig.add_artist(_Boom())
    with pytest.raises(RuntimeError, match="boom"):
        save_figure(fig, target)
    assert target.read_bytes() == b"previous good file"
    with pytest.raises(RuntimeError, match="boom"):
        save_figure(fig, tmp_path / f"new.{fmt}")
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"fig.{fmt}"]


def test_atomic_writer_removes_the_temp_file_on_keyboard_interrupt(tmp_path):
    target = tmp_path / "sub" / "data.bin"
    with pytest.raises(KeyboardInterrupt), atomic_writer(target) as fh:
        fh.write(b"half of it")
        assert list(target.parent.iterdir())  # the temp file lives next to the target
        raise KeyboardInterrupt
    assert list(target.parent.iterdir()) == []
    with atomic_writer(target) as fh:
        fh.write(b"all of it")
    assert target.read_bytes() == b"all of it"


def test_failed_kaleido_render_writes_nothing(gates, tmp_path, monkeypatch):
    def fail(*args, **kwargs):
        raise export.ExportError("renderer died")

    monkeypatch.setattr(export, "render_plotly", fail)
    fig = gate_heatmap_interactive(gates, "en")
    with pytest.raises(export.ExportError, match="renderer died"):
        export_all(fig, tmp_path / "f", ["html", "png"])
    assert list(tmp_path.iterdir()) == []


def test_export_errors_are_engram_viz_errors():
    for cls in (export.ExportError, BrowserNotFoundError):
        assert issubclass(cls, EngramVizError) and issubclass(cls, RuntimeError)


def test_html_that_loads_from_the_network_is_refused(tmp_path):
    for bad in ('<script src="https://cdn.plot.ly/plotly.js"></script>', "<link href='//fonts.example/x.css'>"):
        with pytest.raises(ValueError, match="network"):
            save_html(f"<html><body>{bad}</body></html>", tmp_path / "bad.html")
    assert list(tmp_path.iterdir()) == []
    save_html("<html><body><script>var ok = 'http://example.org';</script></body></html>", tmp_path / "ok.html")


# --------------------------------------------------------------------------------- dispatching


def test_formats_are_checked_before_anything_is_written(gates, tmp_path):
    ax = gate_heatmap(gates, "en", layer=1)
    with pytest.raises(ValueError, match="not \\['html'\\]"):
        export_all(ax, tmp_path / "f", ["png", "html"])
    with pytest.raises(ValueError, match="repeat"):
        export_all(ax, tmp_path / "f", ["png", "png"])
    with pytest.raises(ValueError, match="suffix"):
        save_figure(ax, tmp_path / "nosuffix")
    with pytest.raises(TypeError, match="cannot export"):
        save_figure(object(), tmp_path / "f.png")
    assert list(tmp_path.iterdir()) == []


def test_stem_with_a_format_suffix_and_html_strings(gates, tmp_path):
    ax = gate_heatmap(gates, "en", layer=1)
    (path,) = export_all(ax, tmp_path / "plots" / "fig.png", ["png"], dpi=40)
    assert path == tmp_path / "plots" / "fig.png"
    (page,) = export_all("<!DOCTYPE html><html><body>hi</body></html>", tmp_path / "page")
    assert page.read_text().endswith("</html>")


def test_plotly_html_helper_is_offline(gates):
    page = plotly_html(gate_heatmap_interactive(gates, "en", layer=1))
    check_offline_html(page)
    assert "mathjax.js" not in page.lower() and "<script src" not in page
    assert page == plotly_html(gate_heatmap_interactive(gates, "en", layer=1))  # stable div id: clean diffs


LONG_LABEL = "a model of a long name " * 8 + "(trained here)"  # wraps on a narrow figure


def test_stamp_stays_inside_the_figure_clear_of_every_axes(gates):
    from engram_viz.viz.stamps import stamp, stamp_text

    for ax in (gate_heatmap(gates, "zh", layer=1), gate_heatmap(gates, "en")):
        fig = stamp(ax, LONG_LABEL).figure
        text = stamp_text(fig)
        renderer = fig.canvas.get_renderer()
        box = text.get_window_extent(renderer)
        assert 0 <= box.x0 and box.x1 <= fig.bbox.x1 and 0 <= box.y0 and box.y1 <= fig.bbox.y1
        for other in fig.axes:
            assert not box.overlaps(other.get_tightbbox(renderer)), "the stamp overlaps a panel or its labels"
        assert text.get_text().replace("\n", " ").replace("\u2026", "") in LONG_LABEL or "\u2026" in text.get_text()


def test_stamp_false_leaves_the_stamp_off_and_keeps_provenance_in_metadata(gates, tmp_path):
    from engram_viz.viz.stamps import stamp

    ax = stamp(gate_heatmap(gates, "en"), "tiny model X")
    with_stamp, without = tmp_path / "a.svg", tmp_path / "b.svg"
    save_figure(ax, with_stamp)
    save_figure(ax, without, stamp=False)
    shown = [t.text or "" for t in svg_root(with_stamp.read_bytes()).iter(f"{SVG_NS}text")]
    assert any("tiny model X" in s for s in shown)
    root = svg_root(without.read_bytes())
    assert not any("tiny model X" in (t.text or "") for t in root.iter(f"{SVG_NS}text"))
    assert "tiny model X" in without.read_text()  # the metadata's dc:description
    pdf = save_figure(ax, tmp_path / "c.pdf", stamp=False).read_bytes()
    assert b"/Subject (tiny model X)" in pdf
    assert ax.figure.texts[-1].get_visible()  # the figure itself keeps its stamp
