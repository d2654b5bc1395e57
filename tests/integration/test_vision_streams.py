"""The vision path on synthetic weights with the reference's names, shapes and dtypes (a small tower):
our features against a reference-structured tower (tests/vision_kit.py), and the block-0 streams and
layer-1 gates of the text after a picture against the float64 block 0 (tests/block0_kit.py) started
from the reference's merged embeddings; the placeholder twin's gates are far from them."""

from __future__ import annotations

import io
from dataclasses import replace

import numpy as np
import pytest
import torch
from block0_kit import SMALL, F64Block0, load_all
from PIL import Image
from vision_kit import SMALL_VISION, gradient, load_ref_vision, text_card

import engram_viz.core.vit as vit_module
from engram_viz.analysis.gates.picture_twin import picture_vs_placeholder
from engram_viz.config import load_config
from engram_viz.core.block0 import block0_streams
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.image_merge import ImageInput, encode_image
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError
from engram_viz.run.images import build_input
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.streams import Block0Streams
from engram_viz.weights.block0_reader import open_block0
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.vision_reader import open_vision

pytestmark = pytest.mark.integration
GATE_TOL = 1e-2  # layer-1 gates of the text after a picture, ours vs the float64 block 0
# small pictures keep the float64 block 0 quick: the tiny config without its minimum area (which would raise
# every picture to 544 x 544 pixels, spans of 180+ positions); the real plan is tested in tests/unit/test_pictures.py
SMALL_PICTURES = replace(load_config("tiny"), name="tiny-small-pictures", vision_min_pixels=0)
SIZES = [(gradient, 84, 56), (text_card, 150, 100), (text_card, 60, 200)]  # grids 2x2, 4x3 (partial), 2x5
TEXT = "Look at this: <image> It shows the Great Wall of China, a long wall on the hills."


