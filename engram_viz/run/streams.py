"""Where the residual streams ``x [B, T, hc_mult, dim]`` fed to an Engram layer come from.

The Engram gate compares each stream with its key, so gates are only as true as the streams.
Four sources, each returned as a :class:`Streams` whose ``label`` every output prints:

(a) :func:`embedding_streams` - rows of the token embedding ``embed.weight`` repeated into
    ``hc_mult`` streams. This is exactly what the reference feeds to layer 0, and the only
    streams available without running any block; for the Engram layers (V4.1-Flash: 1 and
    14) it is a proxy, since the real streams have passed through the blocks before them.
(b) :func:`load_captured_streams` - real streams dumped from a full-model run (format below).
(c) :func:`streams_from_tensor` - any tensor the user supplies.
(d) :class:`Block0Streams` - the checkpoint's own embed + block 0 (``core.block0``), computed here:
    the model's own streams entering the first Engram layer (layer 1), within a stated tolerance;
    later Engram layers get the same streams, a proxy that its label names.

A Pipeline holds one :class:`StreamSource` (``run.stream_sources`` wraps (a)-(d) and the model's own
streams as such objects; :class:`Block0Streams` is one already) and only calls it.

Captured-streams file format (safetensors, written by :func:`save_captured_streams`)
-------------------------------------------------------------------------------------

==================  ==================  ====================================================
tensor              shape, dtype        meaning
==================  ==================  ====================================================
``streams.L{n}``    [B, T, hc, dim]     the residual streams ``h`` entering Engram layer n:
                    bf16 / f16 / f32    the first argument of ``layers[n].engram(h, ...)`` in
                                        the reference ``Transformer.forward`` (one tensor per
                                        captured layer, e.g. ``streams.L1``, ``streams.L14``)
``input_ids``       [B, T] int64/int32  the raw token ids of that run (a full prefill from
                                        position 0)
``token_types``     [B, T] int64/int32  optional: TEXT = -1, image START/IMAGE/NEWLINE/END =
                                        0/1/2/3 (reference section 6)
==================  ==================  ====================================================

Header ``__metadata__`` (all optional strings): ``model`` (e.g. ``DeepSeek-V4.1-Flash``),
``revision``, ``description``. To dump from the reference code, register a forward pre-hook on
each ``layer.engram`` that keeps ``args[0]`` (``h``), run one prefill, and pass the kept tensors
with ``input_ids`` (and ``token_types``) to :func:`save_captured_streams`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from engram_viz._files import atomic_path
from engram_viz.config import IMAGE_END, TEXT, EngramConfig, load_config
from engram_viz.core.block0 import Block0Source, block0_streams
from engram_viz.core.image_merge import ImageInput
from engram_viz.core.vit import VisionSource
from engram_viz.errors import CheckpointError, InputTypeError, StreamsError
from engram_viz.run.images import NO_FEATURES
from engram_viz.weights.block0_reader import open_block0
from engram_viz.weights.vision_reader import has_vision, open_vision

STREAM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ID_DTYPES = (torch.int64, torch.int32)
_STREAMS_NAME = re.compile(r"^streams\.L(\d+)$")


@dataclass
class Streams:
    """Residual streams ``x [B, T, hc, dim]`` with an honest ``label`` and their ``source``
    (``embedding``, ``captured``, ``tensor`` or ``block0``); ``layer`` is the Engram layer they enter when
    known, ``input_ids``/``token_types`` ``[B, T]`` the tokens they belong to when known."""

    x: torch.Tensor
    label: str
    source: str
    layer: int | None = None
    input_ids: torch.Tensor | None = None
    token_types: torch.Tensor | None = None

    @property
    def token_mask(self) -> torch.Tensor | None:
        """``[B, T]`` bool, False at image positions (``token_types >= 0``); None without token types."""
        return None if self.token_types is None else self.token_types < 0

    def __repr__(self) -> str:
        return f"Streams({self.source}, x={list(self.x.shape)} {self.x.dtype}, {self.label!r})"


@runtime_checkable
class StreamSource(Protocol):
    """Where a Pipeline's streams come from (``run.stream_sources``; :class:`Block0Streams`): ``name`` (the
    Trace meta's ``streams_mode``), ``label`` (how it labels itself: the last call's streams, which may add
    a clause, e.g. for image positions) and ``source(raw_ids [B, T], token_types [B, T], layer, images) -> Streams``;
    ``images`` holds each row's real pictures (``core.image_merge.ImageInput``), which only a source with a
    vision tower turns into image features (:func:`image_clause` says which spans got none)."""

    name: str
    label: str

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams: ...

    def prompts(self) -> list[dict[str, Any]] | None:
        """The prompts these streams belong to (a captured file's), which run as one batch; None: any prompts."""
        return None


# -- validation -------------------------------------------------------------------------------------


def check_streams(x: Any, what: str, config: EngramConfig | None = None) -> torch.Tensor:
    """Raise unless ``x`` is a finite floating tensor ``[B, T, hc, dim]`` (hc, dim from ``config``)."""
    if not isinstance(x, torch.Tensor):
        raise InputTypeError(f"{what} must be a torch.Tensor [B, T, hc, dim], got {type(x).__name__}")
    if x.dtype not in STREAM_DTYPES:
        raise InputTypeError(f"{what} must be bf16, f16 or f32 streams, got {x.dtype}")
    if x.dim() != 4:
        raise StreamsError(f"{what} must have shape [B, T, hc, dim] (rank 4), got {list(x.shape)}")
    if config is not None and tuple(x.shape[2:]) != (config.hc_mult, config.dim):
        raise StreamsError(
            f"{what} has shape {list(x.shape)}; config {config.name!r} expects [B, T, {config.hc_mult}, {config.dim}]"
        )
    if x.numel() and not bool(torch.isfinite(x).all()):
        raise StreamsError(f"{what} holds non-finite values (NaN or inf)")
    return x


def _check_ids(ids: Any, what: str, bt: tuple[int, int], vocab: int | None = None) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dtype not in ID_DTYPES:
        raise InputTypeError(
            f"{what} must be an int64 or int32 tensor [B, T], got {getattr(ids, 'dtype', type(ids).__name__)}"
        )
    if tuple(ids.shape) != bt:
        raise StreamsError(f"{what} must have shape {list(bt)} (the streams' [B, T]), got {list(ids.shape)}")
    if vocab is not None and ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            raise StreamsError(f"{what} holds token id {lo if lo < 0 else hi}; expected raw ids in 0..{vocab - 1}")
    return ids.to(torch.int64)


def _check_token_types(tt: Any, what: str, bt: tuple[int, int]) -> torch.Tensor:
    tt = _check_ids(tt, what, bt)
    if tt.numel():
        lo, hi = int(tt.min()), int(tt.max())
        if lo < TEXT or hi > IMAGE_END:
            raise StreamsError(f"{what} holds {lo if lo < TEXT else hi}; expected TEXT = -1 or image parts 0..3")
    return tt


def _as_id_matrix(raw_ids: Any, what: str) -> torch.Tensor:
    ids = torch.as_tensor(raw_ids)
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.dtype not in ID_DTYPES:
        raise StreamsError(f"{what} must be int token ids [T] or [B, T], got {ids.dtype} {list(ids.shape)}")
    return ids.to(torch.int64)


BatchImages = Sequence[Sequence[ImageInput]]  # per batch row, its real pictures


def picture_positions(token_types: torch.Tensor, images: BatchImages) -> torch.Tensor:
    """``[B, T]`` bool: the positions of spans that come with a real picture."""
    covered = torch.zeros(token_types.shape, dtype=torch.bool)
    for b, row in enumerate(images):
        for img in row:
            covered[b, img.start : img.start + img.types.numel()] = True
    return covered


def folder_vision(folder: Any) -> VisionSource | None:
    """The vision tower of a checkpoint folder, None when it has none."""
    return open_vision(folder) if has_vision(folder) else None


def check_vision(vision: VisionSource | None, config: EngramConfig) -> VisionSource | None:
    """``vision`` itself, refused when its aligner's width is not the config's ``dim``."""
    if vision is not None and vision.config.dim != config.dim:
        raise CheckpointError(
            f"the aligner of {vision.label} projects to width {vision.config.dim}; config {config.name!r} "
            f"has dim {config.dim}"
        )
    return vision


def vision_features(vision: VisionSource | None) -> str | None:
    """What a stream label names as the source of merged picture features (None: no tower, none merged)."""
    return None if vision is None else f"the vision tower and aligner of {vision.label}"


def image_clause(token_types: torch.Tensor, images: BatchImages, features: str | None) -> str:
    """What a stream label says about image spans: pictures whose features ``features`` names (None:
    these streams merged none), and ``<image:WxH>`` placeholders, which never carry image features."""
    spans = token_types >= 0
    if not bool(spans.any()):
        return ""
    pictures = picture_positions(token_types, images) & spans
    clause = ""
    if bool(pictures.any()):
        clause += (
            f"; picture spans carry image features ({features})"
            if features
            else f"; picture spans carry the image token's embedding: {NO_FEATURES} (these streams merge none), "
            "so text after them is not the model's own streams"
        )
    if bool((spans & ~pictures).any()):
        clause += (
            f"; <image:WxH> placeholder spans carry the image token's embedding: {NO_FEATURES}, so text after "
            "them is not the model's own streams"
        )
    return clause


# -- (a) embedding streams -------------------------------------------------------------------------


def embedding_streams(checkpoint: Any, raw_ids: Any, token_types: torch.Tensor | None = None) -> Streams:
    """Rows of ``embed.weight`` for ``raw_ids`` (``[T]`` or ``[B, T]``) repeated into ``hc_mult``
    streams, as the reference builds the input of layer 0: bf16 ``[B, T, hc, dim]``.

    ``checkpoint`` needs ``config``, ``embed`` (``rows(raw_ids) -> [..., dim]``), ``label`` and
    ``synthetic``. Image positions (``token_types >= 0``) carry the image token's embedding, not
    vision features; their Engram gates are shut, so they pass through unchanged either way.
    """
    config = checkpoint.config
    ids = _as_id_matrix(raw_ids, "raw_ids")
    bt = (ids.shape[0], ids.shape[1])
    _check_ids(ids, "raw_ids", bt, config.vocab_size)
    if token_types is not None:
        token_types = _check_token_types(_as_id_matrix(token_types, "token_types"), "token_types", bt)
    rows = checkpoint.embed.rows(ids)
    if tuple(rows.shape) != (*bt, config.dim):
        raise StreamsError(f"embed.rows returned {list(rows.shape)}; expected {[*bt, config.dim]}")
    x = rows.unsqueeze(2).repeat(1, 1, config.hc_mult, 1)
    weights = checkpoint.label
    if checkpoint.synthetic and "SYNTHETIC" not in weights:
        weights += ", SYNTHETIC weights"
    label = (
        f"embedding streams: embed.weight rows repeated into {config.hc_mult} streams ({weights}) - "
        f"the true input of layer 0; only a proxy for the streams entering Engram layers "
        f"{', '.join(str(n) for n in config.engram_layer_ids)}"
    )
    if token_types is not None and bool((token_types >= 0).any()):
        label += f"; image positions carry the image token's embedding: {NO_FEATURES}"
    return Streams(x, label, "embedding", None, ids, token_types)


# -- (b) captured streams --------------------------------------------------------------------------


def captured_layers(path: str | Path) -> list[int]:
    """The Engram layers a captured-streams file holds streams for (sorted)."""
    path = _existing(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            names = list(f.keys())
    except SafetensorError as err:
        raise StreamsError(f"{path} is not a readable safetensors file: {err}") from None
    return sorted(int(m.group(1)) for k in names if (m := _STREAMS_NAME.match(k)))


def _existing(path: str | Path) -> Path:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"captured-streams file {path} does not exist")
    return path


def load_captured_streams(
    path: str | Path, layer: int | None = None, config: EngramConfig | str | None = None
) -> Streams:
    """Streams entering Engram layer ``layer`` from a captured-streams safetensors file (format in
    the module docstring). ``layer`` may be left out when the file holds one layer. With ``config``
    the stream shape is checked against ``hc_mult`` and ``dim``, and ``layer`` must be an Engram layer."""
    path = _existing(path)
    config = load_config(config) if config is not None else None
    try:
        with safe_open(str(path), framework="pt") as f:
            names = set(f.keys())
            meta = f.metadata() or {}
            layers = sorted(int(m.group(1)) for k in names if (m := _STREAMS_NAME.match(k)))
            if not layers:
                raise StreamsError(f"{path}: no 'streams.L<layer>' tensor found; tensors present: {sorted(names)}")
            if layer is None:
                if len(layers) > 1:
                    raise StreamsError(f"{path} holds streams for layers {layers}; pass layer= to pick one")
                layer = layers[0]
            if layer not in layers:
                raise StreamsError(f"{path}: no 'streams.L{layer}' tensor; the file has streams for layers {layers}")
            if "input_ids" not in names:
                raise StreamsError(f"{path}: tensor 'input_ids' [B, T] is missing (tensors present: {sorted(names)})")
            x = f.get_tensor(f"streams.L{layer}")
            input_ids = f.get_tensor("input_ids")
            token_types = f.get_tensor("token_types") if "token_types" in names else None
    except SafetensorError as err:
        raise StreamsError(f"{path} is not a readable safetensors file: {err}") from None
    if config is not None and layer not in config.engram_layer_ids:
        raise StreamsError(
            f"{path}: layer {layer} is not an Engram layer of config {config.name!r} {list(config.engram_layer_ids)}"
        )
    x = check_streams(x, f"{path}: streams.L{layer}", config)
    bt = (x.shape[0], x.shape[1])
    input_ids = _check_ids(input_ids, f"{path}: input_ids", bt, config.vocab_size if config else None)
    if token_types is not None:
        token_types = _check_token_types(token_types, f"{path}: token_types", bt)
    about = ", ".join(f"{k} {meta[k]}" for k in ("model", "revision", "description") if meta.get(k))
    label = f"captured streams entering Engram layer {layer} from {path.name}" + (f" ({about})" if about else "")
    return Streams(x, label, "captured", layer, input_ids, token_types)


def save_captured_streams(
    path: str | Path,
    streams: dict[int, torch.Tensor],
    input_ids: torch.Tensor,
    token_types: torch.Tensor | None = None,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``{layer: x [B, T, hc, dim]}`` with ``input_ids`` (and ``token_types``) in the
    captured-streams format; atomic (``engram_viz._files.atomic_path``)."""
    path = Path(path)
    if not streams:
        raise StreamsError("streams is empty; expected {layer: tensor [B, T, hc, dim]}")
    tensors: dict[str, torch.Tensor] = {}
    bt: tuple[int, int] | None = None
    for layer, x in streams.items():
        x = check_streams(x, f"streams[{layer}]")
        if bt is not None and tuple(x.shape[:2]) != bt:
            raise StreamsError(f"streams[{layer}] has [B, T] = {list(x.shape[:2])}, other layers have {list(bt)}")
        bt = (int(x.shape[0]), int(x.shape[1]))
        tensors[f"streams.L{int(layer)}"] = x.detach().cpu().contiguous()
    assert bt is not None  # streams is not empty (checked above)
    tensors["input_ids"] = _check_ids(input_ids, "input_ids", bt).cpu().contiguous()
    if token_types is not None:
        tensors["token_types"] = _check_token_types(token_types, "token_types", bt).cpu().contiguous()
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path


# -- (c) a user tensor -----------------------------------------------------------------------------


def streams_from_tensor(
    x: torch.Tensor,
    config: EngramConfig | str | None = None,
    label: str = "user tensor",
    layer: int | None = None,
    input_ids: torch.Tensor | None = None,
    token_types: torch.Tensor | None = None,
) -> Streams:
    """Wrap a user tensor ``x [B, T, hc, dim]`` (validated: dtype, rank, finite; shape against
    ``config`` when given). ``label`` says what the tensor is."""
    config = load_config(config) if config is not None else None
    x = check_streams(x, "x", config)
    if config is not None and layer is not None and layer not in config.engram_layer_ids:
        raise StreamsError(
            f"layer {layer} is not an Engram layer of config {config.name!r} {list(config.engram_layer_ids)}"
        )
    bt = (x.shape[0], x.shape[1])
    if input_ids is not None:
        input_ids = _check_ids(input_ids, "input_ids", bt, config.vocab_size if config else None)
    if token_types is not None:
        token_types = _check_token_types(token_types, "token_types", bt)
    return Streams(x, f"user tensor: {label}", "tensor", layer, input_ids, token_types)


# -- (d) block-0 streams ---------------------------------------------------------------------------

BLOCK0_GATE_TOL = 1e-2  # layer-1 gates vs a float64 block 0 (tests/integration/test_block0_streams.py)


class Block0Streams(StreamSource):
    """Streams from the checkpoint's own embed + block 0 (``core.block0.block0_streams``), on the CPU.

    ``self(raw_ids [B, T], token_types [B, T], layer, images) -> Streams``: the first Engram layer (which
    must be layer 1, the output of block 0) gets the model's own streams; every later Engram layer
    gets the same streams, labelled as a proxy. With ``vision`` (the checkpoint's vision tower), real
    pictures are merged into the embeddings where the reference merges them, so text after a picture
    reads the model's own streams; placeholder spans are labelled "no image features". The last batch's
    streams are kept, so the Engram layers of one batch share one block-0 pass (each routed expert read
    once per batch)."""

    name = "block0"

    def __init__(self, weights: Block0Source, config: EngramConfig, vision: VisionSource | None = None):
        b0 = weights.config
        mine = (b0.vocab_size, b0.dim, b0.hc_mult)
        if mine != (config.vocab_size, config.dim, config.hc_mult):
            raise CheckpointError(
                f"block 0 of {weights.label} has (vocab_size, dim, hc_mult) = {mine}; config {config.name!r} "
                f"expects {(config.vocab_size, config.dim, config.hc_mult)}"
            )
        first, *later = config.engram_layer_ids
        if first != 1:
            raise CheckpointError(
                f"block-0 streams enter layer 1; config {config.name!r} has its first Engram layer at {first}"
            )
        self.weights, self.config, self.vision = weights, config, check_vision(vision, config)
        self.label = (
            f"block-0 streams: embed + block 0 of {weights.label}, computed here - layer 1: the model's own "
            f"streams (layer-1 gates within {BLOCK0_GATE_TOL:g} of an exact float64 block 0)"
        )
        if later:
            self.label += (
                f"; layer {', '.join(map(str, later))}: NOT the model's own streams - computed on the same "
                "block-0 streams (the input of layer 1), a proxy; real gates there need captured or attached "
                "streams (a captured-streams .safetensors file or attach(model))"
            )
        self._label = self.label  # the label without the image clause a call may add
        self._last: tuple[torch.Tensor, torch.Tensor, BatchImages, torch.Tensor] | None = None

    @classmethod
    def open(cls, checkpoint: Any, config: EngramConfig) -> Block0Streams:
        """From an opened checkpoint with a folder (``checkpoint.path``) holding block-0 tensors (and,
        when it has one, the vision tower)."""
        folder = getattr(checkpoint, "path", None)
        if folder is None:
            raise CheckpointError(
                f"streams='block0' reads block 0 from a checkpoint folder; {getattr(checkpoint, 'label', checkpoint)!r} "
                "has none (in-memory weights)"
            )
        return cls(open_block0(folder), config, folder_vision(folder))

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        ids = _as_id_matrix(raw_ids, "raw_ids")
        bt = (ids.shape[0], ids.shape[1])
        _check_ids(ids, "raw_ids", bt, self.config.vocab_size)
        types = _check_token_types(_as_id_matrix(token_types, "token_types"), "token_types", bt)
        merged = images if self.vision is not None else ()
        last = self._last
        if last is None or not (torch.equal(last[0], ids) and torch.equal(last[1], types) and last[2] is merged):
            x = block0_streams(self.weights, ids, types >= 0, merged, self.vision)
            self._last = last = (ids, types, merged, x)
        self.label = self._label + image_clause(types, images, vision_features(self.vision))
        return Streams(last[3], self.label, "block0", layer, ids, types)
