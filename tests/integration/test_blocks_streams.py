"""The blocks before the last Engram layer (``core.blocks``, streamed by ``weights.blocks_reader``) against the
reference-structured model of tests/reference_blocks.py on a synthetic checkpoint with compressed-KV blocks.

Engram layers 1 and 6 of a small model (tests/blocks_kit.py); prompts of 8, 300 and 1,200 tokens, the last
two past ``2 * index_topk`` = 32, so the indexer chooses. Two ways: the suite's blocks with the
reference-structured Engram between them ("same"), and ``Pipeline(streams="model")``, the suite's blocks chained
with its own Engram layers ("own", their wkv on the blocks' float32 GEMM operands: ``run.block_streams``).
(64, 1, 1200) "own" failed with the bf16-operand wkv GEMM on a CPU with bf16 kernels: one layer-1 output
element one bf16 step off grew to 13,699 steps at layer 6. The 3 seeds x 2 widths grid: benchmarks/blocks_grid.py.
"""

from __future__ import annotations

import shutil

import pytest
import torch
from blocks_kit import INDEX_TOPK, engram_config, our_streams, prompt, reference_engram_streams, write
from reference_blocks import Transformer
from safetensors.torch import load_file, save_file

from engram_viz.core.blocks import BlockPass
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError, InputError
from engram_viz.weights.blocks_reader import open_blocks

GATE_TOL = 1e-2  # the bound block 0 meets against float64 (tests/integration/test_block0_streams.py)
# (width, seed, tokens, whose Engram layers)
CASES = [(64, 0, 8, "same"), (64, 0, 300, "same"), (128, 1, 300, "same"), (64, 2, 1200, "same")]
CASES += [(128, 1, 300, "own"), (64, 2, 1200, "own"), (64, 1, 1200, "own")]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return {(dim, seed): write(tmp_path_factory.mktemp("blk") / "c", dim, seed) for dim, seed, _, _ in CASES}


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in units of b's bf16 spacing (2^-7 relative, at least one step of the row's scale)."""
    step = torch.maximum(b.float().abs(), b.float().abs().amax(-1, keepdim=True) * 2**-8) * 2**-7
    return float(((a.float() - b.float()).abs() / step).max())


@pytest.mark.parametrize(("dim", "seed", "tokens", "how"), CASES)
def test_streams_entering_the_last_engram_layer_equal_the_models(folders, dim, seed, tokens, how):
    assert tokens <= 8 or tokens > 2 * INDEX_TOPK
    folder = folders[(dim, seed)]
    ids, types = prompt(tokens, seed, image_at=3 if tokens > 20 else None)
    cfg = engram_config(dim)
    ref = Transformer(folder, cfg, get_tokenizer(cfg).token_map)
    want, want_gates = ref.streams(ids, types)
    got, gates, rows = (
        reference_engram_streams(folder, ids, types, ref) if how == "same" else our_streams(folder, ids, types)
    )
    _check(got, gates, want, want_gates)
    assert torch.equal(rows.long(), ref.hasher(ids, 0, types < 0).long())  # row ids identical


def _check(got: dict, gates: dict, want: dict, want_gates: dict) -> None:
    """Streams entering every Engram layer within one bf16 step of the model's, gates within GATE_TOL (max, p99)."""
    for n, w in want.items():
        assert _bf16_steps(got[n], w) <= 1.0, n
        diff = (gates[n] - want_gates[n]).abs().flatten()
        assert float(diff.max()) <= GATE_TOL and float(diff.quantile(0.99)) <= GATE_TOL, (n, float(diff.max()))


# ratios the released config does not use before layer 14 but the reference runs (and V4.1-Flash's layers 20-39
# use 1): pooling 4 tokens into a latent (layers 2-3) and projecting each token (ratio 1, layers 4-5)
OTHER_RATIOS = {
    "compress_ratios": (0, 0, 4, 4, 1, 1, 1, 1),
    "kv_source_layers": (2, 4),
    "index_source_layers": (2, 3, 4),
}


@pytest.fixture(scope="module")
def other_ratios(tmp_path_factory):
    return write(tmp_path_factory.mktemp("ratios") / "c", 64, 0, **OTHER_RATIOS)


@pytest.mark.parametrize("tokens", [3, 300])  # 3: shorter than one group of 4; 300: past 4 * index_topk
def test_compress_ratios_4_and_1_equal_the_models(other_ratios, tokens):
    ids, types = prompt(tokens, 0, image_at=3 if tokens > 20 else None)
    cfg = engram_config(64)
    want, want_gates = Transformer(other_ratios, cfg, get_tokenizer(cfg).token_map).streams(ids, types)
    got, gates, _ = our_streams(other_ratios, ids, types)
    _check(got, gates, want, want_gates)


def test_blocks_are_read_one_at_a_time_and_routed_experts_only_when_used(folders):
    folder = folders[(64, 0)]
    w = open_blocks(folder)
    seen: list[int] = []
    ids, types = prompt(8, 0)
    run = BlockPass(w, ids, types >= 0, on_block=seen.append)
    x = run.streams_entering(1)
    assert seen == [0] and x.shape == (1, 8, 4, 64)
    with pytest.raises(InputError, match="Engram layer 1's output is needed first"):
        run.streams_entering(6)
    run.engram_output(x)
    run.streams_entering(6)
    assert seen == [0, 1, 2, 3, 4, 5]
    assert 0 < w.experts_read <= 6 * 8 * 3  # 8 tokens x 3 chosen experts a block at most, of 8 x 6


def test_a_checkpoint_missing_a_block_tensor_is_refused_naming_it(folders, tmp_path):
    folder = shutil.copytree(folders[(64, 0)], tmp_path / "c")
    shard = folder / "model-block4.safetensors"
    tensors = load_file(str(shard))
    del tensors["layers.4.attn.indexer.weights_proj.weight"]
    save_file(tensors, str(shard))
    with pytest.raises(CheckpointError, match=r"lacks tensor 'layers\.4\.attn\.indexer\.weights_proj\.weight'"):
        open_blocks(folder)
