"""Stream sources: the one object a Pipeline chooses from ``streams=``, and the ``engram.L{n}.streams``
hook site that shows what each Engram layer read."""

from __future__ import annotations

import pytest
import torch
from block0_kit import SMALL

from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.stream_sources import (
    CallableStreams,
    CapturedStreams,
    EmbeddingStreams,
    ModelStreams,
    runs_model_whole,
)
from engram_viz.run.streams import Block0Streams, StreamSource, embedding_streams, save_captured_streams
from engram_viz.tiny.files import save_tiny_model
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig
from engram_viz.weights.synthetic import synthetic_checkpoint, write_synthetic_checkpoint

TEXTS = ["Only Alexander the Great could tame the horse Bucephalus.", "A photo <image:2x2> of the Nile"]


@pytest.fixture(scope="module")
def tiny_lm_folder(tmp_path_factory, tiny_config):
    folder = tmp_path_factory.mktemp("tiny_lm")
    tok = get_tokenizer(tiny_config)
    raw = torch.tensor([0, *range(100, 900)])
    torch.manual_seed(0)
    save_tiny_model(TinyEngramLM(tiny_config, tok.token_map, raw, TinyLMConfig(vocab_rows=len(raw))), folder)
    return folder


@pytest.fixture(scope="module")
def block0_folder(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("b0s") / "ckpt", "tiny", seed=1, block0=SMALL)


def _captured_streams(pipe: Pipeline, texts: list[str]):
    """``(ids, types, {layer: x})`` of one padded batch, ``x`` read at the ``engram.L{n}.streams`` site."""
    ids, types, _ = pipe._pad(pipe.build(texts))
    _, cache = pipe.registry.run_with_cache(lambda: pipe.forward(ids, types), "engram.*.streams")
    return ids, types, cache.layer("streams")


def test_each_streams_argument_chooses_one_source_object(tmp_path, tiny_lm_folder, block0_folder):
    ckpt = synthetic_checkpoint("tiny", 0)
    base = Pipeline(ckpt, streams="embedding", device="cpu")
    ids, types, _ = base._pad(base.build(TEXTS))
    x = torch.zeros(*ids.shape, base.config.hc_mult, base.config.dim)
    path = save_captured_streams(tmp_path / "s.safetensors", {n: x.clone() for n in base.layer_ids}, ids, types)
    chosen = [  # (weights, streams=, the source's type, its name)
        (ckpt, "auto", EmbeddingStreams, "embedding"),
        (ckpt, "embedding", EmbeddingStreams, "embedding"),
        (ckpt, lambda i, t, layer: x, CallableStreams, "callable"),
        (ckpt, path, CapturedStreams, "captured"),
        (tiny_lm_folder, "auto", ModelStreams, "model"),
        (tiny_lm_folder, "model", ModelStreams, "model"),
        (block0_folder, "block0", Block0Streams, "block0"),
    ]
    for weights, streams, kind, name in chosen:
        pipe = Pipeline(weights, streams=streams, device="cpu")
        assert type(pipe.streams_source) is kind and isinstance(pipe.streams_source, StreamSource)
        assert pipe.streams_mode == name == pipe.streams_source.name
        assert pipe.streams_label == pipe.streams_source.label
    with pytest.raises(AttributeError):
        pipe.streams_mode = "embedding"  # read-only: the source says what it is
    assert runs_model_whole("auto") and runs_model_whole("model")
    assert not any(runs_model_whole(s) for s in ("embedding", "block0", path, str(path), lambda i, t, n: x))
    assert Pipeline(tiny_lm_folder, streams="embedding", device="cpu").lm is None


def test_streams_site_holds_the_embedding_streams(tiny_config):
    ckpt = synthetic_checkpoint("tiny", 0)
    pipe = Pipeline(ckpt, streams="embedding", device="cpu")
    ids, types, got = _captured_streams(pipe, TEXTS)
    want = embedding_streams(ckpt, ids, types)
    assert sorted(got) == list(pipe.layer_ids)
    for n, x in got.items():
        assert list(x.shape) == [*ids.shape, tiny_config.hc_mult, tiny_config.dim] and x.dtype == want.x.dtype
        assert torch.equal(x, want.x)
        assert torch.equal(x, pipe.streams_source(ids, types, n).x)
    assert pipe.streams_source(ids, types, 3).layer == 3


def test_streams_site_holds_the_block0_streams(block0_folder):
    pipe = Pipeline(block0_folder, streams="block0", device="cpu")
    ids, types, got = _captured_streams(pipe, TEXTS)
    want = pipe.streams_source(ids, types, 1).x
    assert list(want.shape) == [*ids.shape, pipe.config.hc_mult, pipe.config.dim]
    for x in got.values():
        assert torch.equal(x, want)


def test_streams_site_holds_what_the_tiny_lm_hands_each_layer(tiny_lm_folder):
    """The model's own streams: the site, the source and a forward pre-hook on the module agree."""
    pipe = Pipeline(tiny_lm_folder, device="cpu")
    pre: dict[int, torch.Tensor] = {}
    handles = [
        e.register_forward_pre_hook(lambda m, args, n=n: pre.__setitem__(n, args[0].detach().clone()))
        for n, e in pipe.engrams.items()
    ]
    try:
        ids, types, got = _captured_streams(pipe, TEXTS)
    finally:
        for h in handles:
            h.remove()
    assert sorted(got) == sorted(pre) == list(pipe.layer_ids)
    for n in pipe.layer_ids:
        assert got[n].shape == pre[n].shape and list(got[n].shape[2:]) == [pipe.config.hc_mult, pipe.config.dim]
        assert torch.equal(got[n], pre[n].cpu())
        assert torch.equal(pipe.streams_source(ids, types, n).x.cpu(), pre[n].cpu())
    assert not torch.equal(pre[pipe.layer_ids[0]], pre[pipe.layer_ids[1]])  # chained: later blocks ran
