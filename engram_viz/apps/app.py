"""The prompt comparison as a standalone web page: ``engram-viz app``.

``serve(checkpoint=None, port=8866, host='127.0.0.1')`` runs a small tornado server
(``apps.app_server``) that shows the gate view (``apps.gate_view``, the same ES module notebooks
render) of a :class:`~engram_viz.apps.widget.PromptComparison` on ``checkpoint``, else
``$ENGRAM_VIZ_CHECKPOINT``, else the embedded default weights. Each browser tab gets its own
comparison; all share one model, loaded once.

**Feedback while loading.** The server listens first and prints its URL; the model then loads in a
thread that prints each step (importing, loading the model from ..., running the first prompts,
ready). Until it is ready the URL serves a placeholder page that says which step it is on and
reloads itself when the view can show; a model that cannot load is one readable line there.

**Shareable views.** The page keeps the prompts (``a``, ``b``, ...), ``layer``, ``stream``, ``view``
and ``theme`` in its URL as they change; opening such a URL (with the token) opens that view.

**Offline.** The page loads only from this server: its HTML, ``gate_view.js``/``.css`` and the page's
host script, shipped in the package; no CDN, no notebook front end.

**Access.** The server binds ``host`` (127.0.0.1 unless told otherwise) and, unless ``token=''``,
answers only requests carrying a random token that is part of the URL it prints (others get 403):
the page runs the model on the server, so other users of a shared machine should not reach it.
``port=0`` takes any free port. Any other host than a loopback one (``0.0.0.0``, ``::``, a LAN
address) prints a warning first: the app is then reachable from other machines (by whoever has
the URL with its token).
"""

from __future__ import annotations

import errno
import ipaddress
import os
import secrets
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path

from engram_viz.apps.app_server import ModelLoader, make_app, say
from engram_viz.config import load_config
from engram_viz.errors import InputError

DEFAULT_PORT = 8866
DEFAULT_HOST = "127.0.0.1"


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
    streams: str = "auto",
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the comparison app until interrupted (Ctrl-C or SIGTERM).

    ``port``: TCP port (0: any free one); ``host``: address to bind (default 127.0.0.1);
    ``token``: None makes a random one, '' serves without a token; ``streams``: the Pipeline's
    (``block0`` on a checkpoint with a vision tower gives uploaded pictures image features); ``on_ready(url)`` is called once
    the server listens (default: print the URL), before the model has loaded. A bad checkpoint or a
    busy port fails at once, before anything starts."""
    from tornado.httpserver import HTTPServer
    from tornado.ioloop import IOLoop

    ckpt = _check_checkpoint(checkpoint)
    warning = exposure_warning(host)
    if warning:
        print(warning, file=sys.stderr, flush=True)
    sockets = bind(port, host)
    bound = int(sockets[0].getsockname()[1])
    token = secrets.token_hex(16) if token is None else str(token)
    loader = ModelLoader(ckpt, say, streams)
    server = HTTPServer(make_app(token, loader))
    server.add_sockets(sockets)
    url = _url(host, bound, token)
    (on_ready or (lambda u: say(f"engram-viz app: serving the prompt comparison at {u}")))(url)
    loop = IOLoop.current()
    if threading.current_thread() is threading.main_thread():  # SIGTERM stops the server as Ctrl-C does
        signal.signal(signal.SIGTERM, lambda *_: loop.add_callback_from_signal(loop.stop))
    loader.start()
    try:
        loop.start()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
        for sock in sockets:
            sock.close()
