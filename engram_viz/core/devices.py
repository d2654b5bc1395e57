"""Which torch device a run uses: the one device check every command and API goes through."""

from __future__ import annotations

from typing import Any

import torch

from engram_viz.errors import DeviceError


def default_device() -> torch.device:
    """CUDA when available, else CPU."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def available_devices() -> list[str]:
    """The device names :func:`resolve_device` accepts here: auto, cpu, then cuda, cuda:N and mps
    where this torch can use them."""
    names = ["auto", "cpu"]
    if torch.cuda.is_available():
        names += ["cuda"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        names.append("mps")
    return names


def resolve_device(device: Any) -> torch.device:
    """The one device check: ``None`` or ``"auto"`` -> :func:`default_device`; ``"cpu"``, ``"cuda"``,
    ``"cuda:N"``, ``"mps"`` (or a ``torch.device`` of those) only where available; anything else a
    :class:`DeviceError` naming what this machine has."""
    if device is None or (isinstance(device, str) and device.strip().lower() == "auto"):
        return default_device()
    have = ", ".join(available_devices())
    if not isinstance(device, (str, torch.device)):
        raise DeviceError(f"device must be a name like cpu or cuda, got {device!r}; available here: {have}")
    try:
        dev = torch.device(device.strip().lower() if isinstance(device, str) else device)
    except (RuntimeError, ValueError):
        raise DeviceError(f"device {device!r} is not a device name; available here: {have}") from None
    usable = {"cpu": True, "cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available()}
    if dev.type not in usable:
        raise DeviceError(f"device {str(device)!r} is not one engram-viz runs on; available here: {have}")
    if not usable[dev.type]:
        raise DeviceError(f"device {str(device)!r} is not available in this torch; available here: {have}")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise DeviceError(
            f"device {str(device)!r} is not available; this machine has {torch.cuda.device_count()} CUDA devices; available here: {have}"
        )
    if dev.type == "cpu" and dev.index not in (None, 0):
        raise DeviceError(f"device {str(device)!r} is not available; available here: {have}")
    return dev
