"""HookPoint: a named identity module that intermediate tensors pass through (TransformerLens style).

Every intermediate of the Engram forward flows through one ``HookPoint`` (``engram.L1.gate`` and so
on), so a capture layer can read it and an ablation can replace it. A hook is a callable
``fn(tensor, name) -> tensor | None``: returning ``None`` leaves the tensor as it was, returning a
tensor replaces it (same shape required) for the rest of the forward. With no hook attached the
point returns its input untouched, costing one Python call.

:data:`SITES` is the one table of hook sites (name, shape, dtype, meaning) in forward order: the
Engram module's hook points, the capture layer's names and the README's hook table are all made
from it. Capture (``Trace``, ``run_with_cache``) is built on top of this module.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from engram_viz.errors import InputError, InputTypeError

HookFn = Callable[[torch.Tensor, str], "torch.Tensor | None"]


@dataclass(frozen=True)
class HookSite:
    """One hook point of every Engram layer: ``engram.L{n}.{name}``."""

    name: str
    shape: str
    dtype: str
    meaning: str


# The sites in forward order; hc = 4 streams and dim = 5120 on V4.1-Flash.
SITES = (
    HookSite(
        "streams",
        "[B, T, hc, dim]",
        "x.dtype",
        "the residual streams the layer reads (its input `x`, from the stream source)",
    ),
    HookSite(
        "token_mask", "[B, T]", "bool", "False at image positions (gate shut, hashes blocked); all True without a mask"
    ),
    HookSite(
        "hash_ids",
        "[B, T, 24]",
        "int64",
        "table row ids of the 24 n-gram heads (orders 2-4 x 8 heads), layer offsets included",
    ),
    HookSite("rows", "[B, T, 24, head_dim]", "bf16", "the gathered table rows, dequantised (fp8 x e8m0 scale)"),
    HookSite(
        "key",
        "[B, T, hc, dim]",
        "fp32",
        "one key per stream, first `hc x dim` outputs of `wkv` (large: ask for it explicitly)",
    ),
    HookSite(
        "value", "[B, T, dim]", "fp32", "the value shared by the streams, last `dim` outputs of `wkv` (bf16-rounded)"
    ),
    HookSite(
        "dot", "[B, T, hc]", "fp32", "`sum(h * q_weight * k_weight * key) * rstd / sqrt(dim)`, before the signed sqrt"
    ),
    HookSite(
        "gate", "[B, T, hc]", "fp32", "`sigmoid(sign(dot) * sqrt(max(abs(dot), 1e-6)))`; 0 where `token_mask` is False"
    ),
    HookSite("out", "[B, T, hc, dim]", "x.dtype", "the streams after the gated value is added: `h + gate * value`"),
)
HOOK_SITES = tuple(site.name for site in SITES)
_NAME_RE = re.compile(r"^engram\.L(\d+)\.(\w+)$")


def hook_name(layer_id: int, site: str) -> str:
    """``engram.L{layer_id}.{site}``; raises on an unknown site."""
    if site not in HOOK_SITES:
        raise InputError(f"unknown hook kind {site!r}; expected one of {list(HOOK_SITES)}")
    return f"engram.L{int(layer_id)}.{site}"


def parse_hook_name(name: str) -> tuple[int, str]:
    """``engram.L14.gate`` -> ``(14, 'gate')``."""
    m = _NAME_RE.match(name)
    if not m or m.group(2) not in HOOK_SITES:
        raise InputError(f"{name!r} is not a hook name; expected engram.L<layer>.<{'|'.join(HOOK_SITES)}>")
    return int(m.group(1)), m.group(2)


def hook_table_markdown() -> str:
    """The README's hook table, made from :data:`SITES`."""
    lines = ["| name | shape | meaning |", "| --- | --- | --- |"]
    for s in SITES:
        lines.append(f"| `engram.L{{n}}.{s.name}` | `{s.shape}` {s.dtype} | {s.meaning} |")
    return "\n".join(lines)


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
            raise InputTypeError(f"hook for {self.name} must be callable fn(tensor, name), got {type(fn).__name__}")
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
                    raise InputTypeError(
                        f"hook on {self.name} returned {type(out).__name__}; expected a tensor or None"
                    )
                if out.shape != x.shape:
                    raise InputError(
                        f"hook on {self.name} returned shape {list(out.shape)}; expected {list(x.shape)} (same as its input)"
                    )
                x = out
        return x

    def extra_repr(self) -> str:
        return f"name={self.name!r}, hooks={len(self.fns)}"


def hook_points(module: nn.Module) -> dict[str, HookPoint]:
    """All HookPoints below ``module``, keyed by their hook name (not their attribute path)."""
    return {m.name: m for m in module.modules() if isinstance(m, HookPoint)}
