"""What the browser tests (``tests/test_browser.py``) share: Debian's Chromium driven by Playwright,
servers started on free loopback ports in their own temporary Jupyter folders, a guard that lets
only loopback requests through (and records the others), and readers for the comparison widget.

Playwright's own browser download does not work offline and is never used: the tests drive
``/usr/bin/chromium`` (``.ci/system-deps.sh`` installs it)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "out" / "test-artifacts"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
LOCAL_SCHEMES = {"data", "blob", "about", "file"}


def chromium_path() -> str | None:
    """Debian's Chromium, or None when it is not installed."""
    for cand in ("/usr/bin/chromium", shutil.which("chromium"), shutil.which("chromium-browser")):
        if cand and os.access(cand, os.X_OK):
            return cand
    return None


def launch(playwright, executable: str):
    """Headless Chromium from ``executable`` (never Playwright's own download)."""
    return playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, headless=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def is_local(url: str) -> bool:
    """True for a URL on this machine's loopback (http/ws) or one that needs no network (data:, blob:)."""
    parts = urlsplit(url)
    if parts.scheme in LOCAL_SCHEMES:
        return True
    return parts.scheme in {"http", "https", "ws", "wss"} and (parts.hostname or "") in LOOPBACK


class OfflineGuard:
    """Routes every request of a browser context: loopback ones go through, any other is aborted
    and recorded in ``blocked``; websockets are recorded too (``sockets``)."""

    def __init__(self, context) -> None:
        self.blocked: list[str] = []
        self.requests: list[str] = []
        self.sockets: list[str] = []
        context.route("**/*", self._route)
        context.on("request", lambda req: self.requests.append(req.url))
        context.on("page", self.watch)

    def watch(self, page) -> None:
        page.on("websocket", lambda ws: self.sockets.append(ws.url))

    def _route(self, route) -> None:
        url = route.request.url
        if is_local(url):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort("blockedbyclient")

    def external(self) -> list[str]:
        """Every request or websocket that was not to 127.0.0.1 / localhost (should be empty)."""
        return list(self.blocked) + [u for u in self.requests + self.sockets if not is_local(u)]


@contextmanager
def guarded_page(browser, load_s: float, **options) -> Iterator:
    """A fresh page in a new context of ``browser`` (``options``: Playwright's context options) whose
    every request goes through an :class:`OfflineGuard`; the page carries ``.guard`` and ``.errors``
    (uncaught page errors). On exit the context closes and no request may have left 127.0.0.1."""
    context = browser.new_context(service_workers="block", **options)
    context.set_default_timeout(load_s * 1000)
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


def jupyter_env(base: Path) -> dict[str, str]:
    """The environment for a server of a test: its own Jupyter config, data, runtime and IPython
    folders under ``base`` (nothing of the user's Jupyter set-up applies, nothing is written there)
    and this tree first on ``PYTHONPATH``."""
    env = dict(os.environ)
    for name, sub in (
        ("JUPYTER_CONFIG_DIR", "config"),
        ("JUPYTER_DATA_DIR", "data"),
        ("JUPYTER_RUNTIME_DIR", "runtime"),
        ("IPYTHONDIR", "ipython"),
    ):
        d = base / sub
        d.mkdir(parents=True, exist_ok=True)
        env[name] = str(d)
    env.pop("JUPYTER_PATH", None)
    env.pop("JUPYTER_TOKEN", None)
    # servers and their kernels import this tree's engram_viz, whatever an editable install points at
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("MPLBACKEND", "Agg")
    return env


class Server:
    """A server process of a test, with its output collected into ``log`` (read by a thread)."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, log_path: Path) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w", encoding="utf-8")  # noqa: SIM115 - closed in stop()
        self._lines: list[str] = []
        self.proc = subprocess.Popen(
            argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.append(line)
            self._log.write(line)
            self._log.flush()

    @property
    def output(self) -> str:
        return "".join(self._lines)

    def wait_for_line(self, pattern: str, timeout: float) -> re.Match:
        """The first output line matching ``pattern``; fails with the output when the process
        exits or ``timeout`` seconds pass first."""
        rx = re.compile(pattern)
        t_end = time.monotonic() + timeout
        while time.monotonic() < t_end:
            for line in list(self._lines):
                m = rx.search(line)
                if m:
                    return m
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader catch up
                raise RuntimeError(
                    f"server exited ({self.proc.returncode}) before printing {pattern!r}:\n{self.output}"
                )
            time.sleep(0.1)
        raise TimeoutError(f"no line matching {pattern!r} within {timeout:.0f} s:\n{self.output}")

    def stop(self, timeout: float = 60) -> int | None:
        """SIGTERM (the server shuts down its kernels), then SIGKILL after ``timeout`` seconds."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        self._log.close()
        return self.proc.returncode


def wait_http(url: str, timeout: float, server: Server | None = None) -> None:
    """Wait until ``url`` answers 200."""
    t_end = time.monotonic() + timeout
    last: Exception | None = None
    while time.monotonic() < t_end:
        if server is not None and server.proc.poll() is not None:
            raise RuntimeError(f"server exited ({server.proc.returncode}):\n{server.output}")
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                if r.status == 200:
                    return
        except Exception as err:  # noqa: BLE001 - not up yet
            last = err
        time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f} s ({last})")


