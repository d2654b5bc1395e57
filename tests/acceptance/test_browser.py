"""The comparison app in a real browser (Chromium driven by Playwright): JupyterLab 4 running the
prompt-comparison notebook, and the standalone page of ``engram-viz app``. Every request that is
not to 127.0.0.1 / localhost is blocked and recorded, and the tests assert there was none.

Servers are started and stopped here, on free loopback ports, each with its own temporary Jupyter
folders. Screenshots go to the test's folder and to ``out/test-artifacts/``. The tests skip only
when Debian's ``chromium`` is not installed (``.ci/system-deps.sh`` installs it)."""

from __future__ import annotations

import re
import secrets
import shutil
import time
import urllib.request

import pytest
from browser_helpers import (
    ROOT,
    OfflineGuard,
    chromium_path,
    launch,
    panels,
    save_screenshot,
    start_app,
    start_jupyterlab,
    wait_panels,
)

CHROMIUM = chromium_path()
pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="Debian's chromium is not installed (/usr/bin/chromium); .ci/system-deps.sh installs it"
)

NOTEBOOK = ROOT / "notebooks" / "06_prompt_comparison.ipynb"
LOAD_S = 240  # generous: the machines running these are shared and busy
UPDATE_S = 90
NEW_A = "Cleopatra ruled Egypt after Alexander the Great."
NEW_B = "Cleopatra ruled Egypt after Alexander the Small."  # one token replaced
ONE_REPLACED = "1 replaced), 0 only in B, 0 only in A"


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
    context = browser.new_context(viewport={"width": 1400, "height": 1300}, service_workers="block")
    context.set_default_timeout(LOAD_S * 1000)
    guard = OfflineGuard(context)
    pg = context.new_page()
    guard.watch(pg)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.guard, pg.errors = guard, errors
    yield pg
    context.close()
    assert guard.requests, "the page made no request at all"
    assert guard.external() == [], f"requests left 127.0.0.1: {guard.external()}"


def _type_prompt(page, textarea, text: str) -> None:
    """Replace a prompt box's text by typing it (select all, then key presses)."""
    textarea.click()
    textarea.press("Control+a")
    textarea.press("Backspace")
    textarea.press_sequentially(text, delay=15)


def _set_prompt(page, textarea, text: str) -> None:
    """Put ``text`` in a prompt box at once, as a paste does (one input event)."""
    textarea.fill(text)


def _inject_lone_surrogate(page, index: int) -> None:
    """What a paste from a broken source can put into a text box: a lone surrogate (U+D800), which
    no UTF-8 can carry. Set in the page itself (Playwright's own channel would replace it)."""
    page.evaluate(
        """(i) => {
            const el = document.querySelectorAll('.widget-textarea textarea')[i];
            el.focus();
            el.value = 'broken paste \\ud800 here';
            el.dispatchEvent(new Event('input', {bubbles: true}));
        }""",
        index,
    )


# --------------------------------------------------------------------------------- JupyterLab


@pytest.fixture()
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


def test_jupyterlab_runs_the_comparison_notebook_and_typing_updates_it(page, lab, tmp_path):
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
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"the notebook did not finish running within {LOAD_S} s: {state}")
    t_run = time.monotonic() - t0

    # the widget rendered (first cell's output) in the state the notebook left it in
    scope = ".jp-Notebook"
    got = wait_panels(
        page, lambda p: {"header", "A", "B", "diff B-A", "status"} <= p.keys(), UPDATE_S, "the comparison", scope
    )
    assert "Model and weights" in got["header"]["text"]
    boxes = page.locator(".jp-OutputArea .widget-textarea textarea")
    assert boxes.count() == 2
    boxes.first.scroll_into_view_if_needed()

    # typing new prompts updates the token views and the difference view
    _set_prompt(page, boxes.nth(1), NEW_B)
    wait_panels(page, lambda p: "Small." in p["B"]["text"], UPDATE_S, "prompt B pasted", scope)
    _type_prompt(page, boxes.first, NEW_A)
    got = wait_panels(
        page,
        lambda p: (
            "Cleopatra" in p["A"]["text"] and "Great." in p["A"]["text"] and ONE_REPLACED in p["diff B-A"]["text"]
        ),
        UPDATE_S,
        "the typed prompt in panel A and its difference against B (one token replaced)",
        scope,
    )
    assert got["A"]["text"].startswith("prompt A · layer")
    assert "Small" in got["diff B-A"]["text"]  # B's tokens, coloured against the aligned A tokens
    page.locator(".jp-OutputArea .widget-vbox").first.scroll_into_view_if_needed()
    time.sleep(0.5)
    shot = save_screenshot(page, tmp_path, "jupyterlab_prompt_comparison")
    assert shot.stat().st_size > 10_000
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"JupyterLab: notebook ran in {t_run:.0f} s; test {time.monotonic() - t0:.0f} s")


