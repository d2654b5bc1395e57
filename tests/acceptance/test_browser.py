"""The gate view in a real browser (Chromium driven by Playwright), in each host it runs in:
JupyterLab 4 running the prompt-comparison notebook (light, then dark), the standalone page of
``engram-viz app``, and a real ``marimo run`` server (dark theme) running ``tests/marimo_gate_view.py``. In each:
click a token and see its rows, ablate one and see the difference beside the button, export the
view and open the file. Every request that is not to 127.0.0.1 / localhost is blocked and
recorded, and the tests assert there was none.

Servers are started once per module, on free loopback ports, each with its own temporary folders.
Screenshots go to the test's folder and to ``out/test-artifacts/``. The tests skip only when
Debian's ``chromium`` is not installed (``.ci/system-deps.sh`` installs it)."""

from __future__ import annotations

import io
import json
import re
import secrets
import shutil
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
from browser_helpers import (
    ARTIFACTS,
    ROOT,
    chromium_path,
    guarded_page,
    launch,
    panels,
    save_screenshot,
    start_app,
    start_jupyterlab,
    start_marimo,
    wait_panels,
)

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (/usr/bin/chromium); .ci/system-deps.sh installs it"
)

NOTEBOOK = ROOT / "notebooks" / "06_prompt_comparison.ipynb"
MARIMO_NOTEBOOK = ROOT / "tests" / "marimo_gate_view.py"
LOAD_S = 240  # generous: the machines running these are shared and busy
UPDATE_S = 90
NEW_A = "Cleopatra ruled Egypt after Alexander the Great."
NEW_B = "Cleopatra ruled Egypt after Alexander the Small."  # one token replaced
ONE_REPLACED = "1 replaced), 0 only in B, 0 only in A"
CHANGED = re.compile(r"gate (\d\.\d{3}) → (\d\.\d{3}) \(([+−])(\d\.\d{3})\); (\d+) tokens? changed")


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = launch(p, CHROMIUM)
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    """A fresh page whose every request is checked: loopback only (asserted after the test)."""
    with guarded_page(browser, LOAD_S, viewport={"width": 1400, "height": 1300}, accept_downloads=True) as pg:
        yield pg


def _type_prompt(page, textarea, text: str) -> None:
    """Replace a prompt box's text by typing it (select all, then key presses)."""
    textarea.click()
    textarea.press("Control+a")
    textarea.press("Backspace")
    textarea.press_sequentially(text, delay=15)


def _inject_lone_surrogate(page, index: int) -> None:
    """What a paste from a broken source can put into a text box: a lone surrogate (U+D800), which
    no UTF-8 can carry. Set in the page itself (Playwright's own channel would replace it)."""
    page.evaluate(
        """(i) => {
            const el = document.querySelectorAll('.ev-prompts textarea')[i];
            el.focus();
            el.value = 'broken paste \\ud800 here';
            el.dispatchEvent(new Event('input', {bubbles: true}));
        }""",
        index,
    )


# ------------------------------------------------------------------ what every host is checked for


def explain_and_ablate(page, scope: str = "") -> str:
    """Click token 3 of prompt A: its 24 rows show; ablate the row with the largest share: the gate
    change shows beside the button and the difference view below. Returns the text beside it."""
    page.locator(f"{scope} .ev-panel[data-slot=A] .ev-tok[data-pos='3']").click()
    rows = page.locator(f"{scope} .ev-rows tr.ev-row")
    rows.first.wait_for(timeout=UPDATE_S * 1000)
    assert rows.count() == 24
    box = page.locator(f"{scope} .ev-explain")
    assert "the 24 rows of position 3" in box.inner_text() and "-gram" in box.inner_text()
    shares = [
        abs(float(re.search(r"([+−]\d+\.\d)%", rows.nth(k).inner_text()).group(1).replace("−", "-"))) for k in range(24)
    ]
    biggest = shares.index(max(shares))
    page.locator(f"{scope} button.ev-ablate").nth(biggest).click()
    beside = page.locator(f"{scope} tr.ev-ablated .ev-ablation-result")
    beside.wait_for(timeout=UPDATE_S * 1000)
    page.locator(f"{scope} .ev-ablation-diff").wait_for(timeout=UPDATE_S * 1000)
    text = beside.inner_text()
    m = CHANGED.search(text)
    assert m and float(m.group(4)) > 0 and int(m.group(5)) >= 1, text
    assert "zeroed" in page.locator(f"{scope} .ev-ablation-diff").inner_text()
    return text


