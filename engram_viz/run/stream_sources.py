"""The stream sources a :class:`~engram_viz.run.pipeline.Pipeline` chooses among, once, from its ``streams=``.

Each is a :class:`~engram_viz.run.streams.StreamSource`: a ``name`` (the Trace meta's
``streams_mode``), a ``label`` (what every Trace says about its streams) and
``source(raw_ids [B, T], token_types [B, T], layer) -> Streams``:

- :class:`ModelStreams` (``"model"``): the tiny Engram LM's own streams, read at the
  ``engram.L{n}.streams`` hook site of a full forward (a Pipeline on such a model runs it whole);
- ``block_streams.BlockStreams`` (``"model"`` on a checkpoint with its blocks): embed + the blocks before
  the last Engram layer, chained with the Pipeline's Engram layers;
- :class:`EmbeddingStreams` (``"embedding"``): ``streams.embedding_streams``, the proxy;
- :class:`CapturedStreams` (``"captured"``): a captured-streams file, whose prompts are its ``input_ids``;
- :class:`CallableStreams` (``"callable"``): a user ``fn(input_ids, token_types, layer) -> x``;
- ``streams.Block0Streams`` (``"block0"``): the checkpoint's own embed + block 0.

:func:`choose_stream_source` reads the ``streams=`` argument (the one place that does);
:func:`runs_model_whole` says, before the weights are opened, whether it leaves a tiny LM whole.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import torch

from engram_viz.config import TEXT, EngramConfig
from engram_viz.core.engram import Engram
from engram_viz.errors import CheckpointError, StreamsError
from engram_viz.run.block_streams import BlockStreams
from engram_viz.run.images import NO_FEATURES
from engram_viz.run.streams import (
    BatchImages,
    Block0Streams,
    Streams,
    StreamSource,
    captured_layers,
    check_streams,
    embedding_streams,
    image_clause,
    load_captured_streams,
)
from engram_viz.tiny.model import TinyEngramLM

StreamsFn = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]
MODEL_LABEL = (
    "the model's own residual streams: a full forward of the tiny Engram LM "
    "(each Engram layer reads the streams its preceding blocks produced)"
)


class ModelStreams(StreamSource):
    """The streams a whole model (the tiny Engram LM) hands each of its Engram layers."""

    name = "model"
    label = MODEL_LABEL

    def __init__(self, lm: TinyEngramLM):
        self.lm = lm

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        # cast: the LM's ModuleDict holds its Engram layers, typed as plain Modules
        engrams = {int(k): cast(Engram, e) for k, e in self.lm.engrams.items()}
        if layer not in engrams:
            raise StreamsError(f"layer {layer} is not an Engram layer of the model; expected one of {sorted(engrams)}")
        seen: dict[str, torch.Tensor] = {}
        device = next(self.lm.parameters()).device
        with engrams[layer].hook_streams.add_hook(lambda x, name: seen.update(x=x.detach().clone())), torch.no_grad():
            self.lm(raw_ids.to(device), (token_types < 0).to(device))
        return Streams(seen["x"], self.note_images(token_types, images), "model", layer, raw_ids, token_types)

    def note_images(self, token_types: torch.Tensor, images: BatchImages = ()) -> str:
        """The label for a forward over ``token_types`` (set as ``self.label``): the tiny LM has no vision
        tower, so its image spans (pictures too) carry no image features, which the label then says."""
        spans = bool((token_types >= 0).any())
        self.label = MODEL_LABEL + (f"; image spans carry the image token's embedding: {NO_FEATURES}" if spans else "")
        return self.label


class EmbeddingStreams(StreamSource):
    """``embedding_streams`` of a checkpoint; its label (weights, image clause) comes with each call."""

    name = "embedding"

    def __init__(self, checkpoint: Any):
        self.checkpoint = checkpoint
        self.label = ""  # filled from streams.embedding_streams on the first call

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        s = embedding_streams(self.checkpoint, raw_ids, token_types)
        self.label = s.label
        return dataclasses.replace(s, layer=layer)


class CapturedStreams(StreamSource):
    """A captured-streams file holding every Engram layer of ``config``; it runs its own prompts."""

    name = "captured"

    def __init__(self, path: Path, config: EngramConfig):
        layers = captured_layers(path)
        missing = [n for n in config.engram_layer_ids if n not in layers]
        if missing:
            raise StreamsError(f"{path} has no streams for Engram layers {missing} (it has {layers})")
        self.path, self.config = path, config
        self.label = f"captured streams from {path.name}"

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        s = load_captured_streams(self.path, layer, self.config)
        assert s.input_ids is not None  # a captured-streams file always holds its input_ids
        if not torch.equal(s.input_ids, raw_ids):
            raise StreamsError(f"{self.path}: its input_ids differ from the prompts being run")
        self.label = s.label.replace(f"entering Engram layer {layer} ", "")
        return s

    def prompts(self) -> list[dict[str, Any]]:
        s = load_captured_streams(self.path, self.config.engram_layer_ids[0], self.config)
        assert s.input_ids is not None  # a captured-streams file always holds its input_ids
        types = s.token_types if s.token_types is not None else torch.full(s.input_ids.shape, TEXT)
        return [
            {"id": f"captured-{i}", "category": "captured", "input_ids": s.input_ids[i], "token_types": types[i]}
            for i in range(len(s.input_ids))
        ]


class CallableStreams(StreamSource):
    """A user ``fn(input_ids [B, T], token_types [B, T], layer) -> x [B, T, hc, dim]``, checked on every call."""

    name = "callable"

    def __init__(self, fn: StreamsFn, config: EngramConfig):
        self.fn, self.config = fn, config
        self.label = f"user streams from {getattr(fn, '__name__', type(fn).__name__)}"

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        x = check_streams(self.fn(raw_ids, token_types, layer), f"streams for layer {layer}", self.config)
        label = self.label + image_clause(token_types, images, None)  # the user's function sees no pixels
        return Streams(x, label, "callable", layer, raw_ids, token_types)


def runs_model_whole(streams: str | Path | StreamsFn) -> bool:
    """False when ``streams`` names a source of its own (embedding, block 0, a captured file, a
    callable): weights that are a whole model then run as Engram layers only."""
    if callable(streams) or (isinstance(streams, str) and streams in ("embedding", "block0")):
        return False
    return not (isinstance(streams, (str, Path)) and Path(streams).suffix == ".safetensors")


def choose_stream_source(
    streams: str | Path | StreamsFn,
    config: EngramConfig,
    *,
    lm: TinyEngramLM | None = None,
    checkpoint: Any = None,
    model_label: str = "",
    mode: str = "fp8",
    device: str = "cpu",
) -> StreamSource:
    """The source ``streams=`` asks for (``Pipeline``'s docstring): ``lm`` is the whole model when the
    weights are one, else ``checkpoint`` holds the Engram layers (``model_label`` names them); ``"model"`` on a
    checkpoint runs its blocks (``block_streams.BlockStreams``, its cache keyed by ``mode`` and ``device``)."""
    if callable(streams):
        return CallableStreams(streams, config)
    if streams == "auto":
        streams = "model" if lm is not None else "embedding"
    if streams == "model":
        if lm is not None:
            return ModelStreams(lm)
        try:
            return BlockStreams.open(checkpoint, config, mode, device)
        except CheckpointError as err:
            raise StreamsError(
                "streams='model' needs weights that are a whole model (the tiny Engram LM) or a checkpoint "
                f"folder holding every block before the last Engram layer; {model_label!r}: {err} "
                "(use 'embedding', 'block0' or a captured-streams file)"
            ) from None
    if streams == "embedding":
        return EmbeddingStreams(checkpoint)
    if streams == "block0":
        return Block0Streams.open(checkpoint, config)
    path = Path(streams)
    if path.is_file():
        return CapturedStreams(path, config)
    raise StreamsError(
        f"streams={streams!r}: expected 'auto', 'model', 'embedding', 'block0', a captured-streams .safetensors file "
        "or a callable (input_ids, token_types, layer) -> x"
    )
