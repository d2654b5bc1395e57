"""Small builders shared by the capture, trace, attach and report tests (not a test module)."""

from __future__ import annotations

import torch

from engram_viz.config import EngramConfig
from engram_viz.core import fp8
from engram_viz.core.engram import Engram


class FP8RowTable:
    """An in-memory fp8 table: e4m3 rows + e8m0 scales, dequantised on lookup like the reference."""

    def __init__(self, num_rows: int, head_dim: int, generator: torch.Generator):
        self.weight, self.scale = fp8.quantize_rows(torch.randn(num_rows, head_dim, generator=generator))
        self.num_rows, self.head_dim = num_rows, head_dim

    def __call__(self, row_ids: torch.Tensor) -> torch.Tensor:
        return fp8.dequantize_rows(self.weight[row_ids], self.scale[row_ids])


def random_engram_weights(config: EngramConfig, layer_id: int, seed: int = 0) -> dict:
    """Random weights of one Engram layer in the checkpoint's dtypes (fp8 table and wkv, bf16 q/k)."""
    g = torch.Generator().manual_seed(1000 * seed + layer_id)
    li = config.engram_layer_ids.index(layer_id)
    n, k = config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim
    wkv_w, wkv_s = fp8.quantize_matrix(torch.randn(n, k, generator=g) * k**-0.5)
    return {
        "table": FP8RowTable(config.engram_num_embeddings[li], config.engram_head_dim, g),
        "wkv_weight": wkv_w,
        "wkv_scale": wkv_s,
        "q_weight": (1 + 0.5 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16),
        "k_weight": (1 + 0.5 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16),
    }


def make_engram(config: EngramConfig, layer_id: int, seed: int = 0, mode: str = "fp8") -> Engram:
    w = random_engram_weights(config, layer_id, seed)
    wkv = fp8.dequantize_blocks(w["wkv_weight"], w["wkv_scale"])
    return Engram(
        config, layer_id, w["table"], wkv, w["q_weight"], w["k_weight"], mode=mode, device="cpu", trainable=False
    )


def random_inputs(config: EngramConfig, engram: Engram, batch: int = 2, seq: int = 7, seed: int = 0):
    """x ``[B, T, hc, dim]`` float32, hash_ids ``[B, T, 24]`` within the layer's table, token_mask ``[B, T]``."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, config.hc_mult, config.dim, generator=g)
    rows = config.engram_num_embeddings[engram.layer_hash_index]
    hash_ids = torch.randint(0, rows, (batch, seq, config.n_hash_cols), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.bool)
    mask[:, 2:4] = False
    return x, hash_ids, mask
