"""Attach the suite's hook names to a model it did not build (nnsight style: wrap, keep what is asked).

Any ``torch.nn.Module`` tree works whose Engram submodules carry the reference attribute names
(:data:`ENGRAM_ATTRS`: ``embed``, ``wkv``, ``q_weight``, ``k_weight``, ``hc_mult``, ``dim``, ``eps``,
``layer_id``; ``clamp_value`` optional, default 1e-6) and whose ``forward(x, hash_ids, token_mask=None)``
is the reference ``Engram.forward`` - for example DeepSeek-V4.1-Flash's ``inference/model.py``.

How: a submodule that is already the suite's :class:`engram_viz.core.engram.Engram` keeps its own hook
points. Any other one gets one :class:`HookPoint` per site of ``core.hooks.SITES`` (its input streams
first), held *outside* its module tree (its ``state_dict``, ``named_modules`` and parameters are
untouched) and an instance-level ``forward``
that, only while at least one of its hooks is attached, runs the reference formula step by step
through those points - calling the module's own ``embed`` and ``wkv`` so a row-sharded table's
all-reduce and an fp8 GEMM run exactly as in the model. With no hook attached the original forward
runs. A module has one such forward however many attachments share it (each adds its points to
it); :meth:`AttachedModel.detach` (or leaving the ``with`` block) removes this attachment's points,
and the last one to leave restores the original forward, in whatever order they detach.

Layout: the row frames split row ids into (n-gram order, head) by the Engram layout. With
``config=None`` it is read from the model (the reference's ``Transformer.engram_layout``, see
:mod:`engram_viz.run.model_layout`); a given config must agree with it. Either way the hooked modules
are checked against the config (layers, ``dim``, ``hc_mult``, table rows, ``wkv`` width).

Images: :meth:`AttachedModel.run` passes ``images`` on, as the reference's
``Transformer.forward(input_ids, start_pos=0, images=None, token_types=None)`` takes them; without
them the reference merges no image features, so every position at and after an image span reads
other streams than with its images. The Trace's streams label says so when a prompt has image spans
and no images were given.

Under ``torchrun`` with world_size > 1 every rank must attach and run (the embedding all-reduces);
only ``capture_rank`` (default 0) stores activations and builds the Trace, the other ranks get
``None``. Editing hooks apply on every rank, so the ranks stay consistent.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Self, cast

import torch
from torch import nn

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.engram import CLAMP_VALUE, Engram, engram_steps
from engram_viz.core.hooks import HOOK_SITES, HookFn, HookPoint, hook_name
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import AttachError
from engram_viz.run.capture import DEFAULT_NAMES, ActivationCache, HookRegistry, _capture_here
from engram_viz.run.model_layout import check_modules, model_config
from engram_viz.run.trace import Trace, trace_from_cache

__all__ = ["ENGRAM_ATTRS", "AttachError", "AttachedModel", "attach", "find_engram_modules", "is_engram_like"]

ENGRAM_ATTRS = ("embed", "wkv", "q_weight", "k_weight", "hc_mult", "dim", "eps", "layer_id")
_STATE = "_engram_viz_attachments"  # the shared wrapper's state, in the module's __dict__ (not its tree)
NO_IMAGES_NOTE = (
    "; no image features were merged for the image spans of prompts {prompts} (images=None): at and after "
    "each span the streams differ from the model's own with its images - pass images= to run()"
)


def is_engram_like(module: nn.Module) -> bool:
    """True when ``module`` has every reference attribute of an Engram layer."""
    return all(hasattr(module, a) for a in ENGRAM_ATTRS)


def find_engram_modules(model: nn.Module) -> dict[int, tuple[str, nn.Module]]:
    """``{layer_id: (path, module)}`` of every Engram-like submodule (``model`` itself included)."""
    found: dict[int, tuple[str, nn.Module]] = {}
    for path, module in model.named_modules():
        if not is_engram_like(module):
            continue
        layer = int(cast(Any, module).layer_id)  # Engram-like: attributes checked by name, not by type
        if layer in found:
            raise AttachError(f"two Engram-like submodules claim layer_id {layer}: {found[layer][0]!r} and {path!r}")
        found[layer] = (path, module)
    if not found:
        raise AttachError(
            f"{type(model).__name__} has no Engram-like submodule; expected modules with the attributes {ENGRAM_ATTRS}"
        )
    return dict(sorted(found.items()))


@dataclass
class _Shared:
    """One instrumented forward per module, shared by every attachment to it."""

    original: Callable
    had_own: bool  # the module had an instance-level forward of its own before the first attachment
    points: list[dict[str, HookPoint]] = field(default_factory=list)  # one dict per attachment


def _through(shared: _Shared, site: str, t: torch.Tensor) -> torch.Tensor:
    for points in shared.points:  # attachments in the order they were made
        t = points[site](t)
    return t


def _instrumented_forward(module: nn.Module, shared: _Shared) -> Callable:
    """The module's forward as :func:`engram_steps` through every attachment's points (only while hooked)."""

    # self: any Engram-like module (ENGRAM_ATTRS by name, not one class), so its attributes are untyped
    def forward(self: Any, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None = None):
        if not any(p.fns for points in shared.points for p in points.values()):
            return shared.original(x, hash_ids, token_mask)
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
            hook=lambda site, t: _through(shared, site, t),
        )

    return types.MethodType(forward, module)


def _instrument(module: nn.Module, points: dict[str, HookPoint]) -> Callable[[], None]:
    """Add ``points`` to the module's shared instrumented forward (installed on first use); returns
    the remover, which restores the original forward when the last attachment leaves."""
    shared = module.__dict__.get(_STATE)
    if shared is None:
        shared = _Shared(module.forward, "forward" in module.__dict__)
        module.forward = _instrumented_forward(module, shared)
        module.__dict__[_STATE] = shared
    shared.points.append(points)

    def remove() -> None:
        shared.points[:] = [p for p in shared.points if p is not points]
        if shared.points or module.__dict__.get(_STATE) is not shared:
            return
        del module.__dict__[_STATE]
        if shared.had_own:
            module.forward = shared.original
        else:
            module.__dict__.pop("forward", None)

    return remove


def _image_prompts(token_types: torch.Tensor | None, prompt_ids: Sequence[str] | None) -> list[str]:
    """Ids of the prompts (rows) holding an image span (``token_types >= 0``)."""
    if token_types is None:
        return []
    rows: list[int] = torch.nonzero((torch.as_tensor(token_types) >= 0).any(-1)).flatten().tolist()
    return [prompt_ids[i] if prompt_ids is not None else f"p{i}" for i in rows]


def _default_call(
    model: nn.Module, input_ids: torch.Tensor, token_types: torch.Tensor | None, images: Any = None
) -> Any:
    """The reference call ``model(input_ids, images=..., token_types=...)``, or ``token_mask=`` for
    models that take a mask; ``images`` only when given."""
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {}
    if images is not None:
        if "images" not in params:
            raise AttachError(
                f"{type(model).__name__}.forward takes no images (parameters: {list(params)}); "
                "pass call=fn(model, input_ids, token_types, images) to run image prompts"
            )
        kwargs["images"] = images
    if token_types is not None:
        if "token_types" in params:
            kwargs["token_types"] = token_types
        elif "token_mask" in params:
            kwargs["token_mask"] = token_types < 0
        else:
            raise AttachError(
                f"{type(model).__name__}.forward takes neither token_types nor token_mask; pass call=... to run image prompts"
            )
    return model(input_ids, **kwargs)


class AttachedModel:
    """A model with the suite's hook names attached; use as a context manager or call ``detach()``.

    ``config`` (preset, path or :class:`EngramConfig`; ``None`` reads the model's own Engram layout)
    and ``tokenizer`` build the :class:`Trace` (compressed ids, text pieces, row frames);
    ``model_label`` / ``streams_label`` are written into every Trace.
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
        self.engrams = find_engram_modules(model)
        self.config = load_config(config) if config is not None else model_config(model, self.engrams)
        check_modules(self.config, self.engrams, model)
        self._tokenizer = tokenizer
        self.model_label = model_label or f"{type(model).__name__} (attached)"
        self.streams_label = streams_label
        self.registry = HookRegistry()
        self._restore: list[Callable[[], None]] = []
        self.attached = True
        try:
            for layer, (_, module) in self.engrams.items():
                if isinstance(module, Engram):
                    self.registry.update(HookRegistry(module.hook_points()))
                    continue
                points = {kind: HookPoint(hook_name(layer, kind)) for kind in HOOK_SITES}
                for point in points.values():
                    self.registry.add_point(point.name, point)
                self._restore.append(_instrument(module, points))
        except BaseException:
            self.detach()
            raise

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self.engrams)

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            self._tokenizer = get_tokenizer(self.config)
        return self._tokenizer

    def detach(self) -> None:
        """Remove this attachment's hook points from every module (the last attachment to leave a
        module restores its original forward); further runs through this object raise."""
        self.attached = False
        while self._restore:
            self._restore.pop()()

    def _check_attached(self) -> None:
        if not self.attached:
            raise AttachError(f"this attachment to {type(self.model).__name__} was detached; attach(model) again")

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.detach()

    def hooks(self, edits: Mapping[str, HookFn] | Iterable[tuple[str, HookFn]] | None) -> Any:
        """Editing hooks for a ``with`` block (e.g. ``{'engram.L14.gate': force_gate(0.0)}``)."""
        self._check_attached()
        return self.registry.hooks(edits)

    def capture(
        self, names: str | Iterable[str] | None = DEFAULT_NAMES, device: str | None = "cpu", capture_rank: int = 0
    ):
        """Capture for a ``with`` block, e.g. around a whole ``generate()`` loop (chunks join along T)."""
        self._check_attached()
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
        self._check_attached()
        return self.registry.run_with_cache(lambda: self.model(*args, **kwargs), names, device, hooks, capture_rank)

    def run(
        self,
        input_ids: torch.Tensor,
        token_types: torch.Tensor | None = None,
        *,
        images: Any = None,
        names: str | Iterable[str] | None = (),
        hooks: Mapping[str, HookFn] | None = None,
        lengths: torch.Tensor | None = None,
        prompt_ids: Sequence[str] | None = None,
        categories: Sequence[str] | None = None,
        texts: Sequence[str] | None = None,
        call: Callable[..., Any] | None = None,
        capture_rank: int = 0,
    ) -> Trace | None:
        """One forward of the model on ``input_ids [B, T]`` -> :class:`Trace` (``None`` on ranks other
        than ``capture_rank``). Row ids, token mask and gates are always captured; ``names`` adds more.
        ``images`` goes to the model as the reference takes it (per prompt, the images of its spans).
        ``call(model, input_ids, token_types)`` runs the model (default: the reference signature);
        with ``images`` it is called as ``call(model, input_ids, token_types, images)``."""
        self._check_attached()
        wanted = list(DEFAULT_NAMES) + ([names] if isinstance(names, str) else list(names or []))
        call = call or _default_call
        args = (self.model, input_ids, token_types) + ((images,) if images is not None else ())
        with torch.no_grad():
            _, cache = self.registry.run_with_cache(lambda: call(*args), wanted, "cpu", hooks, capture_rank)
        if not cache.captured or not _capture_here(capture_rank):
            return None
        unmerged = _image_prompts(token_types, prompt_ids) if images is None else []
        label = self.streams_label + (NO_IMAGES_NOTE.format(prompts=unmerged) if unmerged else "")
        return trace_from_cache(
            cache,
            input_ids,
            layer_ids=self.layer_ids,
            tokenizer=self.tokenizer,
            model_label=self.model_label,
            streams_label=label,
            token_types=token_types,
            lengths=lengths,
            prompt_ids=prompt_ids,
            categories=categories,
            texts=texts,
            meta={"source": "attach", "images_merged": images is not None},
        )


def attach(model: nn.Module, config: EngramConfig | str | None = None, **kwargs: Any) -> AttachedModel:
    """Attach the suite's hook names to ``model``; see :class:`AttachedModel`."""
    return AttachedModel(model, config, **kwargs)