def export_and_open(page, browser, tmp_path, fmt: str, scope: str = ""):
    """Export the view as ``fmt`` with its button and open the saved file: the HTML page in the
    browser, the PNG as an image, the PDF by its header, the JSON as settings. Returns the path."""
    page.locator(f"{scope} .ev-export-format").select_option(fmt)
    with page.expect_download(timeout=UPDATE_S * 1000) as info:
        page.locator(f"{scope} .ev-export-button").click()
    download = info.value
    path = tmp_path / download.suggested_filename
    download.save_as(path)
    assert path.suffix == f".{fmt}" and path.stat().st_size > 200
    if fmt == "html":
        opened = page.context.new_page()
        opened.goto(path.as_uri())
        text = opened.locator("body").inner_text()
        assert "prompt A" in text and "Model and weights" in text
        opened.close()
    elif fmt == "png":
        from PIL import Image

        with Image.open(io.BytesIO(path.read_bytes())) as im:
            assert im.format == "PNG" and im.width > 200
    elif fmt == "pdf":
        assert path.read_bytes().startswith(b"%PDF-")
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, ARTIFACTS / f"exported_{path.name}")
    return path


# --------------------------------------------------------------------------------- JupyterLab


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    import jupyterlab

    assert jupyterlab.__version__.startswith("4."), f"expected JupyterLab 4, got {jupyterlab.__version__}"
    if not NOTEBOOK.is_file():
        pytest.fail(f"{NOTEBOOK} is missing: the prompt-comparison notebook is what this test opens")
    base = tmp_path_factory.mktemp("jupyterlab")
    root = base / "root"
    root.mkdir()
    shutil.copyfile(NOTEBOOK, root / NOTEBOOK.name)
    token = secrets.token_hex(12)
    server, url = start_jupyterlab(root, base, token)
    yield {"url": url, "token": token, "server": server, "root": root}
    rc = server.stop()
    assert rc is not None, "JupyterLab did not stop"


_RUN_STATE_JS = """
() => {
  const app = window.jupyterapp;
  const w = app && app.shell.currentWidget;
  if (!w || !w.content || !w.content.model || !w.sessionContext) return {ready: false};
  const cells = w.content.model.cells;
  let code = 0, done = 0, errors = [];
  for (let i = 0; i < cells.length; i++) {
    const c = cells.get(i);
    if (c.type !== 'code') continue;
    code++;
    if (c.executionCount) done++;
    for (const o of c.outputs.toJSON()) {
      if (o.output_type === 'error') errors.push(`${o.ename}: ${o.evalue}`);
    }
  }
  const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
  return {ready: true, code, done, errors, status: kernel ? kernel.status : 'none'};
}
"""

_BACKGROUND_JS = """
(sel) => {
  const m = getComputedStyle(document.querySelector(sel)).backgroundColor.match(/\\d+(\\.\\d+)?/g).map(Number);
  return (0.2126 * m[0] + 0.7152 * m[1] + 0.0722 * m[2]) / 255;
}
"""


def _run_all(page, lab) -> float:
    t0 = time.monotonic()
    page.goto(f"{lab['url']}/lab/tree/{NOTEBOOK.name}?token={lab['token']}", timeout=LOAD_S * 1000)
    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=LOAD_S * 1000)
    # wait for the kernel, then Run > Run All Cells (the menu, as a researcher would)
    page.wait_for_function(
        "() => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
        " return k && k.status === 'idle'; }",
        timeout=LOAD_S * 1000,
    )
    page.locator(".lm-MenuBar-item", has_text=re.compile(r"^Run$")).click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Run All Cells")).first.click()
    t_end = time.monotonic() + LOAD_S
    state: dict = {}
    while time.monotonic() < t_end:
        state = page.evaluate(_RUN_STATE_JS)
        assert not state.get("errors"), f"a notebook cell failed: {state['errors']}"
        if state.get("ready") and state["code"] and state["done"] == state["code"] and state["status"] == "idle":
            return time.monotonic() - t0
        time.sleep(0.5)
    pytest.fail(f"the notebook did not finish running within {LOAD_S} s: {state}")


