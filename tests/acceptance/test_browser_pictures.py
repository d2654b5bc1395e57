"""A picture uploaded into the ``engram-viz app`` page in Chromium (Playwright): on a checkpoint with
a vision tower (synthetic, small widths) and ``--streams block0``, prompt A holds the placeholder twin
``<image:84x56px>``, the picture goes into prompt B with the page's file chooser, and the view shows
its span and the gates after it changed against the twin; bad files (not an image, truncated, empty,
too big) each show one line and write nothing into the app's upload folder.

Skips only when Debian's ``chromium`` is not installed (``.ci/system-deps.sh`` installs it)."""

from __future__ import annotations

import io
import re
import urllib.parse
from dataclasses import replace

import pytest
from block0_kit import SMALL
from browser_helpers import chromium_path, guarded_page, launch, save_screenshot, start_app, wait_panels
from PIL import Image
from vision_kit import SMALL_VISION, gradient

from engram_viz.apps.picture_upload import MAX_UPLOAD_BYTES
from engram_viz.config import load_config
from engram_viz.weights.synthetic import write_synthetic_checkpoint

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (/usr/bin/chromium); .ci/system-deps.sh installs it"
)
LOAD_S, UPDATE_S = 240, 90
SMALL_PICTURES = replace(load_config("tiny"), name="tiny-small-pictures", vision_min_pixels=0)
BEFORE, AFTER = "Look at this:", " It shows the Great Wall of China."
TWIN = f"{BEFORE} <image:84x56px>{AFTER}"
MOVED = re.compile(
    r"0 replaced\), 0 only in B, 0 only in A; (\d+) aligned tokens with a different gate; "
    r"largest \|diff\| (\d\.\d{3}) at B position (\d+)"
)


def png(w: int = 84, h: int = 56) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(gradient(w, h)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``engram-viz app --checkpoint <synthetic with a vision tower> --streams block0``, its cache
    (and so its upload folder) in a folder of its own."""
    base = tmp_path_factory.mktemp("app_pictures")
    folder = write_synthetic_checkpoint(base / "ckpt", SMALL_PICTURES, seed=0, block0=SMALL, vision=SMALL_VISION)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGRAM_VIZ_CACHE", str(base / "cache"))
        server, url = start_app(base, ["--checkpoint", str(folder), "--streams", "block0"])
    yield {"url": url, "uploads": base / "cache" / "uploads"}
    assert server.stop() is not None, "engram-viz app did not stop"


@pytest.fixture()
def page(served):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = launch(p, CHROMIUM)
        with guarded_page(browser, LOAD_S, viewport={"width": 1400, "height": 1200}) as pg:
            query = urllib.parse.urlencode({"a": TWIN, "b": BEFORE})
            pg.goto(f"{served['url']}&{query}", timeout=LOAD_S * 1000)
            wait_panels(pg, lambda got: {"A", "B", "diff B-A"} <= got.keys(), LOAD_S, "the comparison")
            yield pg
            assert not pg.errors, f"uncaught errors in the page: {pg.errors}"
        browser.close()


def _upload(page, name: str, data: bytes, mime: str = "image/png") -> None:
    page.locator(".ev-image-into").select_option("B")
    page.locator(".ev-picture-file").set_input_files(files=[{"name": name, "mimeType": mime, "buffer": data}])


def test_an_uploaded_picture_shows_its_span_and_moves_the_gates_after_it(page, served, tmp_path):
    _upload(page, "wall.png", png())
    box_b = page.locator(".ev-prompts textarea").nth(1)
    page.wait_for_function(
        "() => document.querySelectorAll('.ev-prompts textarea')[1].value.includes('<image:upload-')",
        timeout=UPDATE_S * 1000,
    )
    span = re.search(r"<image:(upload-[0-9a-f]{16}\.png)>", box_b.input_value()).group(1)
    assert [p.name for p in served["uploads"].iterdir()] == [span]
    assert span in page.locator(".ev-image-info").inner_text()
    box_b.fill(box_b.input_value() + AFTER.strip())
    shown = wait_panels(page, lambda p: MOVED.search(p["diff B-A"]["text"]), UPDATE_S, "the gates after the picture")
    assert page.locator(".ev-panel[data-slot=B] .ev-img").count() == 1
    assert "[image ×8]" in shown["B"]["text"] and "[image ×8]" in shown["A"]["text"]  # 84x56 px: a 2x2 grid
    changed, largest, at = MOVED.search(shown["diff B-A"]["text"]).groups()
    stop = int(page.locator(".ev-panel[data-slot=B] .ev-img").get_attribute("data-pos")) + 8
    assert int(changed) >= 1 and float(largest) > 0.05 and int(at) >= stop, shown["diff B-A"]["text"]
    save_screenshot(page, tmp_path, "app_picture_upload", full_page=True)


@pytest.mark.parametrize(
    ("name", "data", "says"),
    [
        ("notes.txt", b"not a picture at all\n", "not a readable image"),
        ("cut.png", png()[:300], "not a readable image"),
        ("empty.png", b"", "is empty (0 bytes)"),
        ("huge.png", bytes(MAX_UPLOAD_BYTES + 1), f"at most {MAX_UPLOAD_BYTES:,} are taken"),
    ],
)
def test_a_bad_upload_is_one_line_and_writes_nothing(page, served, name, data, says):
    before = sorted(p.name for p in served["uploads"].iterdir()) if served["uploads"].exists() else []
    box_b = page.locator(".ev-prompts textarea").nth(1)
    text_b = box_b.input_value()
    _upload(page, name, data)
    info = page.locator(".ev-image-info")
    info.filter(has_text=f"upload '{name}'").wait_for(timeout=UPDATE_S * 1000)
    line = info.inner_text()
    assert says in line and "\n" not in line, line
    assert box_b.input_value() == text_b
    assert (sorted(p.name for p in served["uploads"].iterdir()) if served["uploads"].exists() else []) == before
