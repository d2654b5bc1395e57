"""``engram-viz app`` without a browser: its files, its page template, its errors, and the widget
behaviour the page relies on. The page itself is tested in Chromium by ``tests/acceptance/test_browser.py``."""

from __future__ import annotations

import json
import socket
import sys

import jinja2
import nbformat
import pytest

from engram_viz.apps.app import (
    KERNEL,
    LABEXTENSIONS,
    TEMPLATE,
    _url,
    bind,
    build_widget,
    exposure_warning,
    serve,
    write_app_files,
)
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


def test_app_files_notebook_kernel_and_template(tmp_path):
    nb_path = write_app_files(tmp_path, "/some/checkpoint")
    nb = nbformat.read(nb_path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == KERNEL
    (cell,) = nb.cells
    assert "build_widget(checkpoint='/some/checkpoint')" in cell.source
    assert "build_widget(checkpoint=None)" in nbformat.read(write_app_files(tmp_path / "x"), 4).cells[0].source
    spec = json.loads((tmp_path / "jupyter" / "kernels" / KERNEL / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable  # the page's kernel imports this engram_viz
    conf = json.loads((tmp_path / "jupyter" / "voila" / "templates" / TEMPLATE / "conf.json").read_text())
    assert conf == {"base_template": "lab"}
    assert "@jupyter-widgets/jupyterlab-manager" in LABEXTENSIONS


def test_template_drops_links_to_other_hosts(tmp_path):
    """The page template keeps the parent's style block but no <link> to another host."""
    write_app_files(tmp_path)
    tpl_dir = tmp_path / "jupyter" / "voila" / "templates" / TEMPLATE
    parent = (
        "<head>{% block notebook_css %}"
        '<script src="voila-style.js"></script>\n'
        '  <link rel="stylesheet" href="https://cdn.example.org/all.min.css" type="text/css" />\n'
        '  <link rel="stylesheet" href="//cdn.example.org/v4-shims.min.css" type="text/css" />\n'
        '<link rel="stylesheet" href="static/local.css" />\n'
        "<style>.x{}</style>{% endblock notebook_css %}</head>"
    )
    env = jinja2.Environment(
        loader=jinja2.ChoiceLoader(
            [
                jinja2.FileSystemLoader(str(tpl_dir)),
                jinja2.DictLoader({"voila/templates/lab/index.html.j2": parent}),
            ]
        )
    )
    out = env.get_template("index.html.j2").render()
    assert "cdn.example.org" not in out
    for kept in ("voila-style.js", "static/local.css", "<style>.x{}</style>"):
        assert kept in out


def test_build_widget_says_why_a_model_does_not_load(tmp_path):
    import ipywidgets as W

    w = build_widget(checkpoint=str(tmp_path / "gone"))
    assert isinstance(w, W.HTML)
    assert "could not load the model" in w.value and "gone" in w.value


# ------------------------------------------------------------- widget behaviour the page relies on


def test_image_target_dropdown_always_has_a_slot():
    from engram_viz.apps.widget import PromptComparison

    cmp = PromptComparison()
    assert cmp.controls.image_target.value == "A"  # the page's 'insert image' button uses it as is
    cmp.add_prompt("third")
    cmp.controls.image_target.value = "C"
    cmp.set_prompts("one", "two")
    assert cmp.controls.image_target.value == "A"


def test_a_lone_surrogate_from_the_browser_shows_a_message_and_can_go_back():
    """A browser can send a lone surrogate; the kernel cannot send it back as UTF-8 JSON. The box
    does not echo it, shows U+FFFD, and prompt A's panel says what is wrong."""
    from engram_viz.apps.widget import PromptComparison

    cmp = PromptComparison()
    box = cmp.controls.boxes[0]
    assert box.trait_metadata("value", "echo_update") is False
    box.value = "broken paste \ud800 here"  # as a comm update from the front end sets it
    assert "U+D800" in cmp.messages["A"] and "not valid UTF-8" in cmp.messages["A"]
    assert box.value == "broken paste \ufffd here"
    json.dumps(box.get_state(), ensure_ascii=False).encode("utf-8")  # sendable again
    assert cmp.messages["B"] is None
    box.value = "fine again"
    assert cmp.messages == {"A": None, "B": None}