# --------------------------------------------------------------------------------- engram-viz app


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    base = tmp_path_factory.mktemp("app")
    server, url = start_app(base)
    assert url.startswith("http://127.0.0.1:"), url
    yield {"url": url, "server": server}
    rc = server.stop()
    assert rc is not None, "engram-viz app did not stop"


def test_app_needs_the_token_it_printed(app):
    """Voila runs a kernel per page: without the printed token the server sends to its login page."""
    base = app["url"].split("?", 1)[0]
    assert "?token=" in app["url"]
    for path in ("", "api/kernels"):
        with urllib.request.urlopen(base + path, timeout=60) as r:
            assert "/login" in r.url, (path, r.url)


def _open_app(page, app) -> dict:
    page.goto(app["url"], timeout=LOAD_S * 1000)
    return wait_panels(page, lambda p: {"header", "A", "B", "diff B-A"} <= p.keys(), LOAD_S, "the comparison")


def test_app_page_updates_and_layer_or_stream_changes_the_view(page, app, tmp_path):
    t0 = time.monotonic()
    first = _open_app(page, app)
    assert "Model and weights" in first["header"]["text"]
    assert first["A"]["text"].startswith("prompt A · layer")
    boxes = page.locator(".widget-textarea textarea")
    assert boxes.count() == 2

    _set_prompt(page, boxes.nth(1), NEW_B)
    wait_panels(page, lambda p: "Small." in p["B"]["text"], UPDATE_S, "prompt B pasted")
    _type_prompt(page, boxes.first, NEW_A)
    typed = wait_panels(
        page,
        lambda p: (
            "Cleopatra" in p["A"]["text"] and "Great." in p["A"]["text"] and ONE_REPLACED in p["diff B-A"]["text"]
        ),
        UPDATE_S,
        "the typed prompt in panel A and its difference against B (one token replaced)",
    )
    assert typed["diff B-A"] != first["diff B-A"]

    # layer: the second Engram layer; the token colours (the view's 'figure') change
    layer_select = page.locator(".widget-dropdown", has_text="layer").locator("select")
    layers = layer_select.locator("option").all_inner_texts()
    assert len(layers) >= 2, layers
    layer_select.select_option(index=1)
    by_layer = wait_panels(
        page, lambda p: f"layer {layers[1]}" in p["A"]["text"], UPDATE_S, f"layer {layers[1]} in panel A"
    )
    assert by_layer["A"]["html"] != typed["A"]["html"]
    assert f"layer {layers[1]}" in by_layer["diff B-A"]["text"]

    # stream: one stream instead of the mean over streams
    page.locator(".widget-dropdown", has_text="stream").locator("select").select_option(label="stream 0")
    by_stream = wait_panels(page, lambda p: "stream 0" in p["A"]["text"], UPDATE_S, "stream 0 in panel A")
    assert by_stream["A"]["html"] != by_layer["A"]["html"]
    assert by_stream["diff B-A"]["html"] != by_layer["diff B-A"]["html"]

    # the insert-image button appends a placeholder to the chosen prompt (B by default: A)
    page.locator(".widget-dropdown", has_text="into").locator("select").select_option("B")
    page.locator("button", has_text="insert image").click()
    only_in_b = re.compile(r"\b([1-9]\d*) only in B,")  # the summary line (the legend says 'only in B' too)
    with_image = wait_panels(
        page,
        lambda p: only_in_b.search(p["diff B-A"]["text"]) and "image" in p["B"]["text"].split("gate (")[0],
        UPDATE_S,
        "an image span inserted into prompt B",
    )
    assert "<image:16x12>" in boxes.nth(1).input_value()
    assert with_image["B"]["text"].startswith("prompt B · layer")
    assert int(only_in_b.search(with_image["diff B-A"]["text"]).group(1)) >= 16 * 12  # the span's positions
    page.locator("button", has_text="insert image").scroll_into_view_if_needed()
    shot = save_screenshot(page, tmp_path, "app_prompt_comparison", full_page=True)
    assert shot.stat().st_size > 10_000
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"engram-viz app page: {time.monotonic() - t0:.0f} s")


