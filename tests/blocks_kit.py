"""Small reference-structured checkpoints with compressed-KV blocks, for the block tests (not a test module).

Engram layers 1 and 6 (so blocks 0-5 run, a small model's numbers, not V4.1-Flash's): blocks 0-1 window
only, 2-5 compressed 2-to-1; layer 2 is a kv and index source, 3 reuses both, 4 runs its own indexer on
layer 2's keys, 5 is the next kv and index source. ``index_topk`` 16: prompts past 32 tokens make the
indexer choose.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch
from block0_kit import SMALL_WIDTHS

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.blocks import model_streams
from engram_viz.core.blocks_config import V41_FLASH_BLOCKS, BlocksConfig
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.block_streams import ENGRAM_GEMM
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.blocks_reader import open_blocks
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint

ENGRAM_LAYERS = (1, 6)
INDEX_TOPK = 16
# V4.1-Flash's own layer structure (blocks 0-13, kv and index sources 2 and 8) at small widths
SMALL_V41 = replace(
    V41_FLASH_BLOCKS, **SMALL_WIDTHS, index_n_heads=4, index_head_dim=32, index_topk=INDEX_TOPK, original_seq_len=64
)
WIDTHS = {
    64: {"n_heads": 4, "head_dim": 64},
    128: {"n_heads": 4, "head_dim": 64, "q_lora_rank": 64, "moe_inter_dim": 96},
}


def engram_config(dim: int) -> EngramConfig:
    raw = load_config("tiny").to_dict()
    raw.pop("name")
    raw.update(dim=dim, n_layers=8, engram_layer_ids=list(ENGRAM_LAYERS))
    return EngramConfig.from_dict(raw, f"blocks-{dim}")


def blocks_config(dim: int, **fields) -> BlocksConfig:
    """The kit's blocks at width ``dim``; ``fields`` change others (e.g. ``compress_ratios``)."""
    base = {
        **SMALL_WIDTHS,
        "dim": dim,
        "n_layers": 8,
        "compress_ratios": (0, 0, 2, 2, 2, 2, 1, 1),
        "kv_source_layers": (2, 5),
        "index_source_layers": (2, 4, 5),
        "index_n_heads": 4,
        "index_head_dim": 32,
        "index_topk": INDEX_TOPK,
        "original_seq_len": 64,  # below the prompt lengths: the YaRN ramp matters
        "rope_factor": 4.0,
        "candidate_source_layer": -1,
        "engram_layer_ids": ENGRAM_LAYERS,
    }
    return BlocksConfig(**{**base, **WIDTHS[dim], **fields})


def write(folder: Path, dim: int, seed: int, **fields) -> Path:
    return write_synthetic_checkpoint(folder, engram_config(dim), seed=seed, blocks=blocks_config(dim, **fields))


def prompt(length: int, seed: int, image_at: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random raw ids ``[1, length]`` and token types (an image span of 6 at ``image_at``)."""
    ids = torch.randint(0, 129280, (1, length), generator=torch.Generator().manual_seed(seed))
    types = torch.full((1, length), -1)
    if image_at is not None:
        types[0, image_at : image_at + 6] = torch.tensor([0, 1, 1, 2, 1, 3])
    return ids, types


def our_streams(folder: Path, ids: torch.Tensor, types: torch.Tensor):
    """engram_viz's streams entering each Engram layer, the gates there and the row ids ``[1, T, n_layers, 24]``:
    ``Pipeline(folder, streams="model")`` on the pre-tokenised prompt (core blocks chained with core Engram)."""
    pipe = Pipeline(folder, streams="model", device="cpu")
    pipe.streams_source.cache_key = None  # run the blocks every time (no streams cache read or written)
    layers = pipe.layer_ids
    names = [f"engram.L{n}.{site}" for n in layers for site in ("streams", "gate", "hash_ids")]
    _, cache = pipe.run_with_cache({"id": "p", "input_ids": ids[0], "token_types": types[0]}, names)
    streams = {n: cache[f"engram.L{n}.streams"] for n in layers}
    gates = {n: cache[f"engram.L{n}.gate"] for n in layers}
    return streams, gates, torch.stack([cache[f"engram.L{n}.hash_ids"] for n in layers], 2)


def reference_engram_streams(folder: Path, ids: torch.Tensor, types: torch.Tensor, ref):
    """engram_viz's blocks with the reference-structured model's own Engram layers between them (so both
    sides enter each block with the same bits), and core Engram's gates on the streams entering each layer."""
    ckpt = open_checkpoint(folder)
    cfg = ckpt.config
    rows = hash_prompt(cfg, get_tokenizer(cfg).token_map, ids, types < 0)

    def run(n: int, x: torch.Tensor) -> torch.Tensor:
        return ref.engrams[n](x, rows[:, :, cfg.engram_layer_ids.index(n)], types < 0)

    streams = model_streams(open_blocks(folder), ids, run, types >= 0)
    gates = {}
    for li, n in enumerate(cfg.engram_layer_ids):
        e = Engram.from_weights(cfg, ckpt.layer(n), mode="fp8", device="cpu", gemm=ENGRAM_GEMM)
        with e.hook_gate.add_hook(lambda t, name, n=n: gates.__setitem__(n, t.clone())):
            e(streams[n], rows[:, :, li], types < 0)
    return streams, gates, rows