def test_jupyterlab_light_then_dark_typing_click_ablate_export(page, browser, lab, tmp_path):
    """Notebook 06 in JupyterLab: the view updates as one types, explains a clicked token, ablates
    a row, exports a file that opens; then JupyterLab's dark theme turns the view dark."""
    t0 = time.monotonic()
    t_run = _run_all(page, lab)
    scope = ".jp-Notebook"
    got = wait_panels(
        page, lambda p: {"header", "A", "B", "diff B-A", "status"} <= p.keys(), UPDATE_S, "the comparison", scope
    )
    assert "Model and weights" in got["header"]["text"]
    boxes = page.locator(".jp-OutputArea .ev-prompts textarea")
    assert boxes.count() == 2
    assert page.locator(".ev-view").first.get_attribute("data-theme") == "light"
    boxes.first.scroll_into_view_if_needed()

    # typing new prompts updates the token views and the difference view
    boxes.nth(1).fill(NEW_B)
    wait_panels(page, lambda p: "Small" in p["B"]["text"], UPDATE_S, "prompt B pasted", scope)
    _type_prompt(page, boxes.first, NEW_A)
    got = wait_panels(
        page,
        lambda p: "Cleopatra" in p["A"]["text"] and ONE_REPLACED in p.get("diff B-A", {}).get("text", ""),
        UPDATE_S,
        "the typed prompt in panel A and its difference against B (one token replaced)",
        scope,
    )
    assert got["A"]["text"].startswith("prompt A · layer")

    beside = explain_and_ablate(page)
    save_screenshot(page, tmp_path, "jupyterlab_light_explain_ablate")
    export_and_open(page, browser, tmp_path, "html")

    # JupyterLab's dark theme: the view follows the host, and so do the kernel's difference panels
    page.evaluate("() => window.jupyterapp.commands.execute('apputils:change-theme', {theme: 'JupyterLab Dark'})")
    page.wait_for_selector("body[data-jp-theme-light='false']", state="attached", timeout=UPDATE_S * 1000)
    page.wait_for_selector(".ev-view[data-theme='dark']", timeout=UPDATE_S * 1000)
    assert page.evaluate(_BACKGROUND_JS, ".ev-view") < 0.2
    wait_panels(page, lambda p: "#16181d" in p.get("diff B-A", {}).get("html", ""), UPDATE_S, "dark panels", scope)
    assert page.locator(".ev-rows tr.ev-row").count() == 24  # the explanation stays
    page.locator(".ev-panel[data-slot=A] .ev-tok[data-pos='4']").hover()
    tip = page.locator(".ev-tip")
    tip.wait_for(timeout=UPDATE_S * 1000)
    assert "position 4" in tip.inner_text() and "row ids at layer" in tip.inner_text()
    save_screenshot(page, tmp_path, "jupyterlab_dark_view")
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"JupyterLab: notebook ran in {t_run:.0f} s; test {time.monotonic() - t0:.0f} s; ablation: {beside}")


