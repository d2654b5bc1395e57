"""The web server behind ``engram-viz app`` (tornado): the gate view on a page of its own, a
placeholder page while the model loads, one comparison per open tab.

- ``/`` answers at once: while the model loads, a placeholder page that says which step it is on
  (it asks ``/status`` twice a second and reloads itself when the model is ready, or shows why the
  model could not load); then the app page, which loads ``/static/app_host.js`` and
  ``/static/gate_view.js`` (the same ES module notebooks render) from this server.
- ``/ws`` (a websocket) carries one :class:`~engram_viz.apps.widget.PromptComparison` per open tab:
  the view's synced traits go to the page as JSON on open and on each change; the page sends the
  traits it sets. All tabs share one Pipeline (loaded once, by :class:`ModelLoader`).
- Every request needs the token (``?token=``): a wrong or missing one gets 403. The page's URL
  carries the view's prompts (``a``, ``b``, ...), ``layer``, ``stream``, ``view`` and ``theme``, so a
  view can be shared by its URL (with the token).

The model is loaded in a thread after the server listens, so the first page answers within a
second of the server starting; the loader imports the heavy modules (torch, the pipeline, the
widget) itself, by name, so that importing this module stays light.
"""

from __future__ import annotations

import hmac
import importlib
import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import tornado.web
import tornado.websocket

from engram_viz.apps.view_files import SERVED, STATIC
from engram_viz.viz.html_templates import macros

SLOT_PARAMS = "abcdefgh"  # URL parameters of the prompts A..H
_M = macros("app_page.html.j2")


class ModelLoader:
    """Loads the Pipeline in a thread and says where it is: ``step`` (words), ``elapsed`` (s),
    ``ready``, ``error`` (why it could not load). Each step is also printed with ``say``."""

    def __init__(self, checkpoint: str | None, say: Callable[[str], None], streams: str = "auto"):
        self.checkpoint, self.streams = checkpoint, streams
        self.say = say
        self.step = "starting"
        self.ready = False
        self.error: str | None = None
        self.pipeline: Any = None
        self.make_comparison: Callable[..., Any] | None = None
        self.state_keys: list[str] = []  # the gate view's synced traits (not ipywidgets' own, e.g. layout)
        self._t0 = time.monotonic()

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self._t0

    def _at(self, step: str) -> None:
        self.step = step
        self.say(f"engram-viz app: {step} ({self.elapsed:.1f} s)")

    def run(self) -> None:
        """Import, load the model, run the default prompts once (the first forward warms it up)."""
        source = ""
        try:
            self._at("importing torch and the model code")
            widget = importlib.import_module("engram_viz.apps.widget")
            gate_view = importlib.import_module("engram_viz.apps.gate_view")
            pipeline_mod = importlib.import_module("engram_viz.run.pipeline")
            resolve = importlib.import_module("engram_viz.weights.resolve")
            source = resolve.weights_source(self.checkpoint)
            self._at(f"loading the model from {source}")
            self.pipeline = pipeline_mod.Pipeline(self.checkpoint, streams=self.streams)
            self._at("running the first prompts")
            widget.PromptComparison(pipeline=self.pipeline)
            self.make_comparison = widget.PromptComparison
            self.state_keys = sorted(gate_view.GateView.class_own_traits(sync=True))
            self.ready = True
            self._at("ready: open the URL above")
        except Exception as err:  # noqa: BLE001 - shown on the page and printed
            where = f" from {source}" if source else ""
            self.error = f"could not load the model{where}: {err}"
            self.say(f"engram-viz app: {self.error}")

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self.run, name="engram-viz-app-loader", daemon=True)
        thread.start()
        return thread

    def status(self) -> dict:
        return {"ready": self.ready, "step": self.step, "elapsed": round(self.elapsed, 1), "error": self.error}


class _Guarded(tornado.web.RequestHandler):
    """A handler that answers only with the server's token in the URL."""

    def initialize(self, token: str, loader: ModelLoader) -> None:
        self.token, self.loader = token, loader

    def prepare(self) -> None:
        given = self.get_query_argument("token", "")
        if self.token and not hmac.compare_digest(given.encode(), self.token.encode()):
            self.set_status(403)
            self.finish("engram-viz app: this page needs the token that `engram-viz app` printed (...?token=...)\n")

    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")
        self.set_header("X-Content-Type-Options", "nosniff")