def test_app_page_bad_prompts_show_a_message_and_the_app_keeps_working(page, app, tmp_path):
    t0 = time.monotonic()
    _open_app(page, app)
    box_a = page.locator(".widget-textarea textarea").first

    def shows(what: str, needle: str) -> dict:
        # the panels update one after another: wait for the message and the difference panel's hint
        got = wait_panels(
            page,
            lambda p: needle in p["A"]["text"] and "fix prompt A" in p["diff B-A"]["text"],
            UPDATE_S,
            f"a message for {what}",
        )
        assert got["A"]["text"].startswith("prompt A"), got["A"]["text"]
        assert "Traceback" not in got["A"]["text"]
        assert got["B"]["text"].startswith("prompt B · layer"), "prompt B stopped showing"
        assert "fix prompt A" in got["diff B-A"]["text"]
        return got

    _set_prompt(page, box_a, "")
    shows("an empty prompt", "is empty")
    _set_prompt(page, box_a, "x" * 100_000)
    shows("100,000 characters", "100,000 characters")
    _inject_lone_surrogate(page, 0)
    got = shows("a lone surrogate (invalid UTF-8)", "U+D800")
    assert "not valid UTF-8" in got["A"]["text"]
    assert box_a.input_value() == "broken paste \ufffd here"  # the box shows the replacement character
    _set_prompt(page, box_a, "A picture: <image:40x40> of the Great Wall.")
    got = shows("an image grid over the limit", "1024")
    assert "40 x 40" in got["A"]["text"] or "40x40" in got["A"]["text"]
    save_screenshot(page, tmp_path, "app_bad_prompt", full_page=True)

    # and a valid prompt after all that still updates every view
    _type_prompt(page, box_a, NEW_A)
    ok = wait_panels(
        page,
        lambda p: (
            p["A"]["text"].startswith("prompt A · layer")
            and "Cleopatra" in p["A"]["text"]
            and "aligned tokens" in p["diff B-A"]["text"]
        ),
        UPDATE_S,
        "the valid prompt after the bad ones",
    )
    assert "2 of 2 prompts shown" in panels(page)["status"]["text"]
    assert ok["B"]["text"].startswith("prompt B · layer")
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"bad prompts on the app page: {time.monotonic() - t0:.0f} s")


_EXPLAINER_JS = """
() => Array.from(document.querySelectorAll('.ev-explainer .widget-html-content')).map(e => e.innerText).join('\\n')
"""


def _explainer_text(page, pred, what: str) -> str:
    t_end = time.monotonic() + UPDATE_S
    text = ""
    while time.monotonic() < t_end:
        text = page.evaluate(_EXPLAINER_JS)
        if pred(text):
            return text
        time.sleep(0.25)
    raise AssertionError(f"the explainer did not show {what} within {UPDATE_S} s; it shows {text[:400]!r}")


def test_app_page_explains_a_token_and_ablates_one_of_its_rows(page, app, tmp_path):
    """Pick a token of prompt A, see its 24 rows, ablate the row with the largest share: the
    difference view reports the change; 'restore' clears it."""
    t0 = time.monotonic()
    _open_app(page, app)
    page.locator(".ev-explain-token select").select_option(index=3)  # option 0 is 'pick a token'
    rows_text = _explainer_text(page, lambda t: "the 24 rows of position 2" in t, "the rows of position 2")
    assert page.locator(".ev-explainer tr.ev-row").count() == 24
    assert "share of dot" in rows_text and "-gram" in rows_text
    options = page.locator(".ev-explain-row select option").all_inner_texts()
    assert len(options) == 24, options
    share = [abs(float(re.search(r"([+-]\d+)%$", o).group(1))) for o in options]
    page.locator(".ev-explain-row select").select_option(index=share.index(max(share)))
    page.locator("button", has_text="ablate row").click()
    changed = re.compile(r"; ([1-9]\d*) aligned tokens with a different gate; largest \|diff\| (\d\.\d+)")
    text = _explainer_text(page, lambda t: "zeroed" in t and changed.search(t), "the difference of the ablation")
    assert float(changed.search(text).group(2)) > 0
    save_screenshot(page, tmp_path, "app_explain_ablate", full_page=True)
    page.locator("button", has_text="restore").click()
    _explainer_text(page, lambda t: "zeroed" not in t and "the 24 rows" in t, "the view restored")
    assert not page.errors, f"uncaught errors in the page: {page.errors}"
    print(f"explain and ablate on the app page: {time.monotonic() - t0:.0f} s")
