"""Opening a GGUF file as a suite ``Checkpoint``: its Engram tables lazy, the small tensors read.

The recipe: open the file (``gguf_file.open_gguf``), take the names (``core/schema.gguf_names``
with a fork's own on top), resolve the config (given; else the suite's own ``config.json`` that
files written by the suite carry; else ``v41-flash``), check the Engram constants in the metadata
against the layout and the token map (``gguf_constants.py``), open each Engram layer (the table a
``GGUFTable``, wkv/q/k dequantised whole: they are small), then the token embedding (a tiny LM's
compact one, or ``token_embd.weight`` read by row). Every problem is a ``CheckpointError`` naming
the file and the tensor or key.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch

from engram_viz.config import EngramConfig
from engram_viz.core.schema import gguf_names, wkv_shape
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError
from engram_viz.weights.checkpoint import Checkpoint, EngramWeights
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.gguf_constants import check_gguf_constants
from engram_viz.weights.gguf_file import (
    GGUFFile,
    GGUFTensor,
    decode_blocks,
    gguf_config,
    open_gguf,
    read_small,
    suite_config,
)
from engram_viz.weights.gguf_table import GGUFTable, block_rows
from engram_viz.weights.rows import RowSource
from engram_viz.weights.tiny_folder import compact_embedding

LAYOUT_GGUF = "gguf"
TINY_EMBED = ("tiny.embed.weight", "tiny.embed.raw_ids")


class DecodedRows(RowSource):
    """Rows of a GGUF matrix of any type, dequantised and rounded to bf16 (the token embedding)."""

    def __init__(self, t: GGUFTensor):
        self.tensor, self.blocks = t, block_rows(t)
        self.num_rows, self.cols, self.dtype = t.rows, t.cols, torch.bfloat16
        self.label = f"{t.name} ({t.type_name}) in {t.path}"

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        raw = self.blocks.read_unique(ids).numpy()
        return torch.from_numpy(decode_blocks(raw, self.tensor.qtype, self.cols, self.label)).to(torch.bfloat16)


def _matrix(file: GGUFFile, name: str, shape: tuple[int, ...], what: str) -> torch.Tensor:
    t = file.tensor(name, what)
    if t.shape != shape:
        raise CheckpointError(f"{t.where()}: {what} must have shape {list(shape)} (numpy order)")
    return read_small(t)


def _open_layer(file: GGUFFile, cfg: EngramConfig, names: dict[str, str], layer_id: int, rows: int) -> EngramWeights:
    table_name = names["table_weight"].format(layer=layer_id)
    t = file.tensor(table_name, f"Engram layer {layer_id}")
    if len(t.shape) != 2 or t.cols != cfg.engram_head_dim or t.rows < rows:
        raise CheckpointError(
            f"{t.where()}: the table of layer {layer_id} must be [{rows:,}, {cfg.engram_head_dim}] "
            f"(config {cfg.name!r}; GGUF order [{cfg.engram_head_dim}, {rows:,}])"
        )
    table = GGUFTable.open(file, table_name, num_rows=rows)
    hc = (cfg.hc_mult, cfg.dim)
    return EngramWeights(
        layer_id=layer_id,
        table=table,
        wkv_weight=_matrix(
            file, names["wkv_weight"].format(layer=layer_id), wkv_shape(cfg), f"wkv of layer {layer_id}"
        ),
        wkv_scale=None,
        q_weight=_matrix(file, names["q_weight"].format(layer=layer_id), hc, "q_weight").to(torch.bfloat16),
        k_weight=_matrix(file, names["k_weight"].format(layer=layer_id), hc, "k_weight").to(torch.bfloat16),
    )


def _embedding(file: GGUFFile, cfg: EngramConfig, names: dict[str, str], label: str) -> TokenEmbedding:
    if all(n in file.tensors for n in TINY_EMBED):  # a tiny LM's compact embedding
        weight = read_small(file.tensors[TINY_EMBED[0]]).to(torch.bfloat16)
        return compact_embedding(weight, read_small(file.tensors[TINY_EMBED[1]]), cfg.vocab_size, str(file.path), label)
    t = file.tensor(names["token_embedding"], "the token embedding")
    if t.shape != (cfg.vocab_size, cfg.dim):
        raise CheckpointError(f"{t.where()}: the token embedding must be [{cfg.vocab_size}, {cfg.dim}]")
    return TokenEmbedding(DecodedRows(t), label=f"token embedding {t.name} ({t.type_name}) of {file.path}")


def gguf_label(file: GGUFFile, raw: dict | None, key: str) -> str:
    """What every output says about these weights: the suite's label (``raw``: the suite config the
    file carries, or None) or the file's name, with the GGML types of its tables and its path."""
    types = sorted({t.type_name for n, t in file.tensors.items() if "engram_embd" in n})
    base = str((raw or {}).get("label") or f"GGUF file {file.path.name}")
    return f"{base} ({'/'.join(types) or 'no'} tables, {file.path})"


def open_gguf_checkpoint(
    path: str | Path, config: EngramConfig | str | Path | None = None, names: Mapping[str, str] | None = None
) -> Checkpoint:
    """Open a GGUF file as a ``Checkpoint``: constants checked, tables lazy, small tensors read.
    ``names``: a fork's own tensor or metadata names over ``core/schema.GGUF_NAMES`` (same roles)."""
    file = open_gguf(path)
    names_map = gguf_names(names)
    cfg = gguf_config(file, config, names_map["config"])
    token_map = None
    if file.value(names_map["token_map"].format(arch=file.arch)) is not None:
        token_map = get_tokenizer(cfg).token_map
    check_gguf_constants(file, cfg, token_map, names_map)
    label = gguf_label(file, suite_config(file, names_map["config"]), names_map["config"])
    layers = {
        layer_id: _open_layer(file, cfg, names_map, layer_id, rows)
        for layer_id, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings)
    }
    return Checkpoint(
        config=cfg,
        path=file.path,
        label=label,
        synthetic=False,
        layers=layers,
        embed=_embedding(file, cfg, names_map, label),
        layout=LAYOUT_GGUF,
        files=(file.path,),
    )
