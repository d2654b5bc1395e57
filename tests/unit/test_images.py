"""Image-masked prompts: the reference span format, the grid rule, errors, and where hashes block."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from prompt_kit import as_torch, span_rows

from engram_viz.analysis.corpus.row_ids import rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT, load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import BOS_ID
from engram_viz.run.images import ImagePromptError, build_input, image_grid, image_span, parse_placeholder

CFG = load_config("v41-flash")


def _reference_span(w: int, h: int) -> list[int]:
    return [IMAGE_START] + ([IMAGE] * w + [IMAGE_NEWLINE]) * h + [IMAGE_END]


@pytest.mark.parametrize("w,h", [(1, 1), (3, 2), (16, 12), (31, 31), (1021, 1), (1, 511)])
def test_span_format(w, h):
    ids, types = image_span(w, h, CFG)
    assert types.tolist() == _reference_span(w, h)
    assert len(ids) == h * (w + 1) + 2 and ids.dtype == np.int64 and (ids == CFG.image_token_id).all()


def test_build_input_layout(tokenizer):
    text = "Look at <image:3x2> and <image:640x480px>, then answer."
    x = build_input(text, tokenizer, CFG)
    assert x.input_ids[0] == BOS_ID and x.token_types[0] == TEXT
    assert [(s.width, s.height, s.pixels) for s in x.spans] == [(3, 2, None), (16, 12, (640, 480))]
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


def _reference_plan(width: int, height: int, cfg=CFG) -> tuple[int, int]:
    """The grid (w, h) by the rule of ENGRAM_REFERENCE.md section 6, written from its description
    (float64 where it says float, truncation where it says truncate)."""
    p, d, n, cell = cfg.vision_patch_size, cfg.vision_downsample_ratio, cfg.vision_max_n_token, 42
    wf, hf = width, height  # step 1: no max width/height ratio for V4.1-Flash (null)
    if 0 < wf * hf < cfg.vision_min_pixels:  # step 2
        k = math.sqrt(cfg.vision_min_pixels / (wf * hf))
        wf, hf = int(wf * k), int(hf * k)

    def grid(pw, ph):  # steps 3 and 4
        return math.ceil((pw // p) / d), math.ceil((ph // p) / d)

    w, h = grid(math.ceil(wf / p) * p, math.ceil(hf / p) * p)
    if h * (w + 1) + 2 > n:  # step 5
        r = hf / wf
        w_f = math.sqrt((n - 2) / r + 0.25) - 0.5
        h_f = w_f * r
        if w_f < 1:
            pw, ph = cell, ((n - 2) // 2) * cell
        elif h_f < 1:
            pw, ph = (n - 3) * cell, cell
        else:
            beta = min(math.floor(w_f) * cell / wf, math.floor(h_f) * cell / hf)
            pw, ph = math.floor(wf * beta / p) * p, math.floor(hf * beta / p) * p
        w, h = grid(pw, ph)
    return w, h


# the worked values of ENGRAM_REFERENCE.md section 6 (width x height -> w x h)
WORKED = {
    (640, 480): (16, 12),
    (800, 600): (20, 15),
    (1024, 768): (25, 19),
    (1280, 720): (31, 18),
    (1920, 1080): (41, 23),
    (100, 100): (13, 13),
    (4000, 100): (96, 3),
    (100, 4000): (3, 96),
}
SIZES = [
    *WORKED,
    (1, 1),
    (14, 14),
    (42, 42),
    (224, 224),
    (336, 336),
    (543, 545),
    (544, 544),
    (545, 543),
    (1344, 1344),
    (1345, 1344),
    (1386, 1386),
    (2048, 1536),
    (1080, 1920),
    (3840, 2160),
    (7680, 4320),
    (4032, 3024),
    (12000, 9000),
    (500, 300),
    (300, 500),
    (1000, 10),
    (10, 1000),
    (1, 1_000_000),
    (1_000_000, 1),
    (1_000_000, 1_000_000),
    (999_999, 3),
    (65_535, 65_535),
]


def test_grid_rule_worked_values():
    for size, grid in WORKED.items():
        assert image_grid(*size, CFG) == _reference_plan(*size) == grid, size


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_grid_rule_equals_the_reference_plan(size):
    w, h = image_grid(*size, CFG)
    assert (w, h) == _reference_plan(*size)
    assert w >= 1 and h >= 1 and h * (w + 1) + 2 <= CFG.vision_max_n_token  # the whole span fits


@given(st.integers(1, 20_000), st.integers(1, 20_000))
def test_grid_rule_bounds(w_px, h_px):
    w, h = image_grid(w_px, h_px, CFG)
    assert (w, h) == _reference_plan(w_px, h_px)
    assert w >= 1 and h >= 1 and h * (w + 1) + 2 <= CFG.vision_max_n_token


def test_grid_rule_honours_a_max_width_height_ratio():
    capped = dataclasses.replace(CFG, vision_max_wh_ratio=2.0)
    # width cut to 2 x 100; 200 x 100 raised to the minimum area: x sqrt(14.7968) -> 769 x 384 -> 770 x 392
    # on the patch grid -> 55 x 28 patches -> 19 x 10 tokens
    assert image_grid(4000, 100, capped) == image_grid(200, 100, capped) == (19, 10)
    assert image_grid(100, 4000, capped) == image_grid(100, 4000, CFG)  # tall images are not cut


@pytest.mark.parametrize(
    "text,match",
    [
        ("<image:40x30>", r"asks for 1200 image tokens \(40 x 30\) in a span of 1,232 positions"),
        ("<image:32x32>", r"a span of 1,058 positions"),  # 1,024 image tokens, but the span is over the cap
        ("<image:1x1022>", r"a span of 2,046 positions"),
        ("<image:1022x1>", r"a span of 1,025 positions"),
        ("<image:" + "9" * 5000 + "x480px>", r"a number of 5,000 digits; sides are at most 1,000,000"),
        ("<image:2x" + "1" * 4400 + ">", r"a number of 4,400 digits"),
        ("<image:1000001x10px>", r"each side must be 1\.\.1,000,000 pixels"),
        ("<image:0x5>", "at least 1x1"),
        ("<image:abc>", "malformed"),
        ("<image:3x3", "unterminated"),
        ("a <image:3x3 b <image:2x2>", "unterminated"),
        ("<image:0x10px>", r"each side must be 1\.\.1,000,000 pixels"),
    ],
)
def test_errors(text, match, tokenizer):
    with pytest.raises(ImagePromptError, match=match):
        build_input(text, tokenizer, CFG)


def test_parse_placeholder():
    assert parse_placeholder("16x12", CFG) == (16, 12, None)
    assert parse_placeholder(" 640X480PX ", CFG) == (16, 12, (640, 480))
    assert parse_placeholder("1020x1", CFG) == (1020, 1, None)  # span 1 * 1021 + 2 = 1,023
    assert parse_placeholder("1x511", CFG) == (1, 511, None)  # span 511 * 2 + 2 = 1,024: the cap


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
