"""``engram-viz app`` without a browser: its options, its errors, its server's pages (the
placeholder, the token, the status), the URL settings, and the comparison behaviour the page relies
on. The page itself is tested in Chromium by ``tests/acceptance/test_browser.py``."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import urllib.error
import urllib.request

import pytest
from tornado.httpserver import HTTPServer

from engram_viz.apps.app import _url, bind, exposure_warning, serve
from engram_viz.apps.app_server import ModelLoader, comparison_options, make_app
from engram_viz.cli import build_parser, main


def test_cli_app_options_and_defaults():
    args = build_parser().parse_args(["app"])
    assert (args.checkpoint, args.port, args.host) == (None, 8866, "127.0.0.1")
    args = build_parser().parse_args(["app", "--checkpoint", "ck", "--port", "0", "--host", "localhost"])
    assert (args.checkpoint, args.port, args.host) == ("ck", 0, "localhost")


def test_missing_checkpoint_is_a_clear_error_before_any_server(tmp_path, capsys):
    missing = tmp_path / "no-such-checkpoint"
    assert main(["app", "--checkpoint", str(missing), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err and "no such file or folder" in err


def test_a_folder_that_is_not_a_checkpoint_is_a_clear_error(tmp_path, capsys):
    assert main(["app", "--checkpoint", str(tmp_path), "--port", "0"]) == 2
    assert "not a checkpoint" in capsys.readouterr().err


def test_a_busy_port_is_a_clear_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(ValueError, match=rf"port {port} on 127.0.0.1 is in use"):
            serve(port=port)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "::1", "localhost", "[::1]"])
def test_a_loopback_host_gets_no_warning(host):
    assert exposure_warning(host) is None


@pytest.mark.parametrize(
    ("host", "says"),
    [
        ("0.0.0.0", "every network interface"),
        ("::", "every network interface"),
        ("", "every network interface"),
        ("192.168.1.5", "not a loopback"),
        ("myhost.example.org", "not a loopback"),
    ],
)
def test_a_host_other_machines_reach_is_warned_about(host, says):
    warning = exposure_warning(host)
    assert warning.startswith("engram-viz app: warning: ") and says in warning and "--host 127.0.0.1" in warning


def test_the_cli_warns_before_binding_every_interface(capsys):
    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["app", "--host", "0.0.0.0", "--port", str(port)]) == 2
    warning, error = capsys.readouterr().err.splitlines()
    assert "binds every network interface" in warning and f"port {port} on 0.0.0.0 is in use" in error


def test_bind_port_zero_takes_a_free_loopback_port():
    sockets = bind(0, "127.0.0.1")
    try:
        host, port = sockets[0].getsockname()[:2]
        assert host == "127.0.0.1" and port > 0
    finally:
        for s in sockets:
            s.close()
    with pytest.raises(ValueError, match="expected 0..65535"):
        bind(70000)


def test_url_carries_the_token():
    assert _url("127.0.0.1", 8866, "abc") == "http://127.0.0.1:8866/?token=abc"
    assert _url("::1", 8866, "") == "http://[::1]:8866/"


@pytest.fixture()
def server_of():
    """Serve ``make_app(token, loader)`` on a free loopback port in a thread; yields a function that
    starts one and returns its base URL."""
    loops = []

    def start(token: str, loader: ModelLoader) -> str:
        sockets = bind(0, "127.0.0.1")
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            HTTPServer(make_app(token, loader)).add_sockets(sockets)
            loop.call_soon(ready.set)
            loop.run_forever()

        threading.Thread(target=run, daemon=True).start()
        ready.wait(30)
        loops.append(loop)
        return f"http://127.0.0.1:{sockets[0].getsockname()[1]}/"

    yield start
    for loop in loops:
        loop.call_soon_threadsafe(loop.stop)


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as r:
            return r.status, r.read().decode("utf-8")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8")


def test_the_placeholder_says_the_step_and_the_token_is_needed(server_of):
    lines: list[str] = []
    loader = ModelLoader(None, lines.append)  # not started: the model is still 'loading'
    url = server_of("tok", loader)
    code, page = _get(url + "?token=tok")
    assert code == 200 and "the prompt comparison is loading" in page and 'id="ev-step">starting<' in page
    code, status = _get(url + "status?token=tok")
    assert code == 200 and json.loads(status)["ready"] is False
    for path in ("", "status", "static/gate_view.js", "static/app_host.js"):
        assert _get(url + path)[0] == 403 and _get(url + path + "?token=tik")[0] == 403
    code, js = _get(url + "static/gate_view.js?token=tok")
    assert code == 200 and "export default" in js
    assert _get(url + "static/other.js?token=tok")[0] == 404


def test_a_model_that_does_not_load_is_one_line_on_the_page(server_of, tmp_path):
    lines: list[str] = []
    loader = ModelLoader(str(tmp_path / "gone"), lines.append)
    loader.run()  # here, not in a thread: the steps in order, then why it failed
    assert not loader.ready and loader.error.startswith("could not load the model")
    assert lines[0].startswith("engram-viz app: importing") and "loading the model from" in lines[1]
    assert lines[-1] == f"engram-viz app: {loader.error}"
    _, page = _get(server_of("", loader))
    assert "could not load the model" in page and "gone" in page and "Traceback" not in page


def test_url_settings_become_the_comparisons_options():
    q = {k: [v.encode()] for k, v in {"a": "one", "b": "two", "layer": "3", "stream": "0", "view": "all gates"}.items()}
    assert comparison_options(q) == {"prompts": ["one", "two"], "layer": 3, "stream": "0", "view": "all gates"}
    assert comparison_options({"a": [b"only one"], "theme": [b"dark"]}) == {"theme": "dark"}
    assert comparison_options({}) == {}


# ------------------------------------------------------------- widget behaviour the page relies on


def test_a_lone_surrogate_from_the_browser_shows_a_message_and_can_go_back():
    """A browser can send a lone surrogate; the kernel cannot send it back as UTF-8 JSON. The box
    does not echo it, shows U+FFFD, and prompt A's panel says what is wrong."""
    from engram_viz.apps.widget import PromptComparison

    cmp = PromptComparison()
    view = cmp.widget
    assert view.trait_metadata("prompts", "echo_update") is False
    view.prompts = ["broken paste \ud800 here", cmp.prompts[1]]  # as an update from the front end sets it
    assert "U+D800" in cmp.messages["A"] and "not valid UTF-8" in cmp.messages["A"]
    assert view.prompts[0] == "broken paste \ufffd here"
    json.dumps(view.get_state(), ensure_ascii=False).encode("utf-8")  # sendable again
    assert cmp.messages["B"] is None
    view.prompts = ["fine again", cmp.prompts[1]]
    assert cmp.messages == {"A": None, "B": None}
