"""Trace: everything one run over a batch of prompts produced, as tensors and tidy tables.

A Trace holds, for B prompts right-padded to T positions (``lengths`` says how many are real):

- per prompt: ``prompt_ids``, ``categories``, ``texts``;
- per position: ``input_ids`` (raw) ``[B, T]``, ``compressed_ids`` ``[B, T]`` (as the hash cache
  sees them: -1 = DEAD at image positions), ``token_types`` ``[B, T]`` (TEXT = -1, image span
  parts 0..3) and ``pieces`` (decoded text of each token; image positions read ``<img>``,
  ``<img:start>``, ``<img:nl>``, ``<img:end>``);
- ``tensors``: every captured hook, keyed by hook name (``engram.L1.gate`` ``[B, T, hc]`` ...);
  ``engram.L{n}.hash_ids`` and ``engram.L{n}.gate`` are always there, so ``row_ids``
  ``[B, T, n_layers, 24]`` and ``gates`` ``[B, T, n_layers, hc]`` are too;
- ``extras``: derived per-position arrays, e.g. ``exposure`` ``[B, T, n_layers]`` (how many of a
  position's 24 rows hold two or more distinct n-grams, see ``collisions``);
- ``model_label`` (which model and weights), ``streams_label`` (where the residual streams came
  from) and ``meta`` (config, device, wkv mode, ...).

``to_frame('gates')`` is one row per (prompt, position, layer, stream); ``to_frame('rows')`` one
per (prompt, position, layer, order, head); padded positions never appear. ``save(dir)`` writes
``tensors.safetensors`` + ``trace.json`` (the folder all or nothing, the labels checked first; the
JSON records the tensor file's sha256 and the sha256 of its own content, so the whole trace is
covered; trace.json's fields and checks are in ``trace_doc``) and ``Trace.load(dir)``
gives back an equal Trace, bit for bit, or a :class:`TraceError` naming the file that is missing,
malformed or edited.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from engram_viz._cache import file_sha256
from engram_viz._files import atomic_folder, atomic_path, atomic_write_text
from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT
from engram_viz.core.hooks import HOOK_SITES, hook_name, parse_hook_name
from engram_viz.errors import InputError, TraceError
from engram_viz.run.trace_doc import DOC_SHA256, FORMAT_VERSION, doc_sha256, doc_text, read_doc
from engram_viz.run.trace_frames import TraceFrames

IMAGE_PIECES = {IMAGE_START: "<img:start>", IMAGE: "<img>", IMAGE_NEWLINE: "<img:nl>", IMAGE_END: "<img:end>"}
_TENSORS_FILE, _JSON_FILE = "tensors.safetensors", "trace.json"
_BASE_TENSORS = ("input_ids", "compressed_ids", "token_types", "lengths")


@dataclass
class Trace(TraceFrames):
    """One run over a batch of prompts (see the module docstring for every field's shape)."""

    layer_ids: tuple[int, ...]
    prompt_ids: list[str]
    categories: list[str]
    texts: list[str]
    input_ids: torch.Tensor  # [B, T] int64 raw ids, padded with the engram pad id
    compressed_ids: torch.Tensor  # [B, T] int64, -1 (DEAD) at image positions
    token_types: torch.Tensor  # [B, T] int64, TEXT = -1
    lengths: torch.Tensor  # [B] int64
    pieces: list[list[str]]  # B lists of lengths[b] strings
    tensors: dict[str, torch.Tensor]  # hook name -> [B, T, ...]
    model_label: str
    streams_label: str
    extras: dict[str, torch.Tensor] = field(default_factory=dict)  # e.g. exposure [B, T, n_layers]
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.layer_ids = tuple(int(x) for x in self.layer_ids)
        b = len(self.prompt_ids)
        if not (len(self.categories) == len(self.texts) == len(self.pieces) == b):
            raise TraceError(
                f"prompt_ids ({b}), categories ({len(self.categories)}), texts ({len(self.texts)}) and pieces "
                f"({len(self.pieces)}) must have one entry per prompt"
            )
        if self.input_ids.dim() != 2 or self.input_ids.shape[0] != b:
            raise TraceError(f"input_ids must be [B={b}, T], got {list(self.input_ids.shape)}")
        bt = tuple(self.input_ids.shape)
        for name in ("compressed_ids", "token_types"):
            if tuple(getattr(self, name).shape) != bt:
                raise TraceError(f"{name} has shape {list(getattr(self, name).shape)}, expected {list(bt)}")
        if tuple(self.lengths.shape) != (b,):
            raise TraceError(f"lengths must be [{b}], got {list(self.lengths.shape)}")
        for i, (n, p) in enumerate(zip(self.lengths.tolist(), self.pieces)):
            if len(p) != n or n > bt[1]:
                raise TraceError(f"prompt {self.prompt_ids[i]!r}: {len(p)} pieces for length {n} (T={bt[1]})")
        for name, t in list(self.tensors.items()) + list(self.extras.items()):
            if tuple(t.shape[:2]) != bt:
                raise TraceError(f"{name} has shape {list(t.shape)}; expected it to start with [B, T] = {list(bt)}")
        if not self.layer_ids or len(set(self.layer_ids)) != len(self.layer_ids):
            raise TraceError(f"layer_ids must list each Engram layer once, got {list(self.layer_ids)}")
        for name in self.tensors:
            if parse_hook_name(name)[0] not in self.layer_ids:
                raise TraceError(f"{name} belongs to no layer of the trace (layer_ids {list(self.layer_ids)})")
        for layer in self.layer_ids:
            for kind in ("hash_ids", "gate"):
                if hook_name(layer, kind) not in self.tensors:
                    raise TraceError(f"a Trace needs {hook_name(layer, kind)}; captured: {sorted(self.tensors)}")

    # --- shapes and stacked views ----------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        return len(self.prompt_ids)

    @property
    def seq_len(self) -> int:
        return int(self.input_ids.shape[1])

    @property
    def valid(self) -> torch.Tensor:
        """bool ``[B, T]``: True at real (not padded) positions."""
        return torch.arange(self.seq_len)[None, :] < self.lengths[:, None]

    @property
    def is_image(self) -> torch.Tensor:
        """bool ``[B, T]``: True at image-span positions."""
        return self.token_types >= 0

    @property
    def row_ids(self) -> torch.Tensor:
        """int64 ``[B, T, n_layers, 24]``."""
        return torch.stack([self.tensors[hook_name(n, "hash_ids")] for n in self.layer_ids], dim=2)

    @property
    def gates(self) -> torch.Tensor:
        """float32 ``[B, T, n_layers, hc]``."""
        return torch.stack([self.tensors[hook_name(n, "gate")] for n in self.layer_ids], dim=2)

    def captured(self, kind: str) -> dict[int, torch.Tensor]:
        """Captured tensors of one hook kind keyed by layer id, e.g. ``trace.captured('dot')``."""
        if kind not in HOOK_SITES:
            raise InputError(f"unknown hook kind {kind!r}; expected one of {list(HOOK_SITES)}")
        return {n: self.tensors[hook_name(n, kind)] for n in self.layer_ids if hook_name(n, kind) in self.tensors}

    def index(self, prompt_id: str) -> int:
        try:
            return self.prompt_ids.index(prompt_id)
        except ValueError:
            raise KeyError(f"prompt {prompt_id!r} is not in this trace; it has {self.prompt_ids}") from None

    def __repr__(self) -> str:
        return (
            f"Trace({self.batch_size} prompts, T={self.seq_len}, layers {list(self.layer_ids)}, "
            f"captured {sorted(self.tensors)}, model {self.model_label!r}, streams {self.streams_label!r})"
        )

    # --- combining -------------------------------------------------------------------------------

    @classmethod
    def concat(cls, traces: Sequence[Trace]) -> Trace:
        """Prompts of several traces (same layers and labels) in one, re-padded to the longest T."""
        if not traces:
            raise TraceError("Trace.concat needs at least one trace")
        first = traces[0]
        for tr in traces[1:]:
            if tr.layer_ids != first.layer_ids or set(tr.tensors) != set(first.tensors):
                raise TraceError("Trace.concat: traces differ in layers or captured hooks")
            if (tr.model_label, tr.streams_label) != (first.model_label, first.streams_label):
                raise TraceError("Trace.concat: traces come from different models or stream sources")
        t_max = max(tr.seq_len for tr in traces)

        def cat(get: Any, fill: float) -> torch.Tensor:
            parts = []
            for tr in traces:
                x = get(tr)
                pad = t_max - x.shape[1]
                if pad:
                    x = torch.cat([x, x.new_full((x.shape[0], pad, *x.shape[2:]), fill)], dim=1)
                parts.append(x)
            return torch.cat(parts, dim=0)

        pad_id = int(first.meta.get("pad_id", 2))
        return cls(
            layer_ids=first.layer_ids,
            prompt_ids=[p for tr in traces for p in tr.prompt_ids],
            categories=[c for tr in traces for c in tr.categories],
            texts=[x for tr in traces for x in tr.texts],
            input_ids=cat(lambda tr: tr.input_ids, pad_id),
            compressed_ids=cat(lambda tr: tr.compressed_ids, int(first.meta.get("pad_compressed", pad_id))),
            token_types=cat(lambda tr: tr.token_types, TEXT),
            lengths=torch.cat([tr.lengths for tr in traces]),
            pieces=[p for tr in traces for p in tr.pieces],
            tensors={k: cat(lambda tr, k=k: tr.tensors[k], 0) for k in first.tensors},
            extras={
                k: cat(lambda tr, k=k: tr.extras[k], 0) for k in first.extras if all(k in t.extras for t in traces)
            },
            model_label=first.model_label,
            streams_label=first.streams_label,
            meta=dict(first.meta),
        )

    def select(self, prompts: Sequence[str | int]) -> Trace:
        """The named prompts (ids or indices), in that order, padded only to their own longest T."""
        idx = [p if isinstance(p, int) else self.index(p) for p in prompts]
        if not idx:
            raise TraceError("Trace.select needs at least one prompt")
        t = max(int(self.lengths[i]) for i in idx)
        sel = torch.tensor(idx, dtype=torch.int64)
        return Trace(
            layer_ids=self.layer_ids,
            prompt_ids=[self.prompt_ids[i] for i in idx],
            categories=[self.categories[i] for i in idx],
            texts=[self.texts[i] for i in idx],
            input_ids=self.input_ids[sel, :t].clone(),
            compressed_ids=self.compressed_ids[sel, :t].clone(),
            token_types=self.token_types[sel, :t].clone(),
            lengths=self.lengths[sel].clone(),
            pieces=[list(self.pieces[i]) for i in idx],
            tensors={k: v[sel, :t].clone() for k, v in self.tensors.items()},
            extras={k: v[sel, :t].clone() for k, v in self.extras.items()},
            model_label=self.model_label,
            streams_label=self.streams_label,
            meta=dict(self.meta),
        )

    # --- save / load -----------------------------------------------------------------------------

    def save(self, path: str | Path) -> Path:
        """Write ``path/tensors.safetensors`` and ``path/trace.json``; returns ``path``.

        All or nothing (``_files.atomic_folder``, marker ``trace.json``): the labels are checked
        first (:func:`~engram_viz.run.trace_doc.doc_text`: a value JSON cannot hold is a
        :class:`TraceError` naming it), the folder is built beside ``path`` and swapped in whole, so
        a failed save leaves an earlier trace there loadable and no half-written folder; a folder
        of something else is refused. ``trace.json`` records the tensor file's sha256 and
        ``trace_sha256``, the sha256 of its own content (:func:`doc_sha256`), so an edit to either
        file fails ``load``."""
        path = Path(path)
        doc = {
            "format": "engram-viz-trace",
            "version": FORMAT_VERSION,
            "tensors_sha256": "",  # filled in once the tensors are written
            "layer_ids": list(self.layer_ids),
            "prompt_ids": self.prompt_ids,
            "categories": self.categories,
            "texts": self.texts,
            "pieces": self.pieces,
            "model_label": self.model_label,
            "streams_label": self.streams_label,
            "meta": self.meta,
        }
        doc_text(doc)  # refuses before anything is written
        flat = {name: getattr(self, name) for name in _BASE_TENSORS}
        flat.update({f"hook/{k}": v for k, v in self.tensors.items()})
        flat.update({f"extra/{k}": v for k, v in self.extras.items()})
        flat = {k: v.detach().cpu().contiguous().clone() for k, v in flat.items()}
        with atomic_folder(path, marker=_JSON_FILE) as build:
            with atomic_path(build / _TENSORS_FILE) as tmp:
                save_file(flat, str(tmp), metadata={"format": "engram-viz-trace"})
            doc["tensors_sha256"] = file_sha256(build / _TENSORS_FILE)
            doc[DOC_SHA256] = doc_sha256(doc)
            atomic_write_text(build / _JSON_FILE, doc_text(doc))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Trace:
        """The Trace saved in ``path``; a :class:`TraceError` naming the file when either file is
        missing, malformed, edited since it was saved, or from another save."""
        path = Path(path)
        jpath, tpath = path / _JSON_FILE, path / _TENSORS_FILE
        for p in (jpath, tpath):
            if not p.is_file():
                raise TraceError(f"{path} is not a saved Trace: {p.name} is missing")
        doc = read_doc(jpath)
        if file_sha256(tpath) != doc["tensors_sha256"]:
            raise TraceError(f"{tpath} does not match {jpath} (sha256 differs): the pair was not saved together")
        try:
            flat = load_file(tpath)
        except Exception as err:  # noqa: BLE001 - safetensors raises its own SafetensorError and others
            raise TraceError(f"{tpath} is not a readable safetensors file: {err}") from None
        missing = [k for k in _BASE_TENSORS if k not in flat]
        if missing:
            raise TraceError(f"{tpath} lacks the tensors {missing}")
        try:
            return cls(
                layer_ids=tuple(doc["layer_ids"]),
                prompt_ids=list(doc["prompt_ids"]),
                categories=list(doc["categories"]),
                texts=list(doc["texts"]),
                input_ids=flat["input_ids"],
                compressed_ids=flat["compressed_ids"],
                token_types=flat["token_types"],
                lengths=flat["lengths"],
                pieces=[list(p) for p in doc["pieces"]],
                tensors={k.removeprefix("hook/"): v for k, v in flat.items() if k.startswith("hook/")},
                extras={k.removeprefix("extra/"): v for k, v in flat.items() if k.startswith("extra/")},
                model_label=doc["model_label"],
                streams_label=doc["streams_label"],
                meta=doc["meta"],
            )
        except (ValueError, TypeError, IndexError, RuntimeError) as err:  # TraceError is a ValueError
            raise TraceError(f"{path} holds an inconsistent Trace: {err}") from None

    def equals(self, other: Trace) -> bool:
        """Field-by-field equality, tensors compared bit for bit (dtype and shape included)."""
        if not isinstance(other, Trace):
            return False
        plain = ("layer_ids", "prompt_ids", "categories", "texts", "pieces", "model_label", "streams_label", "meta")
        if any(getattr(self, f) != getattr(other, f) for f in plain):
            return False
        mine = {
            **{n: getattr(self, n) for n in _BASE_TENSORS},
            **self.tensors,
            **{"x/" + k: v for k, v in self.extras.items()},
        }
        theirs = {
            **{n: getattr(other, n) for n in _BASE_TENSORS},
            **other.tensors,
            **{"x/" + k: v for k, v in other.extras.items()},
        }
        if mine.keys() != theirs.keys():
            return False
        return all(_bit_equal(mine[k], theirs[k]) for k in mine)


def _bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.dtype.is_floating_point and a.element_size() in (1, 2, 4, 8):
        view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        return torch.equal(a.contiguous().view(view), b.contiguous().view(view))
    return torch.equal(a, b)


def _zero_padding(x: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Zeros at padded positions, so a Trace's padding never depends on what ran there."""
    if bool(valid.all()):
        return x
    return x.masked_fill(~valid.reshape(*valid.shape, *([1] * (x.dim() - 2))), 0)


def token_pieces(tokenizer: Any, raw_ids: Iterable[int], token_types: Iterable[int]) -> list[str]:
    """Decoded text per token; image positions get a readable span label instead."""
    raw_ids, token_types = list(raw_ids), [int(x) for x in token_types]
    text = tokenizer.pieces(raw_ids) if raw_ids else []
    return [IMAGE_PIECES.get(tt, "<img?>") if tt >= 0 else p for p, tt in zip(text, token_types)]


def trace_from_cache(
    cache: Mapping[str, torch.Tensor],
    input_ids: torch.Tensor,
    *,
    layer_ids: Sequence[int],
    tokenizer: Any,
    model_label: str,
    streams_label: str,
    token_types: torch.Tensor | None = None,
    lengths: torch.Tensor | None = None,
    prompt_ids: Sequence[str] | None = None,
    categories: Sequence[str] | None = None,
    texts: Sequence[str] | None = None,
    extras: Mapping[str, torch.Tensor] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> Trace:
    """Assemble a Trace from captured activations and the ids that produced them.

    ``input_ids`` ``[B, T]`` raw ids (right-padded; ``lengths`` ``[B]`` real lengths, default all
    T); ``token_types`` ``[B, T]`` (default all TEXT); ``tokenizer`` supplies the compressed map
    and text pieces. Every hook in ``cache`` becomes a Trace tensor (moved to the CPU).
    """
    input_ids = torch.as_tensor(input_ids).detach().cpu().to(torch.int64)
    if input_ids.dim() != 2:
        raise TraceError(f"input_ids must be [B, T], got {list(input_ids.shape)}")
    b, t = input_ids.shape
    token_types = (
        torch.full((b, t), TEXT, dtype=torch.int64)
        if token_types is None
        else torch.as_tensor(token_types).detach().cpu().to(torch.int64)
    )
    if tuple(token_types.shape) != (b, t):
        raise TraceError(f"token_types has shape {list(token_types.shape)}, expected {[b, t]}")
    lengths = (
        torch.full((b,), t, dtype=torch.int64) if lengths is None else torch.as_tensor(lengths).cpu().to(torch.int64)
    )
    valid = torch.arange(t)[None, :] < lengths[:, None]
    token_map = torch.as_tensor(np.asarray(tokenizer.token_map), dtype=torch.int64)
    compressed = torch.where(token_types >= 0, torch.tensor(-1), token_map[input_ids])
    pieces = [
        token_pieces(tokenizer, input_ids[i, :n].tolist(), token_types[i, :n].tolist())
        for i, n in enumerate(lengths.tolist())
    ]
    prompt_ids = list(prompt_ids) if prompt_ids is not None else [f"p{i}" for i in range(b)]
    meta = dict(meta or {})
    config = getattr(tokenizer, "config", None)
    if config is not None:
        meta.setdefault("config", config.name)
        meta.setdefault("n_heads", config.engram_n_heads)
        meta.setdefault("hc_mult", config.hc_mult)
        meta.setdefault("pad_id", config.engram_pad_id)
        meta.setdefault("pad_compressed", int(token_map[config.engram_pad_id]))
    return Trace(
        layer_ids=tuple(layer_ids),
        prompt_ids=prompt_ids,
        categories=list(categories) if categories is not None else [""] * b,
        texts=list(texts)
        if texts is not None
        else [tokenizer.decode(input_ids[i, :n]) for i, n in enumerate(lengths.tolist())],
        input_ids=input_ids,
        compressed_ids=compressed,
        token_types=token_types,
        lengths=lengths,
        pieces=pieces,
        tensors={name: _zero_padding(cache[name].detach().cpu(), valid) for name in cache},
        model_label=model_label,
        streams_label=streams_label,
        extras={k: _zero_padding(v.detach().cpu(), valid) for k, v in (extras or {}).items()},
        meta=meta,
    )
