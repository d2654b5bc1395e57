"""Real pictures in prompts: the reference's pre-processing against an independent computation
(tests/vision_kit.py) on pictures made here, and every bad picture input as one clear line."""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
import torch
from PIL import Image
from vision_kit import fitted_canvas, gradient, patches_by_hand, text_card

from engram_viz.cli import main
from engram_viz.config import IMAGE, load_config
from engram_viz.core.image_plan import plan_image
from engram_viz.errors import ImagePromptError, PictureError, PromptError
from engram_viz.run.images import build_input, parse_placeholder
from engram_viz.run.pictures import load_picture
from engram_viz.run.prompts import build_prompt, load_prompts

pytestmark = pytest.mark.unit
CFG = load_config("tiny")

# (maker, width, height, what the case exercises, token grid w x h)
CASES = [
    (gradient, 640, 480, "padded top and bottom", (16, 12)),
    (text_card, 100, 100, "raised to the minimum area", (13, 13)),
    (gradient, 1920, 1080, "shrunk to fit the span cap", (41, 23)),
    (text_card, 300, 900, "tall: padded left and right, partial cells", (8, 23)),
    (gradient, 4000, 100, "extreme width: a strip of 3 rows", (96, 3)),
]


def png_bytes(rgb: np.ndarray, fmt: str = "PNG") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format=fmt)
    return buf.getvalue()


@pytest.mark.parametrize(("make", "w", "h", "what", "grid"), CASES, ids=[c[3] for c in CASES])
def test_patches_equal_an_independent_computation(make, w, h, what, grid):
    rgb = make(w, h)
    pic = load_picture(png_bytes(rgb), CFG)
    plan = plan_image(w, h)
    assert (pic.plan.w, pic.plan.h) == (plan.w, plan.h) and pic.size == (w, h)
    assert (plan.w, plan.h) == grid
    assert plan.span_length <= CFG.vision_max_n_token
    want = patches_by_hand(fitted_canvas(rgb, plan.canvas_w, plan.canvas_h), 14)
    assert pic.patches.dtype == torch.bfloat16 and pic.patches.shape == (plan.vit_h * plan.vit_w, 3, 14, 14)
    assert torch.equal(pic.patches, want)


def test_padding_is_the_references_grey_and_the_picture_is_centred():
    rgb = np.zeros((480, 640, 3), dtype=np.uint8)  # black: the grey bands stand out
    pic = load_picture(png_bytes(rgb), CFG)  # canvas 644 x 490, picture 644 x 483 at y = round(3.5) = 4
    grey = (127 / 255 - 0.5) / 0.5
    rows = pic.patches.view(35, 46, 3, 14, 14).permute(0, 3, 1, 4, 2).reshape(490, 644, 3).float()
    assert torch.allclose(rows[:4], torch.full_like(rows[:4], grey), atol=4e-3)
    assert torch.equal(rows[4:487], torch.full_like(rows[4:487], -1.0))
    assert torch.allclose(rows[487:], torch.full_like(rows[487:], grey), atol=4e-3)


def test_a_jpeg_file_and_a_pillow_image_give_what_the_reference_decodes(tmp_path):
    rgb = text_card(500, 320)
    path = tmp_path / "card.jpg"
    path.write_bytes(png_bytes(rgb, "JPEG"))
    decoded = np.asarray(Image.open(path).convert("RGB"))
    plan = plan_image(500, 320)
    want = patches_by_hand(fitted_canvas(decoded, plan.canvas_w, plan.canvas_h), 14)
    assert torch.equal(load_picture(path, CFG).patches, want)
    assert torch.equal(load_picture(Image.open(path), CFG).patches, want)


