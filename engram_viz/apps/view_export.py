"""A prompt comparison's view as one file, for the view's export button and ``PromptComparison.export``.

``export_view(comparison, fmt)`` returns ``{name, mime, data}`` (data base64, what the view's
``export_file`` trait carries to the browser, which saves it):

- ``html``: a standalone page (inline CSS, no script, no network): the header, every prompt's
  panel and difference panel, and the explained token's rows and ablation when there is one;
- ``png`` / ``pdf``: the token-coloured text of every prompt that runs, at the view's layer and
  stream, as the paper figure (``viz.tokens.TokenView``, saved by ``viz.export.save_matplotlib``);
- ``json``: the view's settings (prompts, layer, stream, view, theme, selected token, ablated row)
  and which model made it, enough to open the same view again.
"""

from __future__ import annotations

import base64
import json
import re
import tempfile
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from markupsafe import Markup

from engram_viz.apps.gate_view import EXPORT_FORMATS
from engram_viz.errors import InputError
from engram_viz.viz.export import check_offline_html, save_matplotlib
from engram_viz.viz.html_templates import render
from engram_viz.viz.style import get_theme

MIME = {"html": "text/html", "png": "image/png", "pdf": "application/pdf", "json": "application/json"}


def _version() -> str:
    try:
        return version("engram-viz")
    except PackageNotFoundError:
        return "unknown"


def _stem(comparison: Any) -> str:
    label = re.sub(r"[^A-Za-z0-9]+", "-", str(comparison.pipeline.model_label)).strip("-")[:40] or "model"
    return f"engram-viz-{label}-layer{comparison.layer}-{comparison.stream}"


def view_page(comparison: Any) -> str:
    """The whole view as one standalone HTML page (module docstring)."""
    e = comparison.explainer
    body = comparison.html + ("\n" + e.rows_html + "\n" + e.diff_html if e.position is not None else "")
    page = str(render("tokens_page.html.j2", title=_stem(comparison), t=get_theme(comparison.theme), body=Markup(body)))
    check_offline_html(page, "the exported view")
    return page


def view_settings(comparison: Any) -> dict:
    """The view's settings and the model that made it (what the JSON export holds)."""
    return {
        "engram_viz": _version(),
        "model": str(comparison.pipeline.model_label),
        "layer_ids": list(comparison.layer_ids),
        **comparison.widget.settings(),
    }


def _figure_bytes(comparison: Any, fmt: str) -> bytes:
    view = comparison.figures.get("tokens")
    if view is None:
        raise InputError(f"no prompt runs, so there is no figure to export as {fmt}; fix a prompt first")
    with tempfile.TemporaryDirectory(prefix="engram-viz-export-") as tmp:
        path = save_matplotlib(view.figure(), Path(tmp) / f"view.{fmt}", dpi=200)
        return path.read_bytes()


def export_view(comparison: Any, fmt: str) -> dict[str, str]:
    """``{name, mime, data}`` of the view as ``fmt`` (one of :data:`EXPORT_FORMATS`), data base64."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"export format must be one of {list(EXPORT_FORMATS)}, got {fmt!r}")
    if fmt == "html":
        data = view_page(comparison).encode("utf-8")
    elif fmt == "json":
        data = json.dumps(view_settings(comparison), indent=1, ensure_ascii=False).encode("utf-8")
    else:
        data = _figure_bytes(comparison, fmt)
    return {"name": f"{_stem(comparison)}.{fmt}", "mime": MIME[fmt], "data": base64.b64encode(data).decode("ascii")}


def answer_export(comparison: Any, request: dict) -> dict:
    """What the view's ``export_file`` gets for ``request`` ({format, nonce}): the file, or
    ``{error}`` (a readable line) when there is nothing to export; with the request's nonce."""
    try:
        answer: dict = export_view(comparison, str(request.get("format")))
    except InputError as err:
        answer = {"error": str(err)}
    return answer | {"nonce": request.get("nonce")}
