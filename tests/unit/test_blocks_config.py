"""BlocksConfig: the released config.json read as the blocks need it, and configs the port cannot run refused."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from engram_viz.config import ConfigError
from engram_viz.core.blocks_config import V41_FLASH_BLOCKS, BlocksConfig, attention_extras
from engram_viz.core.fp4 import E2M1_GRID, fp4_act_round_trip
from engram_viz.weights.blocks_reader import block_tensors

pytestmark = pytest.mark.unit
RELEASED = Path(__file__).resolve().parents[2] / "data" / "configs" / "v41-flash.json"


def test_the_released_config_gives_the_v41_blocks():
    cfg = BlocksConfig.from_dict(json.loads(RELEASED.read_text()))
    assert cfg == V41_FLASH_BLOCKS
    assert cfg.n_blocks == 14 and [cfg.ratio(n) for n in range(14)] == [0, 0] + [2] * 12
    assert [cfg.kv_source(n) for n in (2, 7, 8, 13)] == [2, 2, 8, 8]
    assert [cfg.index_source(n) for n in (2, 7, 8, 13)] == [2, 2, 8, 8]


def test_only_source_layers_carry_a_compressor_and_an_indexer():
    cfg = V41_FLASH_BLOCKS
    assert attention_extras(cfg, 1) == {} and attention_extras(cfg, 3) == {}
    names = set(attention_extras(cfg, 8))
    assert "layers.8.attn.compressor.wgate.weight" in names and "layers.8.attn.indexer.wk.weight" in names
    n = len(block_tensors(cfg, 2))
    assert (
        n == len(block_tensors(cfg, 0)) + 8
    )  # compressor wkv, wgate, norm; indexer wq_b + scale, weights_proj, wk, k_norm


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"candidate_source_layer": 5}, "candidate pre-filtering is not ported"),
        ({"kv_source_layers": (8,)}, "no kv_source_layer at or before it"),
        ({"index_source_layers": (8, 14)}, "no index_source_layer at or before it"),
        ({"compress_ratios": (0, 0, 2)}, "blocks 0..13 need 14"),
        (
            {"compress_ratios": (0, 0, -2, *V41_FLASH_BLOCKS.compress_ratios[3:])},
            r"compress_ratios\[2\] = -2: expected 0",
        ),
    ],
)
def test_configs_the_port_cannot_run_are_refused(change, message):
    with pytest.raises(ConfigError, match=message):
        replace(V41_FLASH_BLOCKS, **change)


def test_fp4_activation_round_trip_lands_on_the_grid():
    x = (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)) * 3).to(torch.bfloat16)
    for block, e4m3 in ((32, False), (16, True)):
        y = fp4_act_round_trip(x, block, e4m3).float().unflatten(-1, (-1, block))
        amax = x.float().unflatten(-1, (-1, block)).abs().amax(-1, keepdim=True)
        scale = y.abs().amax(-1, keepdim=True) / 6 if e4m3 else torch.exp2(torch.ceil(torch.log2(amax / 6)))
        codes = (y / scale).abs()
        assert bool(torch.isin(codes, torch.tensor(E2M1_GRID)).all() if not e4m3 else (codes <= 6).all())
    assert torch.equal(
        fp4_act_round_trip(torch.zeros(1, 32, dtype=torch.bfloat16)), torch.zeros(1, 32, dtype=torch.bfloat16)
    )
