"""streams="model" on a checkpoint with its blocks: the Pipeline, the report, the streams cache and the
refusal of weights that lack a block (synthetic checkpoint of tests/blocks_kit.py, Engram layers 1 and 6)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from blocks_kit import blocks_config, engram_config, our_streams, write
from PIL import Image
from reference_blocks import Transformer
from vision_kit import SMALL_VISION, gradient

from engram_viz.cli import main
from engram_viz.core.image_merge import merge_images
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import StreamsError
from engram_viz.run.block_streams import ENGRAM_GEMM
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.blocks_reader import open_blocks
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.vision_reader import open_vision

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


def test_pictures_are_merged_before_block_0_where_block0s_path_merges_them(tmp_path):
    """A real picture: the layer-1 streams equal streams="block0"'s bit for bit, the layer-6 streams equal the
    reference-structured model's from the same merged embeddings, the label names the tower, and the text
    after the placeholder twin reads other streams at layer 6."""
    cfg = replace(engram_config(64), name="blocks-64-pictures", vision_min_pixels=0)  # 84 x 56: a 2 x 2 grid
    folder = write_synthetic_checkpoint(tmp_path / "c", cfg, seed=0, blocks=blocks_config(64), vision=SMALL_VISION)
    Image.fromarray(gradient(84, 56)).save(tmp_path / "wall.png")
    real = {"id": "real", "text": f"Look at this: <image:{tmp_path / 'wall.png'}> It shows a wall on the hills."}
    twin = {"id": "twin", "text": "Look at this: <image:84x56px> It shows a wall on the hills."}
    names = ["engram.L1.streams", "engram.L6.streams"]
    pipe = Pipeline(folder, streams="model", device="cpu")
    _, got = pipe.run_with_cache(real, names)
    assert "picture spans carry image features (the vision tower and aligner of SYNTHETIC" in pipe.streams_source.label
    _, block0 = Pipeline(folder, streams="block0", device="cpu").run_with_cache(real, names[:1])
    assert torch.equal(got["engram.L1.streams"], block0["engram.L1.streams"])

    (p,) = pipe.build(real)
    ids, types = torch.from_numpy(p.input_ids)[None], torch.from_numpy(p.token_types)[None]
    merged = merge_images(open_blocks(folder).embed(ids).to(torch.bfloat16), [p.pictures()], open_vision(folder))
    want, _ = Transformer(folder, cfg, get_tokenizer(cfg).token_map).streams(ids, types, merged)
    assert torch.equal(got["engram.L6.streams"], want[6])

    _, placeholder = pipe.run_with_cache(twin, names)
    after = int((types[0] >= 0).nonzero().max()) + 1
    assert not torch.equal(placeholder["engram.L6.streams"][:, after:], got["engram.L6.streams"][:, after:])
    assert "picture spans" not in pipe.streams_source.label and "no image features" in pipe.streams_source.label
