"""Block 0's tensors and the token embedding, read lazily from a checkpoint folder (hf layout).

:func:`open_block0` reads the safetensors headers of the shards that hold ``layers.0.*`` and
``embed.weight`` (about 8.15 GiB of V4.1-Flash's checkpoint; nothing else is touched), checks every
name, dtype and shape against :mod:`engram_viz.core.block0_config`, and returns a
:class:`Block0Weights` (a ``core.block0.Block0Source``):

- dense tensors are read on first use and kept (their dequantised fp8 GEMM weights in float32:
  about 0.6 GB at V4.1-Flash widths);
- a routed expert (fp4, about 19 MB on disk) is read and dequantised when a batch routes tokens to
  it and dropped after (``expert(e)``), so memory stays bounded by one expert at a time;
- token embedding rows are gathered with ``pread`` (``weights.embedding.TokenEmbedding``).

fp4 tensors are accepted as safetensors ``F4`` (logical shape ``[out, in]``, two values a byte, as
``safetensors`` writes ``torch.float4_e2m1fn_x2``) or as ``I8`` / ``U8`` ``[out, in / 2]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch

from engram_viz.core import fp4, fp8
from engram_viz.core.block0_config import (
    PREFIX,
    V41_FLASH_BLOCK0,
    Block0Config,
    dense_tensors,
    expert_names,
    expert_tensors,
)
from engram_viz.core.schema import EMBED_NAME
from engram_viz.errors import CheckpointError
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.index import INDEX_FILE, read_json, read_weight_map
from engram_viz.weights.rows import LazyRows
from engram_viz.weights.safetensors import TensorInfo, read_safetensors_header, read_tensor
from engram_viz.weights.scan import MARKER_FILE, SINGLE_FILE

Linear = Callable[[torch.Tensor], torch.Tensor]
FP4_PACKED = ("I8", "U8")


def locate_tensors(folder: Path, wanted: Callable[[str], bool], what: str) -> dict[str, TensorInfo]:
    """Headers of the shards holding the tensors ``wanted`` picks: name -> TensorInfo. ``what`` names
    the caller in the error for a folder without the hf layout (the mp parts split GEMMs by rank)."""
    index = folder / INDEX_FILE
    if index.is_file():
        shards = sorted({s for n, s in read_weight_map(folder, index).items() if wanted(n)})
    elif (folder / SINGLE_FILE).is_file():
        shards = [SINGLE_FILE]
    else:
        raise CheckpointError(
            f"checkpoint {folder}: {what} need the hf layout ({INDEX_FILE} or {SINGLE_FILE}); "
            "the model{i}-mp{n} parts split their GEMMs by rank"
        )
    found: dict[str, TensorInfo] = {}
    for shard in shards:
        header = read_safetensors_header(folder / shard)
        found.update({n: t for n, t in header.tensors.items() if wanted(n)})
    return found


def _locate(folder: Path) -> dict[str, TensorInfo]:
    """Headers of the shards holding ``layers.0.*`` and ``embed.weight``: name -> TensorInfo."""
    return locate_tensors(folder, lambda n: n.startswith(PREFIX) or n == EMBED_NAME, "block-0 streams")


def _check(info: TensorInfo, name: str, dtype: str, shape: tuple[int, ...]) -> TensorInfo:
    if dtype == "F4" and info.dtype in FP4_PACKED:
        want_shape, ok = (shape[0], shape[1] // 2), True
    else:
        want_shape, ok = shape, info.dtype == dtype
    if not ok or tuple(info.shape) != tuple(want_shape):
        raise CheckpointError(
            f"{info.path}: tensor {name!r} is {info.dtype} {list(info.shape)}; expected {dtype} {list(shape)}"
        )
    if dtype == "F4" and info.nbytes != shape[0] * shape[1] // 2:
        raise CheckpointError(
            f"{info.path}: tensor {name!r} spans {info.nbytes} bytes; fp4 {list(shape)} needs {shape[0] * shape[1] // 2}"
        )
    return info


def _read_fp4(info: TensorInfo) -> torch.Tensor:
    """An fp4 tensor's bytes as uint8 ``[out, in / 2]`` (whatever dtype string it is stored under)."""
    rows = info.shape[0]
    return read_tensor(replace(info, dtype="U8", shape=(rows, info.nbytes // rows)))


def fp8_gemm(weight: torch.Tensor, scale: torch.Tensor) -> Linear:
    """The reference fp8 GEMM of an e4m3 weight with 32 x 32 e8m0 block scales (dequantised once)."""
    w = fp8.dequantize_blocks(weight, scale)
    return lambda x: fp8.linear_fp8_activations(x, w)


def fp4_gemm(packed: torch.Tensor, scale: torch.Tensor) -> Linear:
    """The reference fp4 GEMM of a packed e2m1 weight with per-32 e8m0 scales (dequantised once)."""
    w = fp4.dequantize_fp4(packed, scale)
    return lambda x: fp4.linear_fp4(x, w)


class Block0Weights:
    """Block 0 + token embedding of a checkpoint, read lazily (see the module docstring)."""

    def __init__(self, folder: Path, config: Block0Config, infos: dict[str, TensorInfo], label: str, synthetic: bool):
        self.folder, self.config, self.label, self.synthetic = folder, config, label, synthetic
        self._infos = infos
        self._dense: dict[str, torch.Tensor] = {}
        self._linears: dict[str, Linear] = {}
        self._embed = TokenEmbedding(
            LazyRows(infos[EMBED_NAME], num_rows=config.vocab_size), label=label, synthetic=synthetic
        )
        self.experts_read = 0  # routed experts loaded so far (each batch loads each used expert once)

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._dense:
            self._dense[name] = read_tensor(self._infos[PREFIX + name])
        return self._dense[name]

    def linear(self, name: str) -> Linear:
        """The fp8 GEMM of ``layers.0.{name}`` (weight dequantised once, float32)."""
        if name not in self._linears:
            info = self._infos
            self._linears[name] = fp8_gemm(
                read_tensor(info[f"{PREFIX}{name}.weight"]), read_tensor(info[f"{PREFIX}{name}.scale"])
            )
        return self._linears[name]

    def expert(self, e: int) -> tuple[Linear, Linear, Linear]:
        """Routed expert ``e``'s fp4 GEMMs (w1, w2, w3), read now; nothing is kept after the caller drops them."""
        if not 0 <= e < self.config.n_routed_experts:
            raise IndexError(f"expert {e} out of range; block 0 has {self.config.n_routed_experts} routed experts")
        n = expert_names(e)
        self.experts_read += 1
        w1, w2, w3 = (
            fp4_gemm(_read_fp4(self._infos[n[k]]), read_tensor(self._infos[n[k + ".scale"]]))
            for k in ("w1", "w2", "w3")
        )
        return w1, w2, w3

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor:
        return self._embed.rows(raw_ids)

    def __repr__(self) -> str:
        return f"Block0Weights({self.label})"


def open_block0(path: str | Path, config: Block0Config | None = None, label: str | None = None) -> Block0Weights:
    """Block 0 of the checkpoint at ``path`` (its ``config.json`` gives the block-0 fields unless
    ``config`` is given); every block-0 tensor's name, dtype and shape is checked now, no data read."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    infos = _locate(folder)
    if not any(n.startswith(PREFIX) for n in infos):
        raise CheckpointError(
            f"checkpoint {folder} has no block-0 tensors (no '{PREFIX}*' name in its shards): block-0 streams "
            f"need {PREFIX}hc_attn_*, hc_ffn_*, attn_norm, ffn_norm, attn.*, ffn.gate.*, ffn.shared_experts.* and "
            f"ffn.experts.{{e}}.* ({_count(V41_FLASH_BLOCK0)} tensors in V4.1-Flash) and {EMBED_NAME}"
            f"{'' if EMBED_NAME in infos else ' (missing too)'}"
        )
    if config is None:
        raw = read_json(folder / "config.json", "config file")
        config = Block0Config.from_dict(raw, str(folder / "config.json"))
    want = {**dense_tensors(config), EMBED_NAME: ("BF16", (config.vocab_size, config.dim))}
    for e in range(config.n_routed_experts):
        want.update(expert_tensors(config, e))
    missing = [f"{n!r} ({dt} {list(shape)})" for n, (dt, shape) in want.items() if n not in infos]
    if missing:
        more = f", and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise CheckpointError(
            f"checkpoint {folder}: {len(missing)} of {len(want)} block-0 tensors are missing: "
            f"{', '.join(missing[:4])}{more}"
        )
    checked = {name: _check(infos[name], name, dt, shape) for name, (dt, shape) in want.items()}
    synthetic = (folder / MARKER_FILE).is_file()
    label = label or (f"{'SYNTHETIC ' if synthetic else ''}block 0 + embed.weight of {folder}")
    return Block0Weights(folder, config, checked, label, synthetic)


def _count(config: Block0Config) -> int:
    """How many tensors block 0 has (routed experts included), the embedding not counted."""
    return len(dense_tensors(config)) + config.n_routed_experts * len(expert_tensors(config, 0))


def has_block0(path: str | Path) -> bool:
    """True when the folder's index (or single file) lists block-0 tensors."""
    try:
        return any(n.startswith(PREFIX) for n in _locate(Path(path)))
    except CheckpointError:
        return False


__all__ = ["Block0Weights", "fp4_gemm", "fp8_gemm", "has_block0", "open_block0"]
