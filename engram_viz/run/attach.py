"""Attach the suite's hook names to a model it did not build (nnsight style: wrap, keep what is asked).

Any ``torch.nn.Module`` tree works whose Engram submodules carry the reference attribute names
(:data:`ENGRAM_ATTRS`: ``embed``, ``wkv``, ``q_weight``, ``k_weight``, ``hc_mult``, ``dim``, ``eps``,
``layer_id``; ``clamp_value`` optional, default 1e-6) and whose ``forward(x, hash_ids, token_mask=None)``
is the reference ``Engram.forward`` - for example DeepSeek-V4.1-Flash's ``inference/model.py``.

How: a submodule that is already the suite's :class:`engram_viz.core.engram.Engram` keeps its own hook
points. Any other one gets eight :class:`HookPoint` objects held *outside* its module tree (its
``state_dict``, ``named_modules`` and parameters are untouched) and an instance-level ``forward``
that, only while at least one of its hooks is attached, runs the reference formula step by step
through those points - calling the module's own ``embed`` and ``wkv`` so a row-sharded table's
all-reduce and an fp8 GEMM run exactly as in the model. With no hook attached the original forward
runs. :meth:`AttachedModel.detach` (or leaving the ``with`` block) restores everything.

Under ``torchrun`` with world_size > 1 every rank must attach and run (the embedding all-reduces);
only ``capture_rank`` (default 0) stores activations and builds the Trace, the other ranks get
``None``. Editing hooks apply on every rank, so the ranks stay consistent.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Self

import torch
from torch import nn

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.engram import CLAMP_VALUE, Engram, engram_steps
from engram_viz.core.hooks import HOOK_SITES, HookFn, HookPoint, hook_name
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import EngramVizError
from engram_viz.run.capture import DEFAULT_NAMES, ActivationCache, HookRegistry, _capture_here
from engram_viz.run.trace import Trace, trace_from_cache

ENGRAM_ATTRS = ("embed", "wkv", "q_weight", "k_weight", "hc_mult", "dim", "eps", "layer_id")


class AttachError(EngramVizError, ValueError):
    """The model has no Engram-like submodules, or they are ambiguous."""


def is_engram_like(module: nn.Module) -> bool:
    """True when ``module`` has every reference attribute of an Engram layer."""
    return all(hasattr(module, a) for a in ENGRAM_ATTRS)


def find_engram_modules(model: nn.Module) -> dict[int, tuple[str, nn.Module]]:
    """``{layer_id: (path, module)}`` of every Engram-like submodule (``model`` itself included)."""
    found: dict[int, tuple[str, nn.Module]] = {}
    for path, module in model.named_modules():
        if not is_engram_like(module):
            continue
        layer = int(module.layer_id)
        if layer in found:
            raise AttachError(f"two Engram-like submodules claim layer_id {layer}: {found[layer][0]!r} and {path!r}")
        found[layer] = (path, module)
    if not found:
        raise AttachError(
            f"{type(model).__name__} has no Engram-like submodule; expected modules with the attributes {ENGRAM_ATTRS}"
        )
    return dict(sorted(found.items()))


def _instrumented_forward(module: nn.Module, points: dict[str, HookPoint], original: Callable) -> Callable:
    """The module's forward as :func:`engram_steps` with ``points`` after every step (only while hooked)."""

    def forward(self: nn.Module, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None = None):
        if not any(p.fns for p in points.values()):
            return original(x, hash_ids, token_mask)
        if token_mask is None:  # the reference skips the mask; an all-True mask is the same arithmetic
            token_mask = torch.ones(x.shape[:2], dtype=torch.bool, device=x.device)
        return engram_steps(
            x,
            hash_ids,
            token_mask,
            gather=self.embed,
            wkv=self.wkv,
            q_weight=self.q_weight,
            k_weight=self.k_weight,
            eps=self.eps,
            clamp=getattr(self, "clamp_value", CLAMP_VALUE),
            hook=lambda site, t: points[site](t),
        )

    return types.MethodType(forward, module)


def _default_call(model: nn.Module, input_ids: torch.Tensor, token_types: torch.Tensor | None) -> Any:
    """``model(input_ids, token_types=...)`` (reference) or ``model(input_ids, token_mask=...)``."""
    if token_types is None:
        return model(input_ids)
    params = inspect.signature(model.forward).parameters
    if "token_types" in params:
        return model(input_ids, token_types=token_types)
    if "token_mask" in params:
        return model(input_ids, token_mask=token_types < 0)
    raise AttachError(
        f"{type(model).__name__}.forward takes neither token_types nor token_mask; pass call=... to run image prompts"
    )


