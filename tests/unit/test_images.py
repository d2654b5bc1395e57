"""Image-masked prompts: the reference span format, the grid rule, errors, and where hashes block."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from prompt_kit import as_torch, span_rows

from engram_viz.analysis.hashes import rows_from_windows
from engram_viz.analysis.windows import StreamWindows
from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT, load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import BOS_ID
from engram_viz.run.images import ImagePromptError, build_input, image_grid, image_span, parse_placeholder

CFG = load_config("v41-flash")


def _reference_span(w: int, h: int) -> list[int]:
    return [IMAGE_START] + ([IMAGE] * w + [IMAGE_NEWLINE]) * h + [IMAGE_END]


@pytest.mark.parametrize("w,h", [(1, 1), (3, 2), (16, 12), (32, 32), (1024, 1), (1, 1024)])
def test_span_format(w, h):
    ids, types = image_span(w, h, CFG)
    assert types.tolist() == _reference_span(w, h)
    assert len(ids) == h * (w + 1) + 2 and ids.dtype == np.int64 and (ids == CFG.image_token_id).all()


def test_build_input_layout(tokenizer):
    text = "Look at <image:3x2> and <image:640x480px>, then answer."
    x = build_input(text, tokenizer, CFG)
    assert x.input_ids[0] == BOS_ID and x.token_types[0] == TEXT
    assert [(s.width, s.height, s.pixels) for s in x.spans] == [(3, 2, None), (15, 12, (640, 480))]
    for s in x.spans:
        assert x.token_types[s.start : s.stop].tolist() == _reference_span(s.width, s.height)
        assert (x.input_ids[s.start : s.stop] == CFG.image_token_id).all()
        assert (
            s.length == s.stop - s.start and int((x.token_types[s.start : s.stop] == IMAGE).sum()) == s.width * s.height
        )
        for a, b in span_rows(s):
            assert (x.token_types[a:b] == IMAGE).all() and x.token_types[b] == IMAGE_NEWLINE
    assert np.array_equal(x.token_mask, x.token_types == TEXT) and np.array_equal(x.token_types >= 0, ~x.token_mask)
    # the text between the spans is exactly the tokenizer's encoding of each segment
    segments = ["Look at ", " and ", ", then answer."]
    assert [x.input_ids[a:b].tolist() for a, b in x.text_ranges] == [[BOS_ID]] + [tokenizer.encode(s) for s in segments]
    assert (x.token_types[x.token_mask] == TEXT).all()
    t = as_torch(x)
    assert t["input_ids"].shape == (1, len(x)) and t["token_mask"].dtype == torch.bool
    no_bos = build_input("<image:2x2>", tokenizer, CFG, bos=False)
    assert no_bos.token_types.tolist() == _reference_span(2, 2) and no_bos.text_ranges == ()


def test_grid_rule_examples():
    assert image_grid(640, 480, CFG) == (15, 12)  # below min pixels after rounding: scaled up
    assert image_grid(1920, 1080, CFG) == (42, 24)  # above 1,024 tokens: scaled down
    assert image_grid(1344, 1344, CFG) == (32, 32)  # exactly 1,024
    assert image_grid(42, 42, CFG) == (13, 13)  # tiny image: raised to >= 295,936 pixels
    assert image_grid(100_000, 1, CFG) == (1024, 1)  # extreme aspect ratio: clamped


@given(st.integers(1, 6000), st.integers(1, 6000))
def test_grid_rule_bounds(w_px, h_px):
    w, h = image_grid(w_px, h_px, CFG)
    assert w >= 1 and h >= 1 and w * h <= CFG.vision_max_n_token
    ratio = max(w_px, h_px) / min(w_px, h_px)
    if ratio < 10:  # the min-pixels floor holds unless the aspect ratio forces the 1,024 cap
        assert w * h * 42 * 42 >= CFG.vision_min_pixels


@pytest.mark.parametrize(
    "text,match",
    [
        ("<image:40x30>", "1200 image tokens"),
        ("<image:0x5>", "at least 1x1"),
        ("<image:abc>", "malformed"),
        ("<image:3x3", "unterminated"),
        ("a <image:3x3 b <image:2x2>", "unterminated"),
        ("<image:0x10px>", "at least 1 pixel"),
    ],
)
def test_errors(text, match, tokenizer):
    with pytest.raises(ImagePromptError, match=match):
        build_input(text, tokenizer, CFG)


def test_parse_placeholder():
    assert parse_placeholder("16x12", CFG) == (16, 12, None)
    assert parse_placeholder(" 640X480PX ", CFG) == (15, 12, (640, 480))


@pytest.mark.parametrize("config_name", ["tiny", "v41-flash"])
def test_hashes_blocked_where_the_reference_says(config_name, tokenizer):
    """Image positions hash as an all-pad window; the first text token after a span hashes like a
    sequence start; the next one sees one real look-back and then pads."""
    cfg = load_config(config_name)
    layout = EngramLayout(cfg)
    x = build_input("red fox <image:2x2> jumps over <image:1x1>dogs", tokenizer, cfg)
    t = as_torch(x)
    rows = hash_prompt(cfg, tokenizer.token_map, t["input_ids"], t["token_mask"])[0].numpy()
    c = tokenizer.compress(x.input_ids)
    pad = int(tokenizer.token_map[cfg.engram_pad_id])

    def want(ngram_by_order):
        return np.stack(
            [
                np.concatenate([layout.ngram_rows(layer, ngram_by_order[n]) for n in cfg.ngram_orders])
                for layer in cfg.engram_layer_ids
            ]
        )

    all_pad = want({n: (pad,) * n for n in cfg.ngram_orders})
    for s in x.spans:
        for p in range(s.start, s.stop):
            assert np.array_equal(rows[p], all_pad)
        after = s.stop
        if after < len(x):
            assert np.array_equal(rows[after], want({n: (pad,) * (n - 1) + (c[after],) for n in cfg.ngram_orders}))
        if after + 1 < len(x) and x.token_mask[after + 1]:
            second = {n: (pad,) * (n - 2) + (c[after], c[after + 1]) for n in cfg.ngram_orders}
            assert np.array_equal(rows[after + 1], want(second))
    # position 0 (BOS) is a sequence start too
    assert np.array_equal(rows[0], want({n: (pad,) * (n - 1) + (c[0],) for n in cfg.ngram_orders}))
    # the vectorised stream hasher agrees
    windows = StreamWindows(cfg, tokenizer.token_map)(x.input_ids, token_mask=x.token_mask)
    assert np.array_equal(rows_from_windows(layout, windows), rows)
