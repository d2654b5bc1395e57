"""pipeline: gates in a Trace are the module's own, image spans, batching, edits and stream sources."""

from __future__ import annotations

import pytest
import torch

from engram_viz.analysis.row_stats.trace_ngrams import collision_exposure
from engram_viz.config import TEXT
from engram_viz.core.devices import default_device
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.capture import HookRegistry, force_gate
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts
from engram_viz.run.streams import embedding_streams, save_captured_streams
from engram_viz.tiny.files import load_tiny_model, save_tiny_model
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig
from engram_viz.weights.resolve import default_checkpoint
from engram_viz.weights.synthetic import synthetic_checkpoint

TEXTS = [
    "Only Alexander the Great could tame the horse Bucephalus.",
    "万里长城东起山海关，西至嘉峪关。",
    "for i in range(10): print(i)",
]


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    return Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu", batch_size=2)


def test_defaults(pipe):
    default = Pipeline()
    assert default.device == default_device()
    assert default.model_label == default_checkpoint().label  # the embedded default weights
    assert default.streams_mode == ("model" if default.lm is not None else "embedding")
    assert pipe.streams_mode == "embedding" and pipe.layer_ids == (1, 3)
    assert "Pipeline(" in repr(pipe)
    with pytest.raises(ValueError, match="expected 'auto'"):
        Pipeline(default_checkpoint(), streams="nowhere.safetensors", device="cpu")
    with pytest.raises(ValueError, match="whole model"):
        Pipeline(synthetic_checkpoint("tiny"), streams="model", device="cpu")  # Engram layers only
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Pipeline("/no/such/checkpoint", device="cpu")