def encoded(make, w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(make(w, h)).save(buf, format="PNG")
    return buf.getvalue()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("vis") / "ckpt"
    return write_synthetic_checkpoint(path, SMALL_PICTURES, seed=0, block0=SMALL, vision=SMALL_VISION)


@pytest.fixture(scope="module")
def parts(folder):
    tensors = load_all(folder)
    return open_block0(folder), open_vision(folder), load_ref_vision(SMALL_VISION, tensors), F64Block0(tensors, SMALL)


@pytest.fixture(scope="module")
def layer1(folder):
    ckpt = open_checkpoint(folder)
    return ckpt.config, Engram.from_weights(ckpt.config, ckpt.layer(1), mode="fp8", device="cpu")


def _prompt(make, w, h, config):
    built = build_input(TEXT, config=config, images=[encoded(make, w, h)])
    (span,) = built.spans
    assert span.picture is not None
    plan = span.picture.plan
    types = torch.from_numpy(built.token_types)
    img = ImageInput(span.start, types[span.start : span.stop], span.picture.patches, plan.vit_h, plan.vit_w)
    return torch.from_numpy(built.input_ids)[None], types[None], img, span


@pytest.mark.parametrize(("make", "w", "h"), SIZES, ids=[f"{w}x{h}" for _, w, h in SIZES])
def test_features_and_streams_after_the_picture_match_the_reference(parts, layer1, make, w, h):
    b0, vision, ref, f64 = parts
    config, engram = layer1
    ids, types, img, span = _prompt(make, w, h, config)
    ours = encode_image(vision, img.patches, img.n_h, img.n_w)
    theirs = ref.features(img.patches, img.n_h, img.n_w)
    assert ours.dtype == torch.bfloat16 and ours.shape == (span.width * span.height, SMALL_VISION.dim)
    torch.testing.assert_close(ours.float(), theirs.float(), rtol=2**-7, atol=1e-3)  # bf16 rounding

    image = types >= 0
    x = block0_streams(b0, ids, image, [[img]], vision)
    h0 = ref.merged(b0.embed(ids)[0].to(torch.bfloat16), img.start, img.types, img.patches, img.n_h, img.n_w)
    xr = f64.streams(ids, image, h0[None])
    after = slice(span.stop, ids.shape[1])
    err = (x[0, after].double() - xr[0, after]).norm(dim=-1) / xr[0, after].norm(dim=-1)
    assert err.median() < 1e-3 and err.max() < 5e-2, (err.median(), err.max())

    mask = ~image
    hashes = hash_prompt(config, get_tokenizer(config).token_map, ids, mask)
    placeholder = block0_streams(b0, ids, image)  # the <image:WxHpx> twin: same span, no image features
    gates = {}
    for name, s in (("ours", x), ("f64", xr.float()), ("placeholder", placeholder)):
        with engram.hook_gate.add_hook(lambda t, n, name=name: gates.__setitem__(name, t[0, after].clone())):
            engram(s, hashes[:, :, 0], mask)
    assert (gates["ours"] - gates["f64"]).abs().max() <= GATE_TOL
    gap = (gates["placeholder"] - gates["f64"]).abs()
    # the window (8 here) after the span reads the picture; beyond it the streams are the same again
    assert gap[: SMALL.window_size].max() > 5 * GATE_TOL, gap.max()


def test_pipeline_labels_pictures_and_placeholders(folder, tmp_path):
    (tmp_path / "wall.png").write_bytes(encoded(gradient, 640, 480))
    pipe = Pipeline(folder, streams="block0")
    real = {"id": "real", "text": f"Look at this: <image:{tmp_path / 'wall.png'}> It shows a wall."}
    twin = {"id": "twin", "text": "Look at this: <image:640x480px> It shows a wall."}
    trace = pipe.run([real, twin])
    label = trace.streams_label
    assert "picture spans carry image features (the vision tower and aligner of SYNTHETIC" in label
    assert "<image:WxH> placeholder spans carry the image token's embedding: no image features" in label
    spans = trace.meta["image_spans"]
    assert spans["twin"][0]["fill"] == "<image:640x480px>: no image features"
    assert spans["real"][0]["fill"].endswith("wall.png (640x480px)")
    assert spans["real"][0]["grid"] == spans["twin"][0]["grid"] == [16, 12]
    g = trace.to_frame("gates").query("layer == 1 and not is_image")
    stop = spans["real"][0]["stop"]
    a = g[(g.prompt == "real") & (g.position >= stop)].gate.to_numpy()
    b = g[(g.prompt == "twin") & (g.position >= stop)].gate.to_numpy()
    assert np.abs(a - b).max() > 5 * GATE_TOL  # the placeholder's text-after gates differ measurably
    twins = picture_vs_placeholder(pipe, "Look at this: ", tmp_path / "wall.png", " It shows a wall.")
    np.testing.assert_array_equal(twins.query("layer == 1")["difference"].to_numpy(), a - b)
    assert "picture spans carry image features" in twins.attrs["provenance"]["streams"]
    alone = pipe.run([twin])
    assert "picture spans" not in alone.streams_label and "no image features" in alone.streams_label


def test_without_a_vision_tower_pictures_are_labelled_no_image_features(folder, parts, layer1, tmp_path):
    ids, types, img, _ = _prompt(gradient, 84, 56, layer1[0])
    streams = Block0Streams(parts[0], layer1[0], vision=None)(ids, types, 1, [[img]])
    assert "picture spans carry the image token's embedding: no image features" in streams.label
    assert torch.equal(streams.x, block0_streams(parts[0], ids, types >= 0))  # nothing merged
    plain = write_synthetic_checkpoint(tmp_path / "plain", "tiny", seed=0)
    with pytest.raises(CheckpointError, match="vision tensors are missing"):
        open_vision(plain)


def test_attention_in_blocks_of_queries_is_bit_for_bit_one_call(parts, layer1, monkeypatch):
    _, vision, _, _ = parts
    _, _, img, _ = _prompt(text_card, 150, 100, layer1[0])
    whole = encode_image(vision, img.patches, img.n_h, img.n_w)  # 110 patches: one block
    monkeypatch.setattr(vit_module, "SCORES_PER_BLOCK", SMALL_VISION.vision_n_heads * 110 * 7)  # blocks of 7 rows
    assert torch.equal(encode_image(vision, img.patches, img.n_h, img.n_w), whole)


def test_the_tiny_lm_labels_every_image_span_no_image_features(tmp_path):
    (tmp_path / "p.png").write_bytes(encoded(gradient, 84, 56))
    pipe = Pipeline()  # the embedded default: the tiny LM, no vision tower
    trace = pipe.run(
        [{"id": "a", "text": "a <image:2x2> b"}, {"id": "b", "text": "c <image> d", "images": [tmp_path / "p.png"]}]
    )
    assert trace.streams_label.endswith("; image spans carry the image token's embedding: no image features")
    assert trace.meta["image_spans"]["a"][0]["fill"] == "<image:2x2>: no image features"
    assert "no image features" not in pipe.run(["plain text"]).streams_label
