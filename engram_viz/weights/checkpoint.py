"""Opening a checkpoint: a real DeepSeek-V4.1-Flash folder's Engram tensors, checked and loaded.

``open_checkpoint(path)`` scans the folder (``scan.py``: the ``hf`` and ``mp`` layouts), checks
every tensor the config needs (``validate.py``; names, dtypes and shapes in ``core/schema.py``)
and loads it: tables lazily (``LazyTable``), the token embedding lazily (``TokenEmbedding``), the
small tensors (``wkv``, ``q_weight``, ``k_weight``) eagerly, each checked for NaN/Inf
(``finite.py``; table and embedding rows are checked when gathered). A Hub checkpoint's Engram
shards stay on the Hub: their rows are read by byte ranges (``remote_rows.py``) and
``Checkpoint.remote_reads`` counts what came from the Hub and what from the row cache. Every problem raises a
``CheckpointError`` naming the file and the tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from engram_viz.config import EngramConfig
from engram_viz.core.schema import EMBED_NAME, engram_names
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.hub_shards import is_remote_shard
from engram_viz.weights.remote_rows import RemoteReads, read_small, tensor_rows
from engram_viz.weights.safetensors import TensorInfo
from engram_viz.weights.scan import LAYOUT_HF, scan_checkpoint
from engram_viz.weights.schema_check import resolve_config, validated_parts
from engram_viz.weights.tables import EngramTable, LazyTable
from engram_viz.weights.tiny_folder import compact_token_embedding


@dataclass
class EngramWeights:
    """One Engram layer's weights: the table (lazy or procedural) and the eager small tensors.

    ``wkv_weight`` e4m3 ``[dim * (hc + 1), n_hash_cols * head_dim]`` with e8m0 block scales
    ``wkv_scale`` ``[ceil(N / 32), ceil(K / 32)]`` (or float32 with ``wkv_scale`` None: a GGUF file's
    wkv, dequantised when read); ``q_weight`` and ``k_weight`` bf16 ``[hc, dim]``.
    """

    layer_id: int
    table: EngramTable
    wkv_weight: torch.Tensor
    wkv_scale: torch.Tensor | None
    q_weight: torch.Tensor
    k_weight: torch.Tensor


@dataclass
class Checkpoint:
    """An opened checkpoint: config, per-layer Engram weights and the token embedding.

    ``label`` says where the weights come from and, for synthetic ones, starts with ``SYNTHETIC``.
    ``path`` is None for the procedural synthetic checkpoint. ``embed.rows(raw_ids [...])`` gives
    bf16 ``[..., dim]``.
    """

    config: EngramConfig
    path: Path | None
    label: str
    synthetic: bool
    layers: dict[int, EngramWeights]
    embed: TokenEmbedding
    tokenizer_path: Path | None = None
    layout: str = LAYOUT_HF
    files: tuple[Path, ...] = field(default_factory=tuple)
    remote_reads: RemoteReads | None = None  # what was read from shards left on the Hub, and from the row cache

    def layer(self, layer_id: int) -> EngramWeights:
        """The weights of Engram layer ``layer_id``; ``KeyError`` naming the Engram layers otherwise."""
        if layer_id not in self.layers:
            raise KeyError(
                f"layer {layer_id} is not an Engram layer of {self.label}; expected one of {sorted(self.layers)}"
            )
        return self.layers[layer_id]


def _open_layer(
    parts: dict[str, list[TensorInfo]],
    layer_id: int,
    rows: int,
    where: Path,
    prefix: str,
    synthetic: bool,
    reads: RemoteReads,
) -> EngramWeights:
    """Layer ``layer_id``'s weights from its checked tensor parts: the table lazy, the rest read."""
    names = engram_names(layer_id)
    table = LazyTable(
        tensor_rows(parts[names["table_weight"]], rows, reads),
        tensor_rows(parts[names["table_scale"]], rows, reads),
        label=f"{prefix}table layers.{layer_id}.engram.embed of {where}",
        synthetic=synthetic,
    )
    return EngramWeights(
        layer_id=layer_id,
        table=table,
        wkv_weight=read_small(parts[names["wkv_weight"]][0], reads),
        wkv_scale=read_small(parts[names["wkv_scale"]][0], reads),
        q_weight=read_small(parts[names["q_weight"]][0], reads),
        k_weight=read_small(parts[names["k_weight"]][0], reads),
    )


def open_checkpoint(path: str | Path, config: EngramConfig | str | Path | None = None) -> Checkpoint:
    """Open a checkpoint folder (HF or mp layout) or a Hub repository (``hf://owner/repo[@revision]``:
    its Engram shards fetched into the Hub cache, ``hub.py``), check every Engram tensor against the
    config (the folder's ``config.json`` unless ``config`` is given) and load: tables lazily, the rest eagerly."""
    scan = scan_checkpoint(path)
    cfg = resolve_config(scan, config)
    parts = validated_parts(scan, cfg)
    synthetic = scan.synthetic
    label = scan.label(cfg)
    prefix = "SYNTHETIC " if synthetic else ""
    reads = RemoteReads()
    layers = {
        layer_id: _open_layer(parts, layer_id, rows, scan.path, prefix, synthetic, reads)
        for layer_id, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings)
    }
    if EMBED_NAME in parts:
        embed = TokenEmbedding(
            tensor_rows(parts[EMBED_NAME], cfg.vocab_size, reads),
            label=f"{prefix}token embedding embed.weight of {scan.path}",
            synthetic=synthetic,
        )
    else:  # a tiny Engram LM folder: its compact embedding over the raw ids it knows
        embed = compact_token_embedding(scan.path, label)
    return Checkpoint(
        config=cfg,
        path=scan.path,
        label=label,
        synthetic=synthetic,
        layers=layers,
        embed=embed,
        tokenizer_path=scan.tokenizer_path,
        layout=scan.layout,
        files=tuple(scan.files),
        remote_reads=reads if any(is_remote_shard(p) for p in scan.files) else None,
    )
