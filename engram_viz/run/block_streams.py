"""``streams="model"`` on a checkpoint: every Engram layer reads the streams the model itself produced.

:class:`BlockStreams` runs embed + blocks ``0 .. max(engram_layer_ids) - 1`` (``core.blocks.BlockPass``,
weights streamed block by block from ``weights.blocks_reader``) and hands each Engram layer the streams
its preceding blocks made. It *chains* with the Pipeline: after Engram layer n runs, the Pipeline gives
its output back (:meth:`BlockStreams.engram_output`) and the blocks after n continue from it, as in the
reference ``Transformer.forward``. One pass per batch; a progress bar per block when asked.

Cache: a finished pass is kept as a captured-streams file (``run.streams`` format, every Engram layer)
in ``cache_dir()/streams/``, named by a digest of the checkpoint (its folder, ``config.json`` and index),
the Engram mode, the device kind and the batch's ids and token types, with a sha256 sidecar
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
from engram_viz.errors import CheckpointError
from engram_viz.run.streams import BatchImages, Streams, StreamSource, image_clause, save_captured_streams
from engram_viz.settings import cache_dir
from engram_viz.weights.blocks_reader import open_blocks
from engram_viz.weights.index import INDEX_FILE


def _digest(folder: Path, extra: str, ids: torch.Tensor, types: torch.Tensor) -> str:
    h = hashlib.sha256(f"{folder.resolve()}|{extra}".encode())
    for name in ("config.json", INDEX_FILE):
        if (folder / name).is_file():
            h.update((folder / name).read_bytes())
    h.update(ids.to(torch.int64).contiguous().numpy().tobytes())
    h.update(types.to(torch.int64).contiguous().numpy().tobytes())
    return h.hexdigest()[:32]


class BlockStreams(StreamSource):
    """The model's own streams from a checkpoint's blocks (module docstring); ``name`` ``"model"``."""

    name = "model"
    chains = True  # the Pipeline hands each Engram layer's output back (engram_output)

    def __init__(self, weights: BlocksSource, config: EngramConfig, cache_key: str | None = None):
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
        layers = ", ".join(map(str, config.engram_layer_ids))
        self.label = (
            f"the model's own streams: embed + blocks 0-{b.n_blocks - 1} of {weights.label}, computed here "
            f"(each Engram layer's output feeds the blocks after it) - layers {layers}: true streams"
        )
        self._label = self.label
        self.progress = False  # a bar per batch over the blocks
        self._batch: tuple[torch.Tensor, torch.Tensor] | None = None
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
        return cls(open_blocks(folder, device=device), config, cache_key=f"{folder.resolve()}|{mode}|{device}")

    def _cache_file(self, ids: torch.Tensor, types: torch.Tensor) -> Path | None:
        if self.cache_key is None:
            return None
        folder = Path(self.cache_key.split("|", 1)[0])
        return cache_dir() / "streams" / f"{_digest(folder, self.cache_key, ids, types)}.safetensors"

    def _start(self, ids: torch.Tensor, types: torch.Tensor) -> None:
        self._batch, self._pass, self._done = (ids, types), None, {}
        path = self._cache_file(ids, types)
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

        self._pass = BlockPass(self.weights, ids, types >= 0, on_block=advance)
        self.passes += 1

    def __call__(
        self, raw_ids: torch.Tensor, token_types: torch.Tensor, layer: int, images: BatchImages = ()
    ) -> Streams:
        ids, types = raw_ids.cpu(), token_types.cpu()  # the pass moves what it needs to the blocks' device
        if self._batch is None or not (torch.equal(self._batch[0], ids) and torch.equal(self._batch[1], types)):
            self._start(ids, types)
        if layer not in self._done:
            assert self._pass is not None  # a cache hit holds every layer
            self._done[layer] = self._pass.streams_entering(layer)
            if len(self._done) == len(self.config.engram_layer_ids):
                self._save(ids, types)
        self.label = self._label + image_clause(types, images, None)  # the blocks merge no picture features yet
        return Streams(self._done[layer], self.label, "model", layer, ids, types)

    def engram_output(self, layer: int, out: torch.Tensor) -> None:
        """Engram layer ``layer``'s output for the current batch: the blocks after it continue from it."""
        if self._pass is not None and self._pass.waiting == layer and layer != max(self.config.engram_layer_ids):
            self._pass.engram_output(out.detach().cpu())

    def _save(self, ids: torch.Tensor, types: torch.Tensor) -> None:
        path = self._cache_file(ids, types)
        if path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        with cached_path(path, suffix=".safetensors") as tmp:
            save_captured_streams(tmp, self._done, ids, types, {"description": self._label})

    def save(self, path: str | Path) -> Path:
        """The last batch's streams of every Engram layer as a captured-streams file (reusable as ``streams=path``)."""
        if self._batch is None or len(self._done) < len(self.config.engram_layer_ids):
            raise CheckpointError("BlockStreams.save: no finished batch yet; run the Pipeline first")
        return save_captured_streams(path, self._done, *self._batch, {"description": self._label})
