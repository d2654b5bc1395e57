"""The gate view's front end as shipped in the package (``apps/static/``, no CDN, no build step):
the anywidget ES module and its style sheet (``apps.gate_view``), and the host script of the
``engram-viz app`` page (``apps.app_server``). Paths only, so that the app server can name them
without importing anywidget."""

from __future__ import annotations

from pathlib import Path

STATIC = Path(__file__).resolve().parent / "static"
ESM = STATIC / "gate_view.js"
CSS = STATIC / "gate_view.css"
APP_HOST = STATIC / "app_host.js"
SERVED = frozenset(p.name for p in (ESM, CSS, APP_HOST))  # what the app page may load
