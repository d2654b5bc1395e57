"""The blocks before the last Engram layer, streamed from a checkpoint folder (hf layout), one block at a time.

:func:`open_blocks` reads the safetensors headers of the shards holding ``layers.{n}.*`` for
``n < max(engram_layer_ids)`` and ``embed.weight`` (nothing else), checks every name, dtype and shape
against ``core.block0_config`` / ``core.blocks_config`` and refuses a checkpoint that lacks any of them,
naming the first missing tensors. It returns a :class:`BlocksWeights` (a ``core.blocks.BlocksSource``):

- ``layer(n)`` is a :class:`LayerWeights` that reads block n's dense tensors when first asked (its fp8 GEMM
  weights dequantised to float32: about 0.6 GB at V4.1-Flash widths) and a routed expert only when a batch
  routes tokens to it (dropped right after); the block pass drops the layer after the block, so memory stays
  about one block's dense weights plus the activations. On a device (``device="cuda"``) the tensors move
  there when read; ``resident`` keeps every block read (by default when they all fit).
- token embedding rows are gathered with ``pread`` (``weights.embedding.TokenEmbedding``).
"""

from __future__ import annotations

from pathlib import Path

import torch

from engram_viz.core.block0_config import dense_tensors, expert_names, expert_tensors
from engram_viz.core.blocks_config import BlocksConfig, attention_extras
from engram_viz.core.schema import EMBED_NAME, ENGRAM_RE
from engram_viz.errors import CheckpointError
from engram_viz.weights.block0_reader import Linear, _check, _read_fp4, fp4_gemm, fp8_gemm, locate_tensors
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.index import read_json
from engram_viz.weights.rows import LazyRows
from engram_viz.weights.safetensors import TensorInfo, read_tensor
from engram_viz.weights.scan import MARKER_FILE

TensorSpec = dict[str, tuple[str, tuple[int, ...]]]


def _layer_of(name: str) -> int | None:
    if not name.startswith("layers."):
        return None
    head = name.split(".", 2)[1]
    return int(head) if head.isdigit() else None


def _locate(folder: Path, n_blocks: int) -> dict[str, TensorInfo]:
    """Headers of the shards holding ``layers.{n < n_blocks}.*`` and ``embed.weight``: name -> TensorInfo.
    A block's Engram tensors are the Pipeline's (read by rows; on the Hub their shards stay remote)."""

    def wanted(name: str) -> bool:
        n = _layer_of(name)
        return name == EMBED_NAME or (n is not None and n < n_blocks and not ENGRAM_RE.match(name))

    return locate_tensors(folder, wanted, "the blocks")


def block_tensors(cfg: BlocksConfig, n: int) -> TensorSpec:
    """Every tensor of block ``n`` (routed experts included): name -> (safetensors dtype, shape)."""
    p = f"layers.{n}."
    out = {**dense_tensors(cfg, p), **attention_extras(cfg, n)}
    for e in range(cfg.n_routed_experts):
        out.update(expert_tensors(cfg, e, p))
    return out


def _checked(info: TensorInfo, name: str, dtype: str, shape: tuple[int, ...]) -> TensorInfo:
    if "|" in dtype:  # alternatives, e.g. BF16|F32
        dtype = info.dtype if info.dtype in dtype.split("|") else dtype.split("|")[0]
    return _check(info, name, dtype, shape)


class LayerWeights:
    """Block ``n``'s tensors, read on first use (a ``core.blocks.LayerSource``)."""

    def __init__(
        self, infos: dict[str, TensorInfo], n: int, cfg: BlocksConfig, counter: list[int], device: str = "cpu"
    ):
        self.prefix, self.cfg, self._infos, self._counter = f"layers.{n}.", cfg, infos, counter
        self.device = torch.device(device)
        self._dense: dict[str, torch.Tensor] = {}
        self._linears: dict[str, Linear] = {}

    def has(self, name: str) -> bool:
        return self.prefix + name in self._infos

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._dense:
            self._dense[name] = read_tensor(self._infos[self.prefix + name]).to(self.device)
        return self._dense[name]

    def linear(self, name: str) -> Linear:
        if name not in self._linears:
            w, s = (read_tensor(self._infos[f"{self.prefix}{name}.{k}"]).to(self.device) for k in ("weight", "scale"))
            self._linears[name] = fp8_gemm(w, s)
        return self._linears[name]

    def expert(self, e: int) -> tuple[Linear, Linear, Linear]:
        """Routed expert ``e``'s fp4 GEMMs, read now; nothing is kept after the caller drops them."""
        if not 0 <= e < self.cfg.n_routed_experts:
            raise IndexError(f"expert {e} out of range; the block has {self.cfg.n_routed_experts} routed experts")
        n = expert_names(e, self.prefix)
        self._counter[0] += 1
        w1, w2, w3 = (
            fp4_gemm(
                _read_fp4(self._infos[n[k]]).to(self.device), read_tensor(self._infos[n[k + ".scale"]]).to(self.device)
            )
            for k in ("w1", "w2", "w3")
        )
        return w1, w2, w3