class AttachedModel:
    """A model with the suite's hook names attached; use as a context manager or call ``detach()``.

    ``config`` (preset, path or :class:`EngramConfig`) and ``tokenizer`` are only needed to build
    a :class:`Trace` (compressed ids, text pieces); ``model_label`` / ``streams_label`` are written
    into every Trace.
    """

    def __init__(
        self,
        model: nn.Module,
        config: EngramConfig | str | None = None,
        tokenizer: Any = None,
        model_label: str | None = None,
        streams_label: str = "the model's own residual streams (attached run)",
    ):
        self.model = model
        self.config = load_config(config) if config is not None else None
        self._tokenizer = tokenizer
        self.model_label = model_label or f"{type(model).__name__} (attached)"
        self.streams_label = streams_label
        self.engrams = find_engram_modules(model)
        self.registry = HookRegistry()
        self._restore: list[Callable[[], None]] = []
        try:
            for layer, (_, module) in self.engrams.items():
                if isinstance(module, Engram):
                    self.registry.update(HookRegistry(module.hook_points()))
                    continue
                points = {kind: HookPoint(hook_name(layer, kind)) for kind in HOOK_SITES}
                for point in points.values():
                    self.registry.add_point(point.name, point)
                original = module.forward
                had_own = "forward" in module.__dict__
                module.forward = _instrumented_forward(module, points, original)
                self._restore.append(self._restorer(module, original, had_own))
        except BaseException:
            self.detach()
            raise

    @staticmethod
    def _restorer(module: nn.Module, original: Callable, had_own: bool) -> Callable[[], None]:
        def restore() -> None:
            if had_own:
                module.forward = original
            else:
                module.__dict__.pop("forward", None)

        return restore

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.engrams)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(self.config or "v41-flash")
        return self._tokenizer

    def detach(self) -> None:
        """Restore every patched forward and drop all hooks added through this object."""
        while self._restore:
            self._restore.pop()()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def hooks(self, edits: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]] | None) -> Any:
        """Editing hooks for a ``with`` block (e.g. ``{'engram.L14.gate': force_gate(0.0)}``)."""
        return self.registry.hooks(edits)

    def capture(
        self, names: str | Iterable[str] | None = DEFAULT_NAMES, device: str | None = "cpu", capture_rank: int = 0
    ):
        """Capture for a ``with`` block, e.g. around a whole ``generate()`` loop (chunks join along T)."""
        return self.registry.capture(names, device, capture_rank)

    def run_with_cache(
        self,
        *args: Any,
        names: str | Iterable[str] | None = DEFAULT_NAMES,
        device: str | None = "cpu",
        hooks: Mapping[str, HookFn] | None = None,
        capture_rank: int = 0,
        **kwargs: Any,
    ) -> tuple[Any, ActivationCache]:
        """``model(*args, **kwargs)`` with capture of ``names``: returns ``(output, cache)``."""
        return self.registry.run_with_cache(lambda: self.model(*args, **kwargs), names, device, hooks, capture_rank)

    def run(
        self,
        input_ids: torch.Tensor,
        token_types: torch.Tensor | None = None,
        *,
        names: str | Iterable[str] | None = (),
        hooks: Mapping[str, HookFn] | None = None,
        lengths: torch.Tensor | None = None,
        prompt_ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
        texts: Sequence[str] | None = None,
        call: Callable[[nn.Module, torch.Tensor, torch.Tensor | None], Any] | None = None,
        capture_rank: int = 0,
    ) -> Trace | None:
        """One forward of the model on ``input_ids [B, T]`` -> :class:`Trace` (``None`` on ranks other
        than ``capture_rank``). Row ids, token mask and gates are always captured; ``names`` adds more.
        ``call(model, input_ids, token_types)`` runs the model (default: reference signature)."""
        wanted = list(DEFAULT_NAMES) + ([names] if isinstance(names, str) else list(names or []))
        call = call or _default_call
        with torch.no_grad():
            _, cache = self.registry.run_with_cache(
                lambda: call(self.model, input_ids, token_types), wanted, "cpu", hooks, capture_rank
            )
        if not cache.captured or not _capture_here(capture_rank):
            return None
        return trace_from_cache(
            cache,
            input_ids,
            layer_ids=self.layer_ids,
            tokenizer=self.tokenizer,
            model_label=self.model_label,
            streams_label=self.streams_label,
            token_types=token_types,
            lengths=lengths,
            prompt_ids=prompt_ids,
            categories=categories,
            texts=texts,
            meta={"source": "attach"},
        )


def attach(model: nn.Module, config: EngramConfig | str | None = None, **kwargs: Any) -> AttachedModel:
    """Attach the suite's hook names to ``model``; see :class:`AttachedModel`."""
    return AttachedModel(model, config, **kwargs)
