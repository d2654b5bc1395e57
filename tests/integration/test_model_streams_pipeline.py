"""streams="model" on a checkpoint with its blocks: the Pipeline, the report, the streams cache and the
refusal of weights that lack a block (synthetic checkpoint of tests/blocks_kit.py, Engram layers 1 and 6)."""

from __future__ import annotations

import json

import pytest
import torch
from blocks_kit import our_streams, write

from engram_viz.cli import main
from engram_viz.errors import StreamsError
from engram_viz.run.block_streams import ENGRAM_GEMM
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.synthetic import write_synthetic_checkpoint

TEXTS = ["Alexander the Great was a king of Macedon.", "The Great Wall of China <image:28x28px> is long and old."]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write(tmp_path_factory.mktemp("msp") / "c", 64, 0)


@pytest.fixture(scope="module")
def run(folder):
    pipe = Pipeline(folder, streams="model", device="cpu", batch_size=2)
    return pipe, pipe.run(TEXTS)


def test_every_engram_layer_reads_the_models_own_streams(run, folder):
    """The batched Trace's gates and row ids equal those of the same pass run prompt by prompt (no padding);
    the Engram layers chained with the blocks multiply on the blocks' GEMM operands (float32)."""
    pipe, trace = run
    assert pipe.streams_mode == "model" and trace.meta["streams_mode"] == "model"
    assert {e.gemm for e in pipe.engrams.values()} == {ENGRAM_GEMM} == {"float32"}
    assert "layers 1, 6: true streams" in trace.streams_label and "SYNTHETIC" in trace.streams_label
    for i in range(len(TEXTS)):
        n = int(trace.lengths[i])
        ids, types = trace.input_ids[i : i + 1, :n], trace.token_types[i : i + 1, :n]
        _, gates, rows = our_streams(folder, ids, types)
        for li, layer in enumerate(pipe.layer_ids):
            assert torch.equal(trace.row_ids[i : i + 1, :n, li], rows[:, :, li])
            torch.testing.assert_close(trace.gates[i : i + 1, :n, li], gates[layer], rtol=0, atol=1e-6)


def test_the_same_batch_reads_the_cached_streams(run):
    pipe, trace = run
    again = pipe.run(TEXTS)
    assert pipe.streams_source.passes == 1 and torch.equal(again.gates, trace.gates)


def test_the_pass_saves_as_a_streams_file_that_runs_reuse(run, tmp_path):
    pipe, trace = run
    path = pipe.streams_source.save(tmp_path / "streams.safetensors")
    reused = Pipeline(pipe.checkpoint, streams=path, device="cpu").run()  # the file's (padded) prompts
    assert reused.streams_label.startswith("captured streams")
    for i in range(len(TEXTS)):
        n = int(trace.lengths[i])
        j = next(j for j in range(len(TEXTS)) if torch.equal(reused.input_ids[j, :n], trace.input_ids[i, :n]))
        assert torch.equal(reused.gates[j, :n], trace.gates[i, :n])


def test_weights_without_blocks_are_refused_naming_a_missing_tensor(tmp_path):
    plain = write_synthetic_checkpoint(tmp_path / "plain", "tiny", seed=0)
    with pytest.raises(StreamsError, match=r"whole model .* lacks tensor 'layers\.0\.hc_attn_fn'"):
        Pipeline(plain, streams="model", device="cpu")


def test_report_with_model_streams(folder, tmp_path, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(
        "".join(json.dumps({"id": f"q{i}", "category": "t", "text": t}) + "\n" for i, t in enumerate(TEXTS))
    )
    out = tmp_path / "report"
    args = ["report", "--checkpoint", str(folder), "--streams", "model", "--prompts", str(prompts)]
    assert main([*args, "--out", str(out), "--device", "cpu", "--quiet"]) == 0, capsys.readouterr().err
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    assert prov["streams_mode"] == "model" and "layers 1, 6: true streams" in prov["streams"]
    assert "layers 1, 6: true streams" in (out / "report.html").read_text(encoding="utf-8")
