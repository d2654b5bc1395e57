"""streams="block0" end to end: the Pipeline and the report on a synthetic checkpoint with block-0
tensors; layer-1 gates against gates on the float64 block-0 streams of tests/block0_kit.py."""

from __future__ import annotations

import json

import pytest
import torch
from block0_kit import SMALL, F64Block0, load_all

from engram_viz.cli import main
from engram_viz.core.engram import Engram
from engram_viz.errors import EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint

GATE_TOL = 1e-2
TEXTS = [
    "Alexander the Great was born in Pella, the capital of Macedon.",
    "A photo <image:3x2> of the river Nile near Cairo",
    "New York City",
]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("b0p") / "ckpt", "tiny", seed=1, block0=SMALL)


@pytest.fixture(scope="module")
def run(folder):
    pipe = Pipeline(folder, streams="block0", device="cpu", batch_size=3)
    return pipe, pipe.run(TEXTS)


def _gates_on(engram: Engram, x: torch.Tensor, rows: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    got = {}
    with engram.hook_gate.add_hook(lambda t, name: got.__setitem__("gate", t.clone())):
        engram(x, rows, mask)
    return got["gate"]


def test_gates_equal_gates_on_float64_block0_streams(folder, run):
    """Every Engram layer's gates in the Trace are gates on the block-0 streams: within 1e-2 of the
    same Engram layer on streams from the independent float64 block 0, prompt by prompt (unpadded)."""
    pipe, trace = run
    ref, ckpt = F64Block0(load_all(folder), SMALL), open_checkpoint(folder)
    engrams = {n: Engram.from_weights(ckpt.config, ckpt.layer(n), mode="fp8", device="cpu") for n in pipe.layer_ids}
    worst = {n: 0.0 for n in pipe.layer_ids}
    for i in range(len(TEXTS)):
        n = int(trace.lengths[i])
        ids, types = trace.input_ids[i : i + 1, :n], trace.token_types[i : i + 1, :n]
        x64 = ref.streams(ids, types >= 0).float()
        for li, layer in enumerate(pipe.layer_ids):
            want = _gates_on(engrams[layer], x64, trace.row_ids[i : i + 1, :n, li], types < 0)
            worst[layer] = max(worst[layer], float((trace.gates[i : i + 1, :n, li] - want).abs().max()))
    assert max(worst.values()) <= GATE_TOL, worst
    assert bool(trace.is_image.any()) and float(trace.gates[trace.is_image].abs().max()) == 0.0


def test_label_says_which_layers_are_real(run):
    pipe, trace = run
    label = trace.streams_label
    assert trace.meta["streams_mode"] == "block0" and pipe.streams_mode == "block0"
    assert label.startswith("block-0 streams: embed + block 0 of SYNTHETIC")
    assert "layer 1: the model's own streams" in label
    later = ", ".join(map(str, pipe.layer_ids[1:]))
    assert f"layer {later}: NOT the model's own streams - computed on the same block-0 streams" in label
    assert "need captured or attached streams" in label
    assert "placeholder spans carry the image token's embedding: no image features" in label  # TEXTS[1]


def test_one_block0_pass_per_batch(folder):
    """Two Engram layers, one batch: each used routed expert is read once, not once per layer."""
    pipe = Pipeline(folder, streams="block0", device="cpu", batch_size=8)
    pipe.run(TEXTS[:1] + TEXTS[2:])
    assert 0 < pipe.streams_source.weights.experts_read <= SMALL.n_routed_experts


def test_checkpoint_without_block0_is_refused(tmp_path):
    plain = write_synthetic_checkpoint(tmp_path / "plain", "tiny", seed=0)
    with pytest.raises(EngramVizError, match=r"has no block-0 tensors .*layers\.0\.hc_attn_\*.* and embed\.weight"):
        Pipeline(plain, streams="block0", device="cpu")


def test_report_with_block0_streams(folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    rows = [{"id": f"q{i}", "category": "test", "text": t} for i, t in enumerate(TEXTS)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "report"
    args = ["report", "--checkpoint", str(folder), "--streams", "block0", "--prompts", str(prompts)]
    assert main([*args, "--out", str(out), "--device", "cpu", "--quiet"]) == 0, capsys.readouterr().err
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    assert prov["streams_mode"] == "block0" and prov["synthetic"]
    assert "layer 1: the model's own streams" in prov["streams"] and "NOT the model's own" in prov["streams"]
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "block-0 streams: embed + block 0" in page