class BlocksWeights:
    """Blocks ``0 .. max(engram_layer_ids) - 1`` + token embedding of a checkpoint (module docstring)."""

    def __init__(
        self,
        folder: Path,
        config: BlocksConfig,
        infos: dict[str, TensorInfo],
        label: str,
        synthetic: bool,
        resident: bool = False,
        device: str = "cpu",
    ):
        self.folder, self.config, self.label, self.synthetic = folder, config, label, synthetic
        self._infos, self.resident, self.device = infos, resident, device
        self._layers: dict[int, LayerWeights] = {}
        self._embed = TokenEmbedding(
            LazyRows(infos[EMBED_NAME], num_rows=config.vocab_size), label=label, synthetic=synthetic
        )
        self._experts = [0]

    @property
    def experts_read(self) -> int:
        """Routed experts loaded so far (each batch loads each used expert of a block once)."""
        return self._experts[0]

    def layer(self, n: int) -> LayerWeights:
        if not 0 <= n < self.config.n_blocks:
            raise IndexError(f"block {n} out of range 0..{self.config.n_blocks - 1}")
        if n in self._layers:
            return self._layers[n]
        lw = LayerWeights(self._infos, n, self.config, self._experts, self.device)
        if self.resident:
            self._layers[n] = lw
        return lw

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor:
        return self._embed.rows(raw_ids).to(self.device)

    def __repr__(self) -> str:
        return f"BlocksWeights({self.label})"


def open_blocks(
    path: str | Path,
    config: BlocksConfig | None = None,
    label: str | None = None,
    resident: bool | None = None,
    device: str = "cpu",
) -> BlocksWeights:
    """The blocks of the checkpoint at ``path`` before its last Engram layer (``config.json`` gives the
    fields unless ``config`` is given); every tensor's name, dtype and shape is checked now, no data read.
    The blocks run on ``device``; ``resident`` (default: on CUDA when every block's dense weights, as
    the GEMMs hold them, and the largest block's experts fit in 80% of the free device memory) keeps
    each block read."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    if config is None:
        config = BlocksConfig.from_dict(read_json(folder / "config.json", "config file"), str(folder / "config.json"))
    infos = _locate(folder, config.n_blocks)
    want: TensorSpec = {EMBED_NAME: ("BF16", (config.vocab_size, config.dim))}
    for n in range(config.n_blocks):
        want.update(block_tensors(config, n))
    missing = [n for n in want if n not in infos]
    if missing:
        first = missing[0]
        dt, shape = want[first]
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(
            f"checkpoint {folder} lacks tensor {first!r} ({dt} {list(shape)}){more}: the model's own streams "
            f"need embed.weight and every tensor of blocks 0..{config.n_blocks - 1}"
        )
    checked = {name: _checked(infos[name], name, dt, shape) for name, (dt, shape) in want.items()}
    synthetic = (folder / MARKER_FILE).is_file()
    label = label or f"{'SYNTHETIC ' if synthetic else ''}blocks 0-{config.n_blocks - 1} + embed.weight of {folder}"
    if resident is None:
        resident = device != "cpu" and torch.cuda.is_available() and _resident_bytes(checked) < 0.8 * _free(device)
    return BlocksWeights(folder, config, checked, label, synthetic, resident, device)


def _resident_bytes(infos: dict[str, TensorInfo]) -> int:
    """Bytes of every block's weights as the GEMMs hold them (float32 dequantised fp8, the rest as stored)."""
    return sum(t.nbytes * (4 if t.dtype == "F8_E4M3" else 1) for n, t in infos.items() if ".experts." not in n)


def _free(device: str) -> int:
    return torch.cuda.mem_get_info(torch.device(device))[0]


def has_blocks(path: str | Path, config: BlocksConfig) -> bool:
    """True when the folder lists a tensor of every block before the last Engram layer."""
    try:
        found = {_layer_of(n) for n in _locate(Path(path), config.n_blocks)}
    except CheckpointError:
        return False
    return all(n in found for n in range(config.n_blocks))


__all__ = ["BlocksWeights", "LayerWeights", "block_tensors", "has_blocks", "open_blocks"]