class PageHandler(_Guarded):
    def get(self) -> None:
        q = f"?token={self.token}" if self.token else ""
        if self.loader.ready:
            self.finish(str(_M.app_page(q)))
        else:
            self.finish(str(_M.loading_page(q, self.loader.step, self.loader.error or "")))


class StatusHandler(_Guarded):
    def get(self) -> None:
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(self.loader.status()))


class StaticHandler(_Guarded):
    def get(self, name: str) -> None:
        if name not in SERVED:
            raise tornado.web.HTTPError(404)
        kind = "text/css" if name.endswith(".css") else "text/javascript"
        self.set_header("Content-Type", f"{kind}; charset=utf-8")
        self.finish((STATIC / name).read_bytes())


class NoIcon(tornado.web.RequestHandler):
    def get(self) -> None:
        self.set_status(204)


def comparison_options(args: dict[str, list[bytes]], layer_ids: Any = None) -> dict:
    """The comparison's keyword arguments from a page URL's query (prompts ``a``, ``b``, ...,
    ``layer``, ``stream``, ``view``, ``theme``); absent ones keep their defaults."""
    first = {k: v[0].decode("utf-8", "replace") for k, v in args.items() if v}
    prompts = [first[k] for k in SLOT_PARAMS if k in first]
    opts: dict[str, Any] = {}
    if len(prompts) >= 2:
        opts["prompts"] = prompts
    for name in ("layer", "stream", "view", "theme"):
        if name in first:
            opts[name] = int(first[name]) if name == "layer" and first[name].lstrip("-").isdigit() else first[name]
    return opts


class ViewSocket(tornado.websocket.WebSocketHandler):
    """One comparison per open page: its traits to the page as JSON, the page's edits to its traits."""

    def initialize(self, token: str, loader: ModelLoader) -> None:
        self.token, self.loader = token, loader
        self.cmp: Any = None
        self._incoming: dict[str, Any] = {}

    def prepare(self) -> None:
        given = self.get_query_argument("token", "")
        if self.token and not hmac.compare_digest(given.encode(), self.token.encode()):
            raise tornado.web.HTTPError(403)

    def check_origin(self, origin: str) -> bool:
        return super().check_origin(origin)  # same host only

    def open(self) -> None:
        if not self.loader.ready or self.loader.make_comparison is None:
            self.close(1013, "the model is still loading")
            return
        opts = comparison_options(self.request.query_arguments)
        try:
            self.cmp = self.loader.make_comparison(pipeline=self.loader.pipeline, **opts)
        except ValueError as err:  # a bad layer / stream / view / theme in the URL: defaults, and say so
            self.cmp = self.loader.make_comparison(pipeline=self.loader.pipeline)
            self.cmp.widget.status = f"the URL's settings were not used: {err}"
        w = self.cmp.widget
        self._keys = self.loader.state_keys
        w.observe(self._on_trait, names=self._keys)
        self.write_message(json.dumps({"type": "state", "state": {k: getattr(w, k) for k in self._keys}}))

    def _on_trait(self, change: Any) -> None:
        name = change["name"]
        if name in self._incoming and self._incoming[name] == change["new"]:
            return  # the page's own edit: no echo
        self.write_message(json.dumps({"type": "change", "state": {name: change["new"]}}))

    def on_message(self, message: str | bytes) -> None:
        msg = json.loads(message)
        if self.cmp is None or msg.get("type") != "set":
            return
        w = self.cmp.widget
        for name, value in msg.get("state", {}).items():
            if name in self._keys:
                self._incoming = {name: value}
                try:
                    setattr(w, name, value)
                except Exception as err:  # noqa: BLE001 - a bad value from the page: say it, keep serving
                    w.status = f"{name}: {err}"
                finally:
                    self._incoming = {}

    def on_close(self) -> None:
        if self.cmp is not None:
            self.cmp.widget.unobserve(self._on_trait, names=self._keys)
            self.cmp = None


def make_app(token: str, loader: ModelLoader) -> tornado.web.Application:
    """The tornado application: ``/``, ``/status``, ``/static/<file>``, ``/ws``."""
    kw = {"token": token, "loader": loader}
    return tornado.web.Application(
        [
            (r"/", PageHandler, kw),
            (r"/status", StatusHandler, kw),
            (r"/static/([a-z_]+\.(?:js|css))", StaticHandler, kw),
            (r"/ws", ViewSocket, kw),
            (r"/favicon.ico", NoIcon),
        ],
        websocket_max_message_size=16 * 1024 * 1024,
    )


def say(line: str) -> None:
    print(line, file=sys.stdout, flush=True)
