"""Named hook points, TransformerLens style: capture only what is asked for, edit for ablations.

Every Engram layer ``n`` exposes the hook points of :data:`engram_viz.core.hooks.SITES` (the
README's hook table is made from it), ``engram.L{n}.token_mask`` ... ``engram.L{n}.out`` in forward
order.

A :class:`HookRegistry` maps those names to hook points (:class:`engram_viz.core.hooks.HookPoint`: an
identity module whose ``add_hook(fn)`` returns a removable handle); a hook is ``fn(tensor, name) -> tensor | None``
and a returned tensor replaces the activation (that is how a gate is forced).

``registry.run_with_cache(forward, names=[...])`` registers one storing hook per *requested* name
(glob patterns such as ``engram.*.gate`` allowed), runs ``forward()``, removes every hook it added
- also when the forward raises - and returns ``(output, ActivationCache)``. Nothing else is kept:
the cache holds independent copies (optionally moved to the CPU) and is the only reference, so
a loop over many prompts that drops each cache keeps memory flat. Under ``torch.distributed`` only
``capture_rank`` (default 0) stores anything; editing hooks run on every rank so ranks agree.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from typing import Any, cast

import torch

from engram_viz.core.devices import resolve_device
from engram_viz.core.hooks import HOOK_SITES, HookFn, hook_points, parse_hook_name
from engram_viz.errors import InputError, InputTypeError

DEFAULT_NAMES = ("engram.*.hash_ids", "engram.*.token_mask", "engram.*.gate")


def _capture_here(capture_rank: int | None) -> bool:
    """True unless torch.distributed runs and this is not the capturing rank."""
    if capture_rank is None:
        return True
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == capture_rank
    return True


def _copy_out(t: torch.Tensor, device: torch.device | None) -> torch.Tensor:
    """An independent, detached copy (never a view that would keep a module buffer alive)."""
    t = t.detach()
    if device is not None and t.device != device:
        return t.to(device)
    return t.clone()


class ActivationCache(Mapping):
    """Captured activations keyed by hook name.

    Each name holds one tensor per forward call made during the capture; ``cache[name]`` joins
    them along positions (dim 1), so a prefill followed by decode steps reads as one sequence.
    ``cache.chunks(name)`` gives the calls one by one.
    """

    def __init__(self, names: Iterable[str] = (), device: torch.device | None = None, captured: bool = True):
        self._chunks: dict[str, list[torch.Tensor]] = {n: [] for n in names}
        self.device = device
        self.captured = captured  # False on ranks other than the capturing one

    def _store(self, name: str, t: torch.Tensor) -> None:
        self._chunks[name].append(_copy_out(t, self.device))

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self._chunks:
            raise KeyError(f"{name!r} was not captured; captured: {sorted(self._chunks)}")
        parts = self._chunks[name]
        if not parts:
            raise KeyError(f"{name!r} was requested but its hook never ran (was that layer part of the forward?)")
        if len(parts) == 1:
            return parts[0]
        return parts[0] if parts[0].dim() < 2 else torch.cat(parts, dim=1)

    def __iter__(self) -> Iterator[str]:
        return (n for n, parts in self._chunks.items() if parts)

    def __len__(self) -> int:
        return sum(1 for parts in self._chunks.values() if parts)

    def chunks(self, name: str) -> list[torch.Tensor]:
        return list(self._chunks.get(name, []))

    def layer(self, kind: str) -> dict[int, torch.Tensor]:
        """All captured tensors of one kind keyed by layer id, e.g. ``cache.layer('gate')``."""
        out = {}
        for name in self:
            layer, k = parse_hook_name(name)
            if k == kind:
                out[layer] = self[name]
        return dict(sorted(out.items()))

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for parts in self._chunks.values() for t in parts)

    def to(self, device: str | torch.device) -> ActivationCache:
        other = ActivationCache(self._chunks, resolve_device(device), self.captured)
        other._chunks = {n: [t.to(device) for t in parts] for n, parts in self._chunks.items()}
        return other

    def clear(self) -> None:
        for parts in self._chunks.values():
            parts.clear()

    def __repr__(self) -> str:
        body = ", ".join(f"{n}: {list(self[n].shape)} {str(self[n].dtype).removeprefix('torch.')}" for n in self)
        return f"ActivationCache({body})"


def _add(point: Any, fn: HookFn) -> Callable[[], None]:
    """Register ``fn`` on a hook point; returns a function that removes exactly that hook."""
    return point.add_hook(fn).remove


class HookRegistry:
    """Hook points by name, with capture and editing that always clean up after themselves."""

    def __init__(self, points: Mapping[str, Any] | None = None):
        self.points: dict[str, Any] = {}
        self._sorted: list[str] | None = None
        self._resolved: dict[tuple[str, ...], list[str]] = {}
        for name, point in (points or {}).items():
            self.add_point(name, point)

    def add_point(self, name: str, point: Any) -> None:
        parse_hook_name(name)
        if name in self.points:
            raise InputError(f"hook point {name!r} is registered twice")
        self._sorted = None
        self._resolved = {}
        if not hasattr(point, "add_hook"):
            raise InputTypeError(f"hook point {name!r} must be a HookPoint (add_hook), got {type(point).__name__}")
        self.points[name] = point

    @classmethod
    def from_module(cls, module: torch.nn.Module) -> HookRegistry:
        """Every HookPoint below ``module`` under its own hook name."""
        return cls(hook_points(module))

    def update(self, other: HookRegistry) -> None:
        for name, point in other.points.items():
            self.add_point(name, point)

    @property
    def names(self) -> list[str]:
        """Every hook name, by layer then in forward order."""
        names = getattr(self, "_sorted", None)
        if names is None:
            kinds = list(HOOK_SITES)
            names = self._sorted = sorted(
                self.points, key=lambda n: (parse_hook_name(n)[0], kinds.index(parse_hook_name(n)[1]))
            )
        return list(names)

    def resolve(self, names: str | Iterable[str] | None) -> list[str]:
        """Hook names matched by names or glob patterns (``engram.*.gate``, ``engram.L1.*``).

        A pattern that matches nothing is an error (a typo must not silently capture nothing).
        """
        if names is None:
            return []
        if isinstance(names, str):
            names = [names]
        names = tuple(names)
        cache = getattr(self, "_resolved", None)
        if cache is not None and names in cache:
            return list(cache[names])
        out: list[str] = []
        for pattern in names:
            if not isinstance(pattern, str):
                raise InputTypeError(f"hook names must be strings, got {type(pattern).__name__}")
            hits = [n for n in self.names if fnmatch.fnmatchcase(n, pattern)]
            if not hits:
                raise InputError(f"hook name or pattern {pattern!r} matches no hook point; available: {self.names}")
            out.extend(h for h in hits if h not in out)
        if cache is not None:
            cache[names] = out
        return list(out)

    def active(self) -> dict[str, int]:
        """Hooks registered right now, per point (empty when nothing is attached)."""
        return {n: len(p.fns) for n, p in self.points.items() if p.fns}

    @contextmanager
    def hooks(self, edits: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]] | None = None) -> Iterator[None]:
        """Register editing (or observing) hooks ``{name_or_pattern: fn}`` for the ``with`` block."""
        # cast: isinstance narrows a Mapping | Iterable[tuple] union to Mapping[Unknown, Unknown] as well
        items = list(cast(Mapping[str, HookFn], edits).items()) if isinstance(edits, Mapping) else list(edits or [])
        removers: list[Callable[[], None]] = []
        try:
            for pattern, fn in items:
                if not callable(fn):
                    raise InputTypeError(
                        f"hook for {pattern!r} must be callable fn(tensor, name), got {type(fn).__name__}"
                    )
                for name in self.resolve(pattern):
                    removers.append(_add(self.points[name], fn))
            yield
        finally:
            for remove in reversed(removers):
                remove()

    @contextmanager
    def capture(
        self,
        names: str | Iterable[str] | None = DEFAULT_NAMES,
        device: str | torch.device | None = "cpu",
        capture_rank: int | None = 0,
    ) -> Iterator[ActivationCache]:
        """Store copies of the named activations for the ``with`` block into the yielded cache.

        ``device=None`` keeps them where they were computed. On a rank other than ``capture_rank``
        no hook is registered and the cache stays empty (``cache.captured`` is False).
        """
        resolved = self.resolve(names)
        here = _capture_here(capture_rank)
        cache = ActivationCache(resolved if here else (), None if device is None else resolve_device(device), here)
        removers: list[Callable[[], None]] = []
        try:
            if here:
                for name in resolved:

                    def store(t: torch.Tensor, hook: str, _name: str = name) -> None:
                        cache._store(_name, t)

                    removers.append(_add(self.points[name], store))
            yield cache
        finally:
            for remove in reversed(removers):
                remove()

    def run_with_cache(
        self,
        forward: Callable[[], Any],
        names: str | Iterable[str] | None = DEFAULT_NAMES,
        device: str | torch.device | None = "cpu",
        hooks: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]] | None = None,
        capture_rank: int | None = 0,
    ) -> tuple[Any, ActivationCache]:
        """Run ``forward()`` with editing ``hooks`` first and capture of ``names`` after them (so
        the cache sees edited values); every hook is removed before returning."""
        with ExitStack() as stack:
            stack.enter_context(self.hooks(hooks))
            cache = stack.enter_context(self.capture(names, device, capture_rank))
            output = forward()
        return output, cache


# --- ready-made editing hooks -------------------------------------------------------------------


def force_gate(
    value: float | torch.Tensor, streams: Iterable[int] | None = None, positions: torch.Tensor | None = None
) -> HookFn:
    """A hook for ``engram.L{n}.gate`` that sets the gate to ``value``.

    ``streams``: which of the hc streams (default all); ``positions``: a bool ``[B, T]`` (or
    ``[T]``) tensor choosing positions (default all). ``force_gate(0.0)`` removes Engram's
    contribution: the output becomes the input streams exactly.
    """
    stream_idx = None if streams is None else list(streams)

    def fn(gate: torch.Tensor, name: str) -> torch.Tensor:
        new = gate.clone()
        fill = torch.as_tensor(value, dtype=gate.dtype, device=gate.device)
        sel = torch.ones(gate.shape, dtype=torch.bool, device=gate.device)
        if stream_idx is not None:
            smask = torch.zeros(gate.shape[-1], dtype=torch.bool, device=gate.device)
            smask[stream_idx] = True
            sel &= smask
        if positions is not None:
            pos = positions.to(gate.device, torch.bool)
            sel &= pos.expand(gate.shape[:-1]).unsqueeze(-1) if pos.dim() <= 2 else pos
        return torch.where(sel, fill.expand(gate.shape), new)

    return fn


def zero_ablate(t: torch.Tensor, name: str) -> torch.Tensor:
    """A hook that replaces any activation by zeros of the same shape and dtype."""
    return torch.zeros_like(t)
