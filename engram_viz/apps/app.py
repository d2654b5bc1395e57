"""The prompt-comparison app as a standalone web page: ``engram-viz app``.

``serve(checkpoint=None, port=8866, host='127.0.0.1')`` runs a Voila server that renders one small
notebook: it builds :class:`engram_viz.apps.widget.PromptComparison` (on ``checkpoint``, else
``$ENGRAM_VIZ_CHECKPOINT``, else the embedded default weights) and shows its ipywidgets tree. Each
browser tab gets its own kernel (Voila starts one per page and shuts it down when the tab closes);
the code cell is not shown and the page has no notebook controls.

**Offline.** Everything the page loads comes from the server itself: Voila's bundle (which carries
the icon font the widget buttons use), the ipywidgets front end from the installed
``@jupyter-widgets/jupyterlab-manager`` labextension, and the widget's own views, which are HTML
widgets with inline CSS (no plotly FigureWidget, no script tags). Voila's stock ``lab`` template
links two Font Awesome style sheets from a CDN; the page template written here (``engram-viz``,
based on ``lab``) drops every ``<link>`` to another host, so the page makes no request beyond the
server that sent it. ``tests/acceptance/test_browser.py`` checks that in Chromium.

**Access.** The server binds ``host`` (127.0.0.1 unless told otherwise) and, unless ``token=''``,
requires a random token that is part of the URL it prints: a Voila page runs a kernel, so other
users of a shared machine should not reach it; its kernels talk to it over unix sockets in a
private folder, not TCP ports. ``port=0`` takes any free port. Any other host than a loopback one
(``0.0.0.0``, ``::``, a LAN address) prints a warning first: the page and its kernels are then
reachable from other machines (by whoever has the URL with its token).

What the server needs on disk (the notebook, the page template and a kernel spec that runs this
interpreter) is written to a temporary folder that is removed when the server stops.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import os
import secrets
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engram_viz.apps.widget import app as make_app
from engram_viz.config import load_config
from engram_viz.errors import InputError
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.comparison_html import message_html
from engram_viz.weights.resolve import weights_source

DEFAULT_PORT = 8866
DEFAULT_HOST = "127.0.0.1"
TEMPLATE = "engram-viz"
KERNEL = "engram-viz-app"
NOTEBOOK = "engram-viz prompt comparison.ipynb"
# the front-end extensions the page loads: the ipywidgets manager and Voila's bridge to it (the one
# for the installed ipywidgets major version is kept by Voila itself)
LABEXTENSIONS = (
    "@jupyter-widgets/jupyterlab-manager",
    "@voila-dashboards/widgets-manager8",
    "@voila-dashboards/widgets-manager7",
)

# The page template: Voila's 'lab' page minus the style sheets it links from a CDN (the same icon
# font is bundled in voila-style.js, which the page loads from the server).
_TEMPLATE_CONF = {"base_template": "lab"}
_TEMPLATE_INDEX = """\
{%- extends 'voila/templates/lab/index.html.j2' -%}
{#- engram-viz: the lab page with no <link> to another host (the page must work offline) -#}
{%- block notebook_css -%}
{%- for line in super().splitlines() if not ('<link' in line and ('://' in line or '="//' in line)) %}
{{ line }}
{%- endfor %}
{%- endblock notebook_css -%}
"""

_CELL = """\
from IPython.display import display

from engram_viz.apps.app import build_widget

display(build_widget(checkpoint={checkpoint!r}))
"""


def build_widget(checkpoint: str | None = None, **kwargs: Any) -> Any:
    """The app's ipywidgets tree (``PromptComparison(...).widget``), or, when the model cannot be
    loaded, an HTML widget that says why (a page with a readable message, not a traceback)."""
    import ipywidgets as W

    try:
        return make_app(pipeline=Pipeline(checkpoint), **kwargs).widget
    except Exception as err:  # noqa: BLE001 - shown on the page
        source = weights_source(checkpoint)
        return W.HTML(message_html(f"could not load the model from {source}: {err}", title="engram-viz"))


def write_app_files(root: str | Path, checkpoint: str | None = None) -> Path:
    """Write what the server needs under ``root``: ``<root>/app/<NOTEBOOK>`` (returned), the page
    template ``<root>/jupyter/voila/templates/engram-viz/`` and a kernel spec
    ``<root>/jupyter/kernels/engram-viz-app/`` that runs this interpreter (``sys.executable``),
    so the page's kernel imports the same engram_viz whatever other kernels are installed."""
    root = Path(root)
    tpl = root / "jupyter" / "voila" / "templates" / TEMPLATE
    tpl.mkdir(parents=True, exist_ok=True)
    (tpl / "conf.json").write_text(json.dumps(_TEMPLATE_CONF), encoding="utf-8")
    (tpl / "index.html.j2").write_text(_TEMPLATE_INDEX, encoding="utf-8")
    ker = root / "jupyter" / "kernels" / KERNEL
    ker.mkdir(parents=True, exist_ok=True)
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "engram-viz app",
        "language": "python",
        "metadata": {"debugger": False},
    }
    (ker / "kernel.json").write_text(json.dumps(spec, indent=1), encoding="utf-8")
    nb_dir = root / "app"
    nb_dir.mkdir(parents=True, exist_ok=True)
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "id": "engram-viz-app",
                "metadata": {},
                "outputs": [],
                "source": _CELL.format(checkpoint=checkpoint),
            }
        ],
        "metadata": {
            "kernelspec": {"display_name": "engram-viz app", "language": "python", "name": KERNEL},
            "language_info": {"name": "python"},
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path = nb_dir / NOTEBOOK
    path.write_text(json.dumps(nb, indent=1), encoding="utf-8")
    return path


def _check_checkpoint(checkpoint: str | os.PathLike | None) -> str | None:
    """The checkpoint as an absolute path, or a clear error before any server starts."""
    if checkpoint is None:
        return None
    path = Path(checkpoint).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"--checkpoint {checkpoint}: no such file or folder; expected a checkpoint folder")
    try:
        load_config(str(path))
    except Exception as err:  # noqa: BLE001 - re-raised with the input named
        raise InputError(f"--checkpoint {checkpoint}: not a checkpoint this suite reads ({err})") from None
    return str(path.resolve())