def start_jupyterlab(root: Path, base: Path, token: str) -> tuple[Server, str]:
    """JupyterLab 4 on 127.0.0.1 (a free port, token ``token``) serving ``root``, with its settings,
    workspaces, config, data and runtime folders under ``base``; no news, no update checks, no
    extension manager queries; ``window.jupyterapp`` exposed. Returns (server, base URL)."""
    env = jupyter_env(base)
    labconfig = Path(env["JUPYTER_CONFIG_DIR"]) / "labconfig"
    labconfig.mkdir(parents=True, exist_ok=True)
    (labconfig / "page_config.json").write_text(
        '{"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": true}}', encoding="utf-8"
    )
    port = free_port()
    argv = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ServerApp.ip=127.0.0.1",
        f"--ServerApp.port={port}",
        "--ServerApp.port_retries=0",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        f"--LabApp.user_settings_dir={base / 'settings'}",
        f"--LabApp.workspaces_dir={base / 'workspaces'}",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.handlers.announcements.NeverCheckForUpdate",
        "--LabApp.extension_manager=readonly",
        "--LabApp.expose_app_in_browser=True",
        "--ServerApp.open_browser=False",
        "--ServerApp.terminals_enabled=False",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:  # CI runs as root
        argv.append("--allow-root")
    server = Server(argv, env, root, base / "jupyterlab.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/api/status?token={token}", 180, server)
    return server, url


def start_app(base: Path, extra: list[str] | None = None) -> tuple[Server, str]:
    """``engram-viz app --port 0`` (the real command line) with its Jupyter folders under ``base``;
    returns (server, the URL it printed)."""
    env = jupyter_env(base)
    argv = [sys.executable, "-m", "engram_viz.cli", "app", "--port", "0", *(extra or [])]
    server = Server(argv, env, base, base / "app.log")
    m = server.wait_for_line(r"serving the prompt comparison at (http://\S+)", 120)
    return server, m.group(1)


def start_marimo(notebook: Path, base: Path, token: str, theme: str = "light") -> tuple[Server, str]:
    """``marimo run notebook`` on 127.0.0.1 (a free port, headless, token ``token``), its home and
    user config under ``base`` (marimo's ``theme``: 'light' or 'dark'); returns (server, the URL
    with the token)."""
    env = jupyter_env(base)
    env["HOME"] = str(base / "home")
    env["XDG_CONFIG_HOME"] = str(base / "home" / ".config")
    config = base / "home" / ".config" / "marimo" / "marimo.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[display]\ntheme = "{theme}"\n', encoding="utf-8")
    port = free_port()
    argv = [sys.executable, "-m", "marimo", "-q", "-y", "run", str(notebook), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--headless", "--token-password", token]
    server = Server(argv, env, ROOT, base / "marimo.log")
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 180, server)
    return server, f"{url}/?access_token={token}"


# ------------------------------------------------------------------------------ the widget in a page

# The gate view's parts by name: 'header', 'status', 'A', 'B', ... (each prompt's panel), 'diff B-A', ...
# -> {"text", "html"}. Reads only the view's own elements (.ev-view), in the page or under ``scope``.
_PANELS_JS = r"""
(scope) => {
  const root = scope ? document.querySelector(scope) : document;
  const view = root && root.querySelector('.ev-view');
  const out = {};
  if (!view) return out;
  const put = (key, el) => { if (el && el.innerText.trim()) out[key] = {text: el.innerText.trim(), html: el.innerHTML}; };
  put('header', view.querySelector('.ev-header'));
  put('status', view.querySelector('.ev-status'));
  for (const p of view.querySelectorAll('.ev-panels .ev-panel[data-slot]')) put(p.dataset.slot, p);
  for (const d of view.querySelectorAll('.ev-diffs .ev-diff[data-key]')) put(d.dataset.key, d);
  return out;
}
"""


def panels(page, scope: str | None = None) -> dict[str, dict[str, str]]:
    return page.evaluate(_PANELS_JS, scope)


def wait_panels(
    page, pred: Callable[[dict], bool], timeout: float, what: str, scope: str | None = None
) -> dict[str, dict[str, str]]:
    """Poll the widget's panels until ``pred(panels)`` holds; on timeout fail with what they show."""
    t_end = time.monotonic() + timeout
    got: dict = {}
    while time.monotonic() < t_end:
        try:
            got = panels(page, scope)
        except Exception:  # noqa: BLE001 - page busy re-rendering
            got = {}
        if got and pred(got):
            return got
        time.sleep(0.25)
    shown = {k: v["text"][:300] for k, v in got.items()}
    raise AssertionError(f"the widget did not show {what} within {timeout:.0f} s; it shows {shown}")


def save_screenshot(page, tmp_path: Path, name: str, **kwargs) -> Path:
    """A PNG under the test's folder, copied to ``out/test-artifacts/`` (git ignores ``out/``)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), **kwargs)
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, ARTIFACTS / path.name)
    return path