def test_trace_gates_are_the_module_output_gates(pipe):
    """Recompute every layer directly with the pipeline's own modules: the Trace's gates are the
    gates of that forward, and they rebuild its output exactly as out = h + gate * value."""
    trace = pipe.run(TEXTS, names=["engram.*.value"])
    for i, text in enumerate(TEXTS):
        n = int(trace.lengths[i])
        ids = trace.input_ids[i : i + 1, :n]
        x = embedding_streams(pipe.checkpoint, ids).x
        for li, layer in enumerate(pipe.layer_ids):
            engram = pipe.engrams[layer]
            reg = HookRegistry(engram.hook_points())
            rows = trace.row_ids[i : i + 1, :n, li]
            out, cache = reg.run_with_cache(
                lambda e=engram, x=x, rows=rows: e(x, rows, None),
                names=[f"engram.L{layer}.gate", f"engram.L{layer}.value"],
            )
            gate = trace.gates[i : i + 1, :n, li]
            torch.testing.assert_close(gate, cache[f"engram.L{layer}.gate"], rtol=0, atol=1e-6)
            value = trace.tensors[f"engram.L{layer}.value"][i : i + 1, :n]
            rebuilt = (x.float() + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(x.dtype)
            torch.testing.assert_close(rebuilt.float(), out.float(), rtol=0, atol=1e-2)  # one bf16 ulp
    assert trace.texts == TEXTS and trace.prompt_ids == ["p0", "p1", "p2"]


def test_batching_changes_nothing(pipe):
    one = pipe.run(TEXTS, batch_size=1)
    all_ = pipe.run(TEXTS, batch_size=3)
    assert torch.equal(one.row_ids, all_.row_ids) and torch.equal(one.input_ids, all_.input_ids)
    torch.testing.assert_close(one.gates, all_.gates, rtol=0, atol=1e-6)


def test_image_spans_gate_zero_and_blocked_hashes(pipe, tiny_config):
    """The reference span format; gates 0 and all-pad hashes inside; the first text token after the
    span hashes like a sequence start."""
    trace = pipe.run([{"id": "img", "category": "image", "text": "The Milky Way <image:3x2> Great Wall"}])
    n = int(trace.lengths[0])
    types = trace.token_types[0, :n].tolist()
    start = types.index(0)
    assert types[start : start + 2 * 4 + 2] == [0, 1, 1, 1, 2, 1, 1, 1, 2, 3]
    span = torch.tensor([0 <= t for t in types])
    assert (trace.input_ids[0, :n][span] == tiny_config.image_token_id).all()
    assert (trace.gates[0, :n][span] == 0).all() and (trace.gates[0, :n][~span] > 0).all()
    layout = EngramLayout(tiny_config)
    pad = int(pipe.tokenizer.token_map[tiny_config.engram_pad_id])
    after = start + 10
    c_after = int(trace.compressed_ids[0, after])
    for li, layer in enumerate(pipe.layer_ids):
        rows = trace.row_ids[0, :n, li]
        dead = torch.cat([torch.as_tensor(layout.ngram_rows(layer, (pad,) * k)) for k in (2, 3, 4)])
        assert all(torch.equal(rows[t], dead) for t in range(start, after))
        fresh = torch.cat([torch.as_tensor(layout.ngram_rows(layer, (pad,) * (k - 1) + (c_after,))) for k in (2, 3, 4)])
        assert torch.equal(rows[after], fresh)
    # exposure is 0 at image positions
    assert (collision_exposure(trace, pipe.config)[0, :n][span] == 0).all()


def test_forced_gate_through_run(pipe):
    trace = pipe.run(TEXTS[:2], names=["engram.L1.out"], hooks={"engram.L1.gate": force_gate(0.0)})
    assert (trace.captured("gate")[1] == 0).all()
    assert (trace.captured("gate")[3] > 0).any()
    assert pipe.registry.active() == {}


def test_unknown_names_fail_before_work(pipe):
    with pytest.raises(ValueError, match="matches no hook point"):
        pipe.run(TEXTS, names=["engram.L2.gate"])


def test_prompt_forms(pipe):
    ps = [p for p in load_prompts() if p.category in ("random_token", "math")][:3]
    trace = pipe.run(ps)
    assert trace.prompt_ids == [p.id for p in ps]
    trace = pipe.run([{"id": "ids", "input_ids": [0, 100, 200, 300]}])
    assert trace.input_ids[0].tolist() == [0, 100, 200, 300]
    with pytest.raises(ValueError, match="unique"):
        pipe.build([{"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    with pytest.raises(TypeError, match="expected a string"):
        pipe.build([3])


def test_captured_and_callable_streams(tmp_path, tiny_config):
    ckpt = synthetic_checkpoint("tiny", 0)
    base = Pipeline(ckpt, streams="embedding", device="cpu")
    built = base.build(TEXTS[:2])
    ids, types, _ = base._pad(built)
    x1 = torch.randn(*ids.shape, tiny_config.hc_mult, tiny_config.dim, generator=torch.Generator().manual_seed(1))
    x3 = torch.randn(*ids.shape, tiny_config.hc_mult, tiny_config.dim, generator=torch.Generator().manual_seed(3))
    path = save_captured_streams(tmp_path / "s.safetensors", {1: x1, 3: x3}, ids, types, {"model": "test"})
    cap = Pipeline(ckpt, streams=path, device="cpu").run()
    assert cap.streams_label.startswith("captured streams") and cap.categories == ["captured"] * 2
    fn = Pipeline(ckpt, streams=lambda i, t, layer: x1 if layer == 1 else x3, device="cpu")
    call = fn.run(TEXTS[:2], batch_size=2)
    assert call.streams_label.startswith("user streams")
    torch.testing.assert_close(cap.gates, call.gates, rtol=0, atol=1e-6)
    assert torch.equal(cap.row_ids, call.row_ids)
    assert (types == TEXT).all()


def test_tiny_lm_folder_runs_whole_with_its_own_streams(tmp_path, tiny_config):
    """A tiny Engram LM folder runs as a whole model: each Engram layer reads the streams the blocks
    before it produced, and the hooks are the model's own Engram hook points."""
    tok = get_tokenizer(tiny_config)
    raw = torch.tensor([0, *range(100, 900)])
    torch.manual_seed(0)
    save_tiny_model(TinyEngramLM(tiny_config, tok.token_map, raw, TinyLMConfig(vocab_rows=len(raw))), tmp_path)
    pipe = Pipeline(tmp_path, device="cpu")
    assert pipe.streams_mode == "model" and pipe.lm is not None
    trace = pipe.run(TEXTS[:2] + ["The Milky Way <image:2x2> at night"], names=["engram.*.out"])
    assert trace.streams_label.startswith("the model's own residual streams")
    assert "tiny Engram LM" in trace.model_label
    # the same model run directly, its Engram layers observed through their own hook points
    lm = load_tiny_model(tmp_path, device="cpu")
    reg = HookRegistry.from_module(lm)
    i = 2
    n = int(trace.lengths[i])
    ids, types = trace.input_ids[i : i + 1, :n], trace.token_types[i : i + 1, :n]
    _, cache = reg.run_with_cache(lambda: lm(ids, types < 0), names="engram.*.gate")
    for layer in pipe.layer_ids:
        torch.testing.assert_close(
            trace.captured("gate")[layer][i : i + 1, :n], cache[f"engram.L{layer}.gate"], rtol=0, atol=1e-6
        )
    assert (trace.gates[i, :n][trace.is_image[i, :n]] == 0).all()
    # asking for embedding streams opens the same folder as Engram layers only
    proxy = Pipeline(tmp_path, device="cpu", streams="embedding")
    assert proxy.lm is None and proxy.run(TEXTS[:1]).streams_label.startswith("embedding streams")