# --------------------------------------------------------------------------------- engram-viz app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """``engram-viz app`` started here; the page fetched the moment its URL is printed (the
    placeholder), then opened in Chromium until the view paints (its first useful paint)."""
    base = tmp_path_factory.mktemp("app")
    t0 = time.monotonic()
    server, url = start_app(base)
    t_url = time.monotonic() - t0
    with urllib.request.urlopen(url, timeout=60) as r:
        first_page = r.read().decode("utf-8")
    assert url.startswith("http://127.0.0.1:"), url
    yield {"url": url, "server": server, "t0": t0, "t_url": t_url, "first_page": first_page}
    rc = server.stop()
    assert rc is not None, "engram-viz app did not stop"


def _open_app(page, url: str) -> dict:
    page.goto(url, timeout=LOAD_S * 1000)
    return wait_panels(page, lambda p: {"header", "A", "B", "diff B-A"} <= p.keys(), LOAD_S, "the comparison")


def test_app_says_where_it_is_while_loading_and_paints(page, app, tmp_path):
    """The placeholder answers as soon as the URL is printed and names its step; the steps are
    printed; the page shows the view once the model is ready (the first useful paint, quoted)."""
    assert "the prompt comparison is loading" in app["first_page"]
    step = re.search(r'id="ev-step">([^<]+)<', app["first_page"]).group(1)
    assert step in {"starting", "importing torch and the model code"} or step.startswith("loading the model from")
    _open_app(page, app["url"])
    t_paint = time.monotonic() - app["t0"]
    out = app["server"].output
    steps = ["importing torch", "loading the model from the embedded default", "running the first prompts", "ready"]
    at = [out.find(f"engram-viz app: {s}") for s in steps]
    assert all(x >= 0 for x in at) and at == sorted(at), out
    ready_s = float(re.search(r"engram-viz app: ready: open the URL above \((\d+\.\d) s\)", out).group(1))
    timing = {"url_printed_s": round(app["t_url"], 1), "model_ready_after_url_s": ready_s}
    timing["first_useful_paint_s"] = round(t_paint, 1)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / "app_first_paint.json").write_text(json.dumps(timing, indent=1), encoding="utf-8")
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"engram-viz app timing (from the command's start): {timing}")


def test_app_needs_the_token_it_printed(app):
    """The page runs the model on the server: without the printed token every path answers 403."""
    base = app["url"].split("?", 1)[0]
    assert "?token=" in app["url"]
    for path in ("", "status", "static/gate_view.js", "ws"):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(base + path + "?token=wrong", timeout=60)
        assert err.value.code == 403, path


def test_app_page_updates_layer_stream_image_and_url(page, browser, app, tmp_path):
    first = _open_app(page, app["url"])
    assert "Model and weights" in first["header"]["text"]
    assert first["A"]["text"].startswith("prompt A · layer")
    boxes = page.locator(".ev-prompts textarea")
    assert boxes.count() == 2

    boxes.nth(1).fill(NEW_B)
    wait_panels(page, lambda p: "Small" in p["B"]["text"], UPDATE_S, "prompt B pasted")
    _type_prompt(page, boxes.first, NEW_A)
    typed = wait_panels(
        page,
        lambda p: "Cleopatra" in p["A"]["text"] and ONE_REPLACED in p.get("diff B-A", {}).get("text", ""),
        UPDATE_S,
        "the typed prompt in panel A and its difference against B (one token replaced)",
    )
    assert typed["diff B-A"] != first["diff B-A"]

    # layer: the second Engram layer; the token colours change
    layers = page.locator(".ev-layer option").all_inner_texts()
    assert len(layers) >= 2, layers
    page.locator(".ev-layer").select_option(index=1)
    by_layer = wait_panels(
        page, lambda p: f"layer {layers[1]}" in p["A"]["text"], UPDATE_S, f"layer {layers[1]} in panel A"
    )
    assert by_layer["A"]["html"] != typed["A"]["html"]
    wait_panels(page, lambda p: f"layer {layers[1]}" in p["diff B-A"]["text"], UPDATE_S, "the difference redrawn")
    page.locator(".ev-stream").select_option(label="stream 0")
    by_stream = wait_panels(page, lambda p: "stream 0" in p["A"]["text"], UPDATE_S, "stream 0 in panel A")
    assert by_stream["A"]["html"] != by_layer["A"]["html"]

    # the URL carries the view: opened in another tab it shows the same prompts, layer and stream
    page.wait_for_function("() => location.search.includes('stream=0')", timeout=UPDATE_S * 1000)
    shared = page.url
    assert f"layer={layers[1]}" in shared and "Cleopatra" in urllib.parse.unquote_plus(shared)
    other = page.context.new_page()
    again = _open_app(other, shared)
    assert "Cleopatra" in again["A"]["text"] and f"layer {layers[1]} · stream 0" in again["A"]["text"]
    other.close()

    # the insert-image button appends a placeholder to the chosen prompt: one block in the view
    page.locator(".ev-image-into").select_option("B")
    page.locator("button", has_text="insert image").click()
    only_in_b = re.compile(r"\b([1-9]\d*) only in B,")
    with_image = wait_panels(
        page,
        lambda p: only_in_b.search(p["diff B-A"]["text"]) and "[image ×" in p["B"]["text"],
        UPDATE_S,
        "an image span inserted into prompt B",
    )
    assert "<image:16x12>" in boxes.nth(1).input_value()
    assert page.locator(".ev-panel[data-slot=B] .ev-img").count() == 1
    assert int(only_in_b.search(with_image["diff B-A"]["text"]).group(1)) >= 16 * 12
    shot = save_screenshot(page, tmp_path, "app_prompt_comparison", full_page=True)
    assert shot.stat().st_size > 10_000
    assert not page.errors, f"uncaught errors in the page: {page.errors}"


def test_app_page_bad_prompts_show_a_message_and_the_app_keeps_working(page, app, tmp_path):
    _open_app(page, app["url"])
    box_a = page.locator(".ev-prompts textarea").first

    def shows(what: str, needle: str) -> dict:
        got = wait_panels(
            page,
            lambda p: needle in p["A"]["text"] and "fix prompt A" in p.get("diff B-A", {}).get("text", ""),
            UPDATE_S,
            f"a message for {what}",
        )
        assert got["A"]["text"].startswith("prompt A") and "Traceback" not in got["A"]["text"]
        assert got["B"]["text"].startswith("prompt B · layer"), "prompt B stopped showing"
        return got

    box_a.fill("")
    shows("an empty prompt", "is empty")
    box_a.fill("x" * 100_000)
    shows("100,000 characters", "100,000 characters")
    _inject_lone_surrogate(page, 0)
    got = shows("a lone surrogate (invalid UTF-8)", "U+D800")
    assert "not valid UTF-8" in got["A"]["text"]
    page.wait_for_function(
        "() => document.querySelector('.ev-prompts textarea').value === 'broken paste \\ufffd here'",
        timeout=UPDATE_S * 1000,
    )  # the box shows the replacement character
    box_a.fill("A picture: <image:40x40> of the Great Wall.")
    got = shows("an image grid over the limit", "1024")
    save_screenshot(page, tmp_path, "app_bad_prompt", full_page=True)
    _type_prompt(page, box_a, NEW_A)
    wait_panels(
        page,
        lambda p: p["A"]["text"].startswith("prompt A · layer") and "aligned tokens" in p["diff B-A"]["text"],
        UPDATE_S,
        "the valid prompt after the bad ones",
    )
    assert "2 of 2 prompts shown" in panels(page)["status"]["text"]
    assert not page.errors, f"uncaught errors in the page: {page.errors}"


def test_app_page_click_ablate_and_export(page, browser, app, tmp_path):
    """Click a token, ablate its strongest row, restore; export PNG, PDF and JSON and open them."""
    _open_app(page, app["url"])
    explain_and_ablate(page)
    save_screenshot(page, tmp_path, "app_explain_ablate", full_page=True)
    page.locator("button.ev-restore").click()
    page.locator(".ev-ablation-diff").wait_for(state="detached", timeout=UPDATE_S * 1000)
    assert page.locator(".ev-rows tr.ev-row").count() == 24
    # the all-gates view: a readable grid under every token, each cell named on hover
    page.locator(".ev-viewmode button", has_text="all gates").click()
    cells = page.locator(".ev-panel[data-slot=A] .ev-gcell")
    cells.first.wait_for(timeout=UPDATE_S * 1000)
    n_tokens = page.locator(".ev-panel[data-slot=A] .ev-tok").count()
    layers, streams = page.locator(".ev-layer option").count(), page.locator(".ev-stream option").count() - 3
    assert cells.count() == n_tokens * layers * streams and cells.first.bounding_box()["width"] >= 10
    cells.nth(streams + 1).hover()  # the first token's second layer, stream 1
    assert page.locator(".ev-tip td.ev-hit").count() == 1
    assert page.locator(".ev-tip tr").nth(2).locator("td.ev-hit").count() == 1
    for fmt in ("png", "pdf"):
        export_and_open(page, browser, tmp_path, fmt)
    settings = json.loads(export_and_open(page, browser, tmp_path, "json").read_text(encoding="utf-8"))
    assert settings["selected"] == {"slot": "A", "position": 3} and len(settings["prompts"]) == 2
    assert not page.errors, f"uncaught errors in the page: {page.errors}"


# --------------------------------------------------------------------------------- marimo


@pytest.fixture(scope="module")
def marimo_server(tmp_path_factory):
    pytest.importorskip("marimo")
    base = tmp_path_factory.mktemp("marimo")
    server, url = start_marimo(MARIMO_NOTEBOOK, base, secrets.token_hex(12), theme="dark")
    yield {"url": url, "server": server}
    rc = server.stop()
    assert rc is not None, "marimo did not stop"


def test_marimo_runs_the_view_click_ablate_export(page, browser, marimo_server, tmp_path):
    """A real ``marimo run`` server in marimo's dark theme: the notebook's view renders (marimo's
    anywidget support), follows the dark theme, explains a clicked token, ablates a row and exports
    a file."""
    t0 = time.monotonic()
    page.goto(marimo_server["url"], timeout=LOAD_S * 1000)
    page.locator(".ev-panel[data-slot=A] .ev-tok").first.wait_for(timeout=LOAD_S * 1000)
    t_paint = time.monotonic() - t0
    assert page.locator(".ev-view").get_attribute("data-theme") == "dark"  # marimo's own theme
    assert page.locator(".ev-panel[data-slot=B]").inner_text().startswith("prompt B · layer")
    assert "aligned tokens" in page.locator(".ev-diff").first.inner_text()
    beside = explain_and_ablate(page)
    export_and_open(page, browser, tmp_path, "html")
    save_screenshot(page, tmp_path, "marimo_gate_view", full_page=True)
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"marimo: view painted {t_paint:.0f} s after opening; ablation: {beside}")
