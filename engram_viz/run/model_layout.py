"""The Engram layout a model carries itself, as an :class:`EngramConfig`, checked against its Engram modules.

The reference builds ``EngramLayout.from_args(args)`` once and keeps it on the Transformer as
``engram_layout`` (fields ``max_ngram_size``, ``layer_ids``, ``num_embeddings``, ``primes``
``[layer][order][head]``, ``n_heads``, ``head_dim``; its hasher holds the same object as
``engram_hash.layout``). Row frames split each position's row ids into (order, head) by that layout,
so attaching to a model reads it from the model instead of assuming V4.1-Flash's.

:func:`model_config` turns the layout (plus ``dim``, ``hc_mult`` and ``eps`` of the Engram modules)
into a config: the preset it equals when there is one (``tiny``, ``v41-flash``), else a config named
after the model with the tokenizer fields of V4.1-Flash and ``engram_vocab_size`` set to the first
prime, so :class:`engram_viz.core.layout.EngramLayout` draws the same primes (checked).
:func:`check_modules` checks a config against the hooked modules: every module's layer is an
Engram layer of the config, with the config's ``dim``, ``hc_mult``, table rows and ``wkv`` width.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from torch import nn

from engram_viz.config import PRESETS, EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import LayoutError

LAYOUT_FIELDS = ("max_ngram_size", "layer_ids", "num_embeddings", "primes", "n_heads", "head_dim")
# reference layout field -> EngramConfig field
_CONFIG_FIELD = {
    "max_ngram_size": "engram_max_ngram_size",
    "layer_ids": "engram_layer_ids",
    "num_embeddings": "engram_num_embeddings",
    "n_heads": "engram_n_heads",
    "head_dim": "engram_head_dim",
}

Engrams = Mapping[int, tuple[str, nn.Module]]  # {layer_id: (path, module)}


def find_layout(model: nn.Module) -> Any | None:
    """``model.engram_layout`` (reference Transformer), else ``model.engram_hash.layout``, else None."""
    layout = getattr(model, "engram_layout", None)
    if layout is None:
        layout = getattr(getattr(model, "engram_hash", None), "layout", None)
    if layout is not None and not all(hasattr(layout, f) for f in LAYOUT_FIELDS):
        raise LayoutError(
            f"{type(model).__name__}.engram_layout is a {type(layout).__name__} without the reference "
            f"EngramLayout fields {LAYOUT_FIELDS}"
        )
    return layout


def _module_dims(engrams: Engrams) -> tuple[int, int, float]:
    """The one ``(dim, hc_mult, eps)`` every Engram module shares."""
    modules: list[Any] = [m for _, m in engrams.values()]  # Engram-like: attributes by name, not by type
    dims = {(int(m.dim), int(m.hc_mult), float(m.eps)) for m in modules}
    if len(dims) != 1:
        raise LayoutError(f"the Engram modules disagree on (dim, hc_mult, eps): {sorted(dims)}")
    return dims.pop()


def _layout_fields(layout: Any, engrams: Engrams, what: str) -> dict[str, Any]:
    """The EngramConfig fields the layout and the modules give; the modules' layers must be the layout's."""
    layer_ids = tuple(int(i) for i in layout.layer_ids)
    extra = sorted(set(engrams) - set(layer_ids))
    if extra:
        raise LayoutError(
            f"{what}: layer_ids {layer_ids}, but the hooked Engram modules are at layers {sorted(engrams)} "
            f"({extra} not in the layout)"
        )
    dim, hc_mult, eps = _module_dims(engrams)
    fields = {cfg: getattr(layout, ref) for ref, cfg in _CONFIG_FIELD.items()}
    fields["engram_layer_ids"] = layer_ids
    fields["engram_num_embeddings"] = tuple(int(n) for n in layout.num_embeddings)
    return {**fields, "dim": dim, "hc_mult": hc_mult, "norm_eps": eps}


def _primes(layout: Any, what: str) -> np.ndarray:
    primes = np.asarray(layout.primes, dtype=np.int64)
    want = (len(layout.layer_ids), int(layout.max_ngram_size) - 1, int(layout.n_heads))
    if primes.shape != want:
        raise LayoutError(
            f"{what}: primes have shape {list(primes.shape)}; expected [layers, orders, heads] {list(want)}"
        )
    return primes


def layout_mismatch(config: EngramConfig, layout: Any) -> list[str]:
    """Fields where ``config`` and a reference layout differ, as ``'name: config X, layout Y'``."""
    out = []
    for ref, cfg in _CONFIG_FIELD.items():
        mine, theirs = getattr(config, cfg), getattr(layout, ref)
        if isinstance(mine, tuple):
            theirs = tuple(int(v) for v in theirs)
        if mine != theirs:
            out.append(f"{ref}: config {mine}, engram_layout {theirs}")
    if not out:
        primes = np.asarray(layout.primes, dtype=np.int64)
        if primes.shape != EngramLayout(config).primes.shape or not np.array_equal(primes, EngramLayout(config).primes):
            out.append("primes: the config's hash primes differ from engram_layout.primes")
    return out


def model_config(model: nn.Module, engrams: Engrams) -> EngramConfig:
    """The config of ``model``'s own Engram layout (see the module docstring); a LayoutError when the
    model carries none (and its modules are not the suite's own) or it disagrees with its modules."""
    layout = find_layout(model)
    name = type(model).__name__
    if layout is None:
        configs = {getattr(m, "config", None) for _, m in engrams.values()}
        if len(configs) == 1 and isinstance(own := configs.pop(), EngramConfig):
            return own  # the suite's own Engram modules know their config
        raise LayoutError(
            f"{name} has no engram_layout (the reference keeps its EngramLayout on the Transformer) and its "
            "Engram modules carry no config; pass config= (a preset, a config.json path or an EngramConfig)"
        )
    what = f"{name}.engram_layout"
    fields = _layout_fields(layout, engrams, what)
    primes = _primes(layout, what)
    for preset in PRESETS:
        cfg = load_config(preset)
        if all(getattr(cfg, k) == v for k, v in fields.items()) and np.array_equal(EngramLayout(cfg).primes, primes):
            return cfg
    base = {k: v for k, v in load_config("v41-flash").to_dict().items() if k != "name"}
    n_layers = len(getattr(model, "layers", ())) or max(fields["engram_layer_ids"]) + 1
    base.update(fields, engram_vocab_size=int(primes[0, 0, 0]), n_layers=n_layers)
    cfg = EngramConfig(name=f"engram_layout of {name}", **base)
    if not np.array_equal(EngramLayout(cfg).primes, primes):
        raise LayoutError(
            f"{what}: its primes are not the reference's draw (each the next unused prime from "
            f"engram_vocab_size - 1 per n-gram order); first primes {primes[0, 0].tolist()}"
        )
    return cfg


def check_modules(config: EngramConfig, engrams: Engrams, model: nn.Module | None = None) -> None:
    """Raise a LayoutError unless every hooked module fits ``config`` (and ``config`` fits the model's
    own ``engram_layout`` when it has one)."""
    layout = find_layout(model) if model is not None else None
    if layout is not None and (diff := layout_mismatch(config, layout)):
        raise LayoutError(
            f"config {config.name!r} does not match {type(model).__name__}.engram_layout ({'; '.join(diff)}); "
            "leave config=None to read the model's own layout"
        )
    for layer, (path, m) in engrams.items():
        if layer not in config.engram_layer_ids:
            raise LayoutError(
                f"{path}: layer_id {layer} is not an Engram layer of config {config.name!r} {list(config.engram_layer_ids)}"
            )
        rows = config.engram_num_embeddings[config.engram_layer_ids.index(layer)]
        checks = {
            "dim": (getattr(m, "dim", None), config.dim),
            "hc_mult": (getattr(m, "hc_mult", None), config.hc_mult),
            "embed.num_embeddings": (getattr(m.embed, "num_embeddings", None), rows),
            "wkv.in_features": (getattr(m.wkv, "in_features", None), config.n_hash_cols * config.engram_head_dim),
        }
        for field, (got, want) in checks.items():
            if got is not None and int(got) != want:
                raise LayoutError(f"{path}: {field} is {got}; config {config.name!r} expects {want}")