def test_prompts_name_pictures_in_text_and_in_images(tmp_path):
    (tmp_path / "pics").mkdir()
    Image.fromarray(gradient(640, 480)).save(tmp_path / "pics" / "a.png")
    Image.fromarray(text_card(100, 100)).save(tmp_path / "pics" / "b.png")
    rows = [
        {"id": "inline", "text": "See <image:pics/a.png> and <image:16x12> here."},
        {"id": "listed", "text": "First <image> then <image>.", "images": ["pics/a.png", "pics/b.png"]},
    ]
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(r) for r in rows))
    inline, listed = (build_prompt(p, config=CFG) for p in load_prompts(f))
    assert [s.has_features for s in inline.spans] == [True, False]
    assert inline.spans[1].kind == "<image:16x12>: no image features"
    assert [(s.width, s.height) for s in inline.spans] == [(16, 12), (16, 12)]  # a picture's grid is its size's
    assert [(s.width, s.height) for s in listed.spans] == [(16, 12), (13, 13)]
    assert int((listed.token_types == IMAGE).sum()) == 16 * 12 + 13 * 13
    assert parse_placeholder(str(tmp_path / "pics" / "b.png"), CFG) == (13, 13, (100, 100))  # the widget's check
    cwd = build_input("x <image> y", config=CFG, images=[(tmp_path / "pics" / "a.png").read_bytes()])
    assert cwd.spans[0].picture is not None and cwd.spans[0].picture.source.startswith("<")


def _bad(tmp_path) -> dict[str, tuple[str, str]]:
    """case -> (prompt text, expected words); files are made in tmp_path/p (the prompt file's folder)."""
    folder = tmp_path / "p"
    folder.mkdir()
    (folder / "empty.png").write_bytes(b"")
    full = png_bytes(gradient(300, 200))
    (folder / "cut.png").write_bytes(full[: len(full) // 2])
    jpeg = png_bytes(gradient(300, 200), "JPEG")
    (folder / "cut.jpg").write_bytes(jpeg[: len(jpeg) // 3])
    (folder / "notes.png").write_text("not a picture")
    (folder / "dir.png").mkdir()
    Image.fromarray(gradient(64, 64)).save(tmp_path / "outside.png")
    os.symlink(tmp_path / "outside.png", folder / "link.png")
    return {
        "missing": ("<image:nope.png>", "does not exist"),
        "zero-size": ("<image:empty.png>", "is empty (0 bytes)"),
        "truncated PNG": ("<image:cut.png>", "not a readable image"),
        "truncated JPEG": ("<image:cut.jpg>", "not a readable image"),
        "not an image": ("<image:notes.png>", "not a readable image"),
        "a folder": ("<image:dir.png>", "is a folder"),
        "outside, relative": ("<image:../outside.png>", "leads outside"),
        "outside, absolute": (f"<image:{tmp_path / 'outside.png'}>", "leads outside"),
        "outside, by a link": ("<image:link.png>", "leads outside"),
    }


def test_each_bad_picture_is_one_line_naming_it(tmp_path):
    for case, (text, words) in _bad(tmp_path).items():
        f = tmp_path / "p" / f"{case.replace(' ', '_').replace(',', '')}.jsonl"
        f.write_text(json.dumps({"id": "bad", "text": f"a {text} b"}))
        with pytest.raises(PictureError) as err:
            load_prompts(f)  # checked as the file is read, before any model loads
        msg = str(err.value)
        assert words in msg and "\n" not in msg and f"{f}:1: prompt 'bad'" in msg, (case, msg)


def test_bad_pictures_in_the_cli_write_nothing(tmp_path, capsys):
    _bad(tmp_path)
    f = tmp_path / "p" / "prompts.jsonl"
    f.write_text(json.dumps({"id": "bad", "text": "a <image:cut.png> b"}))
    out = tmp_path / "report"
    assert main(["report", "--prompts", str(f), "--out", str(out)]) == 2
    (err,) = capsys.readouterr().err.strip().splitlines()
    assert err.startswith("engram-viz report: error: ") and "cut.png" in err and "not a readable image" in err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith("report")]


def test_picture_counts_and_kinds_are_checked(tmp_path):
    f = tmp_path / "a.jsonl"
    f.write_text(json.dumps({"id": "x", "text": "one <image> two <image>", "images": ["a.png"]}))
    with pytest.raises(PromptError, match="2 bare <image> placeholders and 1 picture"):
        load_prompts(f)
    f.write_text(json.dumps({"id": "x", "text": "one <image>", "images": "a.png"}))
    with pytest.raises(PromptError, match="'images' must be a list of picture paths"):
        load_prompts(f)
    with pytest.raises(ImagePromptError, match="1 bare <image> placeholder and 0 pictures"):
        build_input("a <image> b", config=CFG)
    with pytest.raises(PictureError, match="a file path, encoded bytes"):
        build_input("a <image> b", config=CFG, images=[3.5])
    with pytest.raises(PictureError, match="is empty"):
        load_picture(b"", CFG)
