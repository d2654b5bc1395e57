"""``streams="model"`` on a checkpoint: every Engram layer reads the streams the model itself produced.

:class:`BlockStreams` runs embed + blocks ``0 .. max(engram_layer_ids) - 1`` (``core.blocks.BlockPass``,
weights streamed block by block from ``weights.blocks_reader``) and hands each Engram layer the streams
its preceding blocks made. It *chains* with the Pipeline: after Engram layer n runs, the Pipeline gives
its output back (:meth:`BlockStreams.engram_output`) and the blocks after n continue from it, as in the
reference ``Transformer.forward``. One pass per batch; a progress bar per block when asked. Pictures: when the
checkpoint has a vision tower, each prompt's real pictures are merged into the embeddings before block 0, where
block 0's path (``streams="block0"``) and the reference merge them (``core.blocks.embedded_streams``); the label
says which spans carry image features and which (placeholders, or no tower) do not.

One arithmetic for the whole pass: the blocks' fp8 GEMMs multiply float32 operands
(``fp8.linear_fp8_activations``), and the Engram layers chained between them must do the same
(:data:`ENGRAM_GEMM`, which the Pipeline sets on its Engram layers). ``gemm="auto"`` would take the bf16-operand
GEMM on a CPU with bf16 kernels or on CUDA: its float32 sums run in another order, a few ``wkv`` elements land one
bf16 step apart, and the blocks after the layer amplify that (MoE routing and the indexer's top-k are
discontinuous): on the test stacks of ``tests/blocks_kit.py`` at 1,200 tokens, one layer-1 output element
one step off grew to 13,699 steps and gates 0.38 apart at layer 6 (``benchmarks/results/blocks_grid.txt``).
The wkv GEMM is a small part of a pass (next to 13 blocks of GEMMs of its size and more), so nothing is lost.

Cache: a finished pass is kept as a captured-streams file (``run.streams`` format, every Engram layer)
in ``cache_dir()/streams/``, named by a digest of the checkpoint (its folder, ``config.json`` and index),
the Engram mode, the device kind, the wkv GEMM and the batch's ids, token types and merged pictures, with a sha256 sidecar
(``_cache``); the same batch later reads it instead of running the blocks.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from engram_viz._cache import cached_path, is_verified
from engram_viz._progress import progress_bar
from engram_viz.config import EngramConfig
from engram_viz.core.blocks import BlockPass, BlocksSource
from engram_viz.core.vit import VisionSource
from engram_viz.errors import CheckpointError
from engram_viz.run.streams import (
    BatchImages,
    Streams,
    StreamSource,
    check_vision,
    folder_vision,
    image_clause,
    save_captured_streams,
    vision_features,
)
from engram_viz.settings import cache_dir
from engram_viz.weights.blocks_reader import open_blocks
from engram_viz.weights.index import INDEX_FILE

ENGRAM_GEMM = "float32"  # the wkv GEMM of Engram layers chained with the blocks (module docstring)


def _digest(folder: Path, extra: str, ids: torch.Tensor, types: torch.Tensor, images: BatchImages) -> str:
    h = hashlib.sha256(f"{folder.resolve()}|{extra}".encode())
    for name in ("config.json", INDEX_FILE):
        if (folder / name).is_file():
            h.update((folder / name).read_bytes())
    for t in (ids, types):
        h.update(t.to(torch.int64).contiguous().numpy().tobytes())
    for b, row in enumerate(images):  # the merged pictures: where, their grid and their pixels
        for img in row:
            h.update(f"|{b} {img.start} {img.n_h} {img.n_w}|".encode())
            h.update(img.patches.float().contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


class BlockStreams(StreamSource):
    """The model's own streams from a checkpoint's blocks (module docstring); ``name`` ``"model"``."""

    name = "model"
    chains = True  # the Pipeline hands each Engram layer's output back (engram_output)
    engram_gemm = ENGRAM_GEMM  # ... and runs those layers' wkv on the blocks' GEMM operands

    def __init__(
        self,
        weights: BlocksSource,
        config: EngramConfig,
        cache_key: str | None = None,
        vision: VisionSource | None = None,
    ):
        b = weights.config
        if (b.vocab_size, b.dim, b.hc_mult) != (config.vocab_size, config.dim, config.hc_mult) or tuple(
            b.engram_layer_ids
        ) != tuple(config.engram_layer_ids):
            raise CheckpointError(
                f"the blocks of {weights.label} have (vocab_size, dim, hc_mult, engram_layer_ids) = "
                f"{(b.vocab_size, b.dim, b.hc_mult, list(b.engram_layer_ids))}; config {config.name!r} has "
                f"{(config.vocab_size, config.dim, config.hc_mult, list(config.engram_layer_ids))}"
            )
        self.weights, self.config, self.cache_key = weights, config, cache_key
        self.vision = check_vision(vision, config)
        layers = ", ".join(map(str, config.engram_layer_ids))
        self.label = (
            f"the model's own streams: embed + blocks 0-{b.n_blocks - 1} of {weights.label}, computed here "
            f"(each Engram layer's output feeds the blocks after it) - layers {layers}: true streams"
        )
        self._label = self.label
        self.progress = False  # a bar per batch over the blocks
        self._batch: tuple[torch.Tensor, torch.Tensor, BatchImages] | None = None
        self._pass: BlockPass | None = None
        self._done: dict[int, torch.Tensor] = {}  # this batch's streams by layer (from the pass or the cache)
        self.passes = 0  # block passes run (cache hits do not count)

    @classmethod
    def open(cls, checkpoint: Any, config: EngramConfig, mode: str = "fp8", device: str = "cpu") -> BlockStreams:
        """From an opened checkpoint with a folder (``checkpoint.path``) holding every block's tensors."""
        folder = getattr(checkpoint, "path", None)
        if folder is None:
            raise CheckpointError(
                f"streams='model' reads the blocks from a checkpoint folder; {getattr(checkpoint, 'label', checkpoint)!r} "
                "has none (in-memory weights)"
            )
        folder = Path(folder)
        folder = folder.parent if folder.is_file() else folder
        return cls(
            open_blocks(folder, device=device),
            config,
            cache_key=f"{folder.resolve()}|{mode}|{device}|wkv {ENGRAM_GEMM}",
            vision=folder_vision(folder),
        )

    def _cache_file(self, ids: torch.Tensor, types: torch.Tensor, images: BatchImages) -> Path | None:
        if self.cache_key is None:
            return None
        folder = Path(self.cache_key.split("|", 1)[0])
        return cache_dir() / "streams" / f"{_digest(folder, self.cache_key, ids, types, images)}.safetensors"

    def _start(self, ids: torch.Tensor, types: torch.Tensor, images: BatchImages) -> None:
        self._batch, self._pass, self._done = (ids, types, images), None, {}
        path = self._cache_file(ids, types, images)
        if path is not None and is_verified(path):
            saved = load_file(str(path))
            self._done = {n: saved[f"streams.L{n}"] for n in self.config.engram_layer_ids}
            return
        last = self.weights.config.n_blocks - 1
        bar = progress_bar(total=last + 1, desc="blocks", unit="block", disable=not self.progress)

        def advance(n: int) -> None:
            bar.update(1)
            if n == last:
                bar.close()

        self._pass = BlockPass(self.weights, ids, types >= 0, advance, images, self.vision)
        self.passes += 1

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        ids, types = raw_ids.cpu(), token_types.cpu()  # the pass moves what it needs to the blocks' device
        merged = images if self.vision is not None else ()  # pictures need the tower to encode them
        batch = self._batch
        if batch is None or not (torch.equal(batch[0], ids) and torch.equal(batch[1], types) and batch[2] is merged):
            self._start(ids, types, merged)
        self.label = self._label + image_clause(types, images, vision_features(self.vision))
        if layer not in self._done:
            assert self._pass is not None  # a cache hit holds every layer
            self._done[layer] = self._pass.streams_entering(layer)
            if len(self._done) == len(self.config.engram_layer_ids):
                self._save()
        return Streams(self._done[layer], self.label, "model", layer, ids, types)

    def engram_output(self, layer: int, out: torch.Tensor) -> None:
        """Engram layer ``layer``'s output for the current batch: the blocks after it continue from it."""
        if self._pass is not None and self._pass.waiting == layer and layer != max(self.config.engram_layer_ids):
            self._pass.engram_output(out.detach().cpu())

    def _save(self) -> None:
        assert self._batch is not None
        path = self._cache_file(*self._batch)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with cached_path(path, suffix=".safetensors") as tmp:
            save_captured_streams(tmp, self._done, *self._batch[:2], {"description": self.label})

    def save(self, path: str | Path) -> Path:
        """The last batch's streams of every Engram layer as a captured-streams file (reusable as ``streams=path``)."""
        if self._batch is None or len(self._done) < len(self.config.engram_layer_ids):
            raise CheckpointError("BlockStreams.save: no finished batch yet; run the Pipeline first")
        return save_captured_streams(path, self._done, *self._batch[:2], {"description": self.label})
