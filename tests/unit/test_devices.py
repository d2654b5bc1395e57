"""The one device check (``core.devices.resolve_device``): auto, cpu, cuda, cuda:N and mps are
accepted only where this torch can use them; anything else is one ``DeviceError`` naming what is
available, from the Python API that takes a device (Pipeline, Engram, the tiny model, the hasher,
a capture) and from every command's ``--device``."""

from __future__ import annotations

import pytest
import torch

from engram_viz.apps.report_job import write_report
from engram_viz.cli import main
from engram_viz.core.devices import available_devices, resolve_device
from engram_viz.core.hashing import NgramHasher
from engram_viz.errors import DeviceError
from engram_viz.run.pipeline import Pipeline
from engram_viz.tiny.files import load_tiny_model


@pytest.fixture
def no_cuda(monkeypatch):
    """This torch as a CPU-only build sees it."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize("device", [None, "auto", "AUTO", "cpu", " cpu ", torch.device("cpu")])
def test_the_usable_devices_resolve(device):
    want = "cuda" if torch.cuda.is_available() and device in (None, "auto", "AUTO") else "cpu"
    assert resolve_device(device).type == want


@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("banana", "device 'banana' is not a device name; available here: auto, cpu"),
        ("", "device '' is not a device name"),
        ("cuda:x", "device 'cuda:x' is not a device name"),
        ("cuda", "device 'cuda' is not available in this torch; available here: auto, cpu$"),
        ("cuda:3", "device 'cuda:3' is not available in this torch"),
        (torch.device("cuda"), "device 'cuda' is not available in this torch"),
        ("meta", "device 'meta' is not one engram-viz runs on"),
        ("cpu:1", "device 'cpu:1' is not available"),
        (3, "device must be a name like cpu or cuda, got 3"),
        (True, "device must be a name like cpu or cuda, got True"),
    ],
)
def test_devices_that_cannot_work_are_one_error_naming_what_is_available(no_cuda, device, match):
    assert available_devices()[:2] == ["auto", "cpu"]
    with pytest.raises(DeviceError, match=match):
        resolve_device(device)


def test_a_missing_cuda_index_names_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert available_devices()[:4] == ["auto", "cpu", "cuda", "cuda:0"]
    with pytest.raises(DeviceError, match="'cuda:1' is not available; this machine has 1 CUDA devices"):
        resolve_device("cuda:1")


@pytest.mark.parametrize("device", ["banana", "cuda"])
def test_every_api_that_takes_a_device_checks_it(no_cuda, tiny_config, tmp_path, device):
    with pytest.raises(DeviceError, match="available here: auto, cpu"):
        Pipeline(device=device)
    with pytest.raises(DeviceError, match="available here"):
        load_tiny_model(device=device)
    with pytest.raises(DeviceError, match="available here"):
        NgramHasher(tiny_config, torch.arange(tiny_config.vocab_size), device=device)
    with pytest.raises(DeviceError, match="available here"):
        write_report(tmp_path / "out", device=device)
    assert not (tmp_path / "out").exists()
    pipe = Pipeline(device="cpu")
    with pytest.raises(DeviceError, match="available here"), pipe.registry.capture(["engram.*.gate"], device):
        pass


@pytest.mark.parametrize("command", [["explain", "Alexander", "--position", "1"], ["report", "--quiet"]])
@pytest.mark.parametrize("device", ["banana", "cuda"])
def test_every_command_refuses_a_device_in_one_line(no_cuda, tmp_path, capsys, command, device):
    out = ["--out", str(tmp_path / "out")] if command[0] == "report" else []
    assert main([*command, "--device", device, *out]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert f"engram-viz {command[0]}: error: argument --device: device '{device}'" in err
    assert "available here: auto, cpu" in err
    assert not (tmp_path / "out").exists()
