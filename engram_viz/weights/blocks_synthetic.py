"""Synthetic blocks 0 .. max(engram_layer_ids) - 1: the reference's names, dtypes and shapes, random values.

Each tensor is drawn as ``weights.block0_synthetic`` draws block 0's (its own generator per name), the
compressor / indexer ones too (bf16 projections ~ N(0, 1 / in), RMSNorm weights ~ 1 + 0.1 N(0, 1)).

- :func:`add_blocks` writes every block into its own shard ``model-block{n}.safetensors`` of an hf-layout
  folder and adds the block fields to ``config.json``; ``write_synthetic_checkpoint(..., blocks=cfg)`` calls it.
- :class:`ProceduralBlocks` serves the same tensors without writing any (a block's dense tensors drawn when
  the pass reaches it, each routed expert when asked for): V4.1-Flash widths for benchmarks.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram_viz.core.block0_config import dense_tensors, expert_names
from engram_viz.core.blocks_config import BlocksConfig, attention_extras
from engram_viz.errors import ConfigError
from engram_viz.weights.block0_reader import fp4_gemm, fp8_gemm
from engram_viz.weights.block0_synthetic import GeneratorFn, block0_tensors, expert_weights
from engram_viz.weights.index import INDEX_FILE

_OWNED_BY_ENGRAM = ("vocab_size", "dim", "hc_mult", "norm_eps", "n_layers", "engram_layer_ids", "compress_ratio")


def block_spec(cfg: BlocksConfig, n: int) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Block ``n``'s tensors but the routed experts, compressor / indexer dtypes resolved to BF16."""
    spec = {**dense_tensors(cfg, f"layers.{n}."), **attention_extras(cfg, n)}
    return {k: (dt.split("|")[0], shape) for k, (dt, shape) in spec.items()}


def drawn_block(cfg: BlocksConfig, n: int, gen: GeneratorFn, experts: bool = True) -> dict[str, torch.Tensor]:
    """Every tensor of block ``n`` (routed experts unless ``experts=False``) by checkpoint name."""
    return block0_tensors(cfg, gen, experts, block_spec(cfg, n), f"layers.{n}.")


def add_blocks(folder: str | Path, cfg: BlocksConfig, gen: GeneratorFn, metadata: dict[str, str] | None = None) -> None:
    """Write blocks ``0 .. n_blocks - 1`` into ``folder`` (one shard a block), list them in the index and put
    the block fields into ``config.json``, whose Engram fields must agree (for folders being built; not atomic)."""
    folder = Path(folder)
    config = json.loads((folder / "config.json").read_text())
    for k in ("vocab_size", "dim", "hc_mult", "n_layers"):
        if config.get(k) != getattr(cfg, k):
            raise ConfigError(
                f"blocks config has {k}={getattr(cfg, k)}; the checkpoint's config.json has {config.get(k)}"
            )
    if tuple(config.get("engram_layer_ids", ())) != cfg.engram_layer_ids:
        raise ConfigError(
            f"blocks config has engram_layer_ids={list(cfg.engram_layer_ids)}; config.json has {config.get('engram_layer_ids')}"
        )
    index = json.loads((folder / INDEX_FILE).read_text())
    for n in range(cfg.n_blocks):
        shard = f"model-block{n}.safetensors"
        tensors = drawn_block(cfg, n, gen)
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / shard), metadata=metadata or {})
        index["weight_map"].update(dict.fromkeys(tensors, shard))
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    fields = {k: list(v) if isinstance(v, tuple) else v for k, v in cfg.to_dict().items() if k not in _OWNED_BY_ENGRAM}
    config.update(fields)
    (folder / "config.json").write_text(json.dumps(config, indent=2))


class _ProceduralLayer:
    """Block n's tensors drawn now (dense) or on request (experts): a ``core.blocks.LayerSource``."""

    def __init__(self, cfg: BlocksConfig, n: int, gen: GeneratorFn, counter: list[int]):
        self.cfg, self.n, self._gen, self._counter, self.prefix = cfg, n, gen, counter, f"layers.{n}."
        self._dense = drawn_block(cfg, n, gen, experts=False)
        self._linears: dict = {}

    def has(self, name: str) -> bool:
        return self.prefix + name in self._dense

    def tensor(self, name: str) -> torch.Tensor:
        return self._dense[self.prefix + name]

    def linear(self, name: str):
        if name not in self._linears:
            p = self.prefix + name
            self._linears[name] = fp8_gemm(self._dense[p + ".weight"], self._dense[p + ".scale"])
        return self._linears[name]

    def expert(self, e: int):
        self._counter[0] += 1
        t, names = expert_weights(self.cfg, e, self._gen, self.prefix), expert_names(e, self.prefix)
        w1, w2, w3 = (fp4_gemm(t[names[k]], t[names[k + ".scale"]]) for k in ("w1", "w2", "w3"))
        return w1, w2, w3


class ProceduralBlocks:
    """A ``core.blocks.BlocksSource`` drawing its tensors (no disk), labelled SYNTHETIC."""

    def __init__(self, cfg: BlocksConfig, gen: GeneratorFn, embed: Callable[[torch.Tensor], torch.Tensor], label: str):
        self.config, self._gen, self._embed, self.label = cfg, gen, embed, label
        self.synthetic = True
        self._experts = [0]

    @property
    def experts_read(self) -> int:
        return self._experts[0]

    def layer(self, n: int) -> _ProceduralLayer:
        return _ProceduralLayer(self.config, n, self._gen, self._experts)

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor:
        return self._embed(raw_ids)