def _url(host: str, port: int, token: str) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def exposure_warning(host: str) -> str | None:
    """A warning when ``host`` is not a loopback address (None for 127.0.0.1, ::1, localhost)."""
    name = host.strip().strip("[]")
    if name.lower() == "localhost":
        return None
    try:
        addr = ipaddress.ip_address(name)
    except ValueError:
        addr = None
    if addr is not None and addr.is_loopback:
        return None
    if name == "" or (addr is not None and addr.is_unspecified):
        where = f"--host {host or repr(host)} binds every network interface of this machine"
    else:
        where = f"--host {host} is not a loopback address"
    return (
        f"engram-viz app: warning: {where}: other machines can reach the app (and run code in its "
        "kernels) with the URL and its token; use --host 127.0.0.1 to keep it on this machine"
    )


def bind(port: int = DEFAULT_PORT, host: str = DEFAULT_HOST) -> list:
    """Listening sockets on ``host:port`` (port 0: any free one), or a clear error naming them."""
    from tornado.netutil import bind_sockets

    if not 0 <= int(port) <= 65535:
        raise InputError(f"--port {port}: expected 0..65535 (0: any free port)")
    try:
        return bind_sockets(int(port), host)
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise InputError(f"port {port} on {host} is in use; pass --port N (or --port 0: any free port)") from None
        raise InputError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None


def serve(
    checkpoint: str | os.PathLike | None = None,
    *,
    port: int = DEFAULT_PORT,
    host: str = DEFAULT_HOST,
    token: str | None = None,
    on_ready: Callable[[str], None] | None = None,
    log_level: str = "ERROR",
) -> None:
    """Serve the comparison app until interrupted (Ctrl-C or SIGTERM), then stop every kernel it
    started and remove its temporary files.

    ``port``: TCP port (0: any free one); ``host``: address to bind (default 127.0.0.1);
    ``token``: None makes a random one, '' serves without a token; ``on_ready(url)`` is called once
    the server listens (default: print the URL). A bad checkpoint or a busy port fails at once,
    before anything starts."""
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop
    from traitlets.config import Config
    from voila.app import Voila

    ckpt = _check_checkpoint(checkpoint)
    warning = exposure_warning(host)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    sockets = bind(port, host)
    bound = int(sockets[0].getsockname()[1])
    token = secrets.token_hex(16) if token is None else str(token)
    announce = on_ready or (lambda u: print(f"engram-viz app: serving the prompt comparison at {u}", flush=True))

    class _AppServer(Voila):
        """Voila serving on the sockets bound above (no silent retries on other ports)."""

        def listen(self) -> None:
            self.port = bound
            HTTPServer(self.app).add_sockets(sockets)
            announce(_url(host, bound, token))
            self.ioloop = IOLoop.current()
            try:
                self.ioloop.start()
            except KeyboardInterrupt:
                pass
            finally:
                self.stop()

    root = Path(tempfile.mkdtemp(prefix="engram-viz-app-"))
    old_path = os.environ.get("JUPYTER_PATH")
    try:
        notebook = write_app_files(root, ckpt)
        # the page template and the kernel spec are found through JUPYTER_PATH (first entry wins)
        os.environ["JUPYTER_PATH"] = os.pathsep.join([str(root / "jupyter")] + ([old_path] if old_path else []))
        config = Config()
        config.Voila.ip = host
        config.Voila.port = bound
        config.Voila.token = token
        config.Voila.open_browser = False
        config.Voila.log_level = log_level
        config.KernelManager.transport = "ipc"  # kernels talk over unix sockets in Voila's private folder, not TCP
        config.VoilaConfiguration.template = TEMPLATE
        config.VoilaConfiguration.theme = "light"
        config.VoilaConfiguration.file_allowlist = []  # the page serves no files of its folder
        # the page needs only the ipywidgets front end; other installed labextensions (jupytext,
        # plotly, ...) may be built for a newer JupyterLab than Voila's and only log errors
        config.VoilaConfiguration.extension_allowlist = list(LABEXTENSIONS)
        server = _AppServer(config=config)
        server.initialize([str(notebook)])
        server.start()
    finally:
        for sock in sockets:
            sock.close()
        if old_path is None:
            os.environ.pop("JUPYTER_PATH", None)
        else:
            os.environ["JUPYTER_PATH"] = old_path
        shutil.rmtree(root, ignore_errors=True)
