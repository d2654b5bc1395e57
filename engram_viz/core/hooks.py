"""HookPoint: a named identity module that intermediate tensors pass through (TransformerLens style).

Every intermediate of the Engram forward flows through one ``HookPoint`` (``engram.L1.gate`` and so
on), so a capture layer can read it and an ablation can replace it. A hook is a callable
``fn(tensor, name) -> tensor | None``: returning ``None`` leaves the tensor as it was, returning a
tensor replaces it (same shape required) for the rest of the forward. With no hook attached the
point returns its input untouched, costing one Python call.

This module is deliberately minimal; capture (``Trace``, ``run_with_cache``) is built on top of it.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]


class HookHandle:
    """Returned by ``HookPoint.add_hook``; ``remove()`` detaches that one hook (idempotent)."""

    def __init__(self, point: HookPoint, fn: HookFn):
        self.point, self.fn = point, fn

    def remove(self) -> None:
        fns = self.point.fns
        for i, f in enumerate(fns):
            if f is self.fn:
                del fns[i]
                return

    def __enter__(self) -> HookHandle:  # noqa: PYI034
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class HookPoint(nn.Module):
    """Identity on a tensor, with a list of hooks run in the order they were added.

    ``name`` is the full hook name (e.g. ``engram.L14.gate``); hooks receive it as their second
    argument so one function can serve many points.
    """

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.fns: list[HookFn] = []

    def add_hook(self, fn: HookFn) -> HookHandle:
        if not callable(fn):
            raise TypeError(f"hook for {self.name} must be callable fn(tensor, name), got {type(fn).__name__}")
        self.fns.append(fn)
        return HookHandle(self, fn)

    def remove_hooks(self) -> None:
        self.fns.clear()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.fns:
            return x
        for fn in list(self.fns):
            out = fn(x, self.name)
            if out is not None:
                if not isinstance(out, torch.Tensor):
                    raise TypeError(f"hook on {self.name} returned {type(out).__name__}; expected a tensor or None")
                if out.shape != x.shape:
                    raise ValueError(
                        f"hook on {self.name} returned shape {list(out.shape)}; expected {list(x.shape)} (same as its input)"
                    )
                x = out
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}, hooks={len(self.fns)}"


def hook_points(module: nn.Module) -> dict[str, HookPoint]:
    """All HookPoints below ``module``, keyed by their hook name (not their attribute path)."""
    return {m.name: m for m in module.modules() if isinstance(m, HookPoint)}
