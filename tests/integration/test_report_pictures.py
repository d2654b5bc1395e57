"""The report's section of real pictures beside their placeholder twins: on a checkpoint with a vision
tower (synthetic, small widths) and ``--streams block0``, a prompt file naming a picture gets the section,
its ``picture_twins`` table equals the gates of the prompt and of a twin written by hand, run here; a prompt
set without pictures gives no twins (and so no section)."""

from __future__ import annotations

import io
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
from block0_kit import SMALL
from PIL import Image
from vision_kit import SMALL_VISION, text_card

from engram_viz.analysis.gates.picture_twin import picture_twins, prompt_vs_placeholder, twin_summary, twin_text
from engram_viz.cli import main
from engram_viz.config import load_config
from engram_viz.errors import InputError
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.synthetic import write_synthetic_checkpoint

pytestmark = pytest.mark.integration
SMALL_PICTURES = replace(load_config("tiny"), name="tiny-small-pictures", vision_min_pixels=0)
WALL = {"id": "wall", "category": "image", "text": "Look at this: <image> It shows the Great Wall of China."}
HEADING = "Pictures beside their placeholder twins"


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    base = tmp_path_factory.mktemp("report_pictures")
    folder = write_synthetic_checkpoint(base / "ckpt", SMALL_PICTURES, seed=0, block0=SMALL, vision=SMALL_VISION)
    buf = io.BytesIO()
    Image.fromarray(text_card(150, 100)).save(buf, format="PNG")
    (base / "wall.png").write_bytes(buf.getvalue())
    rows = [{**WALL, "images": ["wall.png"]}, {"id": "plain", "category": "text", "text": "The Great Wall of China."}]
    prompts = base / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return base, folder, prompts


def _report(folder, prompts, out) -> str:
    argv = ["report", "--checkpoint", str(folder), "--streams", "block0", "--prompts", str(prompts)]
    assert main([*argv, "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    return (out / "report.html").read_text(encoding="utf-8")


def test_a_picture_prompt_gets_the_twin_section_with_an_independent_table(setup):
    base, folder, prompts = setup
    page = _report(folder, prompts, base / "out")
    assert HEADING in page and "These streams merge the picture" in page
    assert (base / "out" / "figures" / "picture_twin_0.png").is_file()
    table = pd.read_csv(base / "out" / "tables" / "picture_twins.csv")
    assert set(table["prompt"]) == {"wall"}

    pipe = Pipeline(folder, streams="block0")  # the twin written by hand: 150x100 px in the picture's place
    trace = pipe.run(
        [
            {"id": "real", "text": WALL["text"].replace("<image>", f"<image:{base / 'wall.png'}>")},
            {"id": "twin", "text": WALL["text"].replace("<image>", "<image:150x100px>")},
        ]
    )
    stop = trace.meta["image_spans"]["real"][0]["stop"]
    g = trace.to_frame("gates")
    g = g[g.position >= stop].sort_values(["position", "layer", "stream"])
    real, twin = g[g.prompt == "real"].gate.to_numpy(), g[g.prompt == "twin"].gate.to_numpy()
    ours = table.sort_values(["position", "layer", "stream"])
    np.testing.assert_allclose(ours["gate_picture"], real, atol=1e-6)
    np.testing.assert_allclose(ours["difference"], real - twin, atol=1e-6)
    assert np.abs(real - twin).max() > 0.05  # the placeholder's gates after the picture differ measurably
    summary = twin_summary(table)
    assert summary["max_abs_difference"].max() == pytest.approx(np.abs(real - twin).max(), abs=1e-6)


def test_no_picture_no_twins_and_a_clear_error(setup):
    _, folder, _ = setup
    pipe = Pipeline(folder, streams="block0")  # the report adds the section only when this is not empty
    assert picture_twins(pipe, [{"id": "p", "text": "A <image:2x2> placeholder."}, {"seed": 1, "length": 4}]).empty
    with pytest.raises(InputError, match="holds no real picture"):
        prompt_vs_placeholder(pipe, {"id": "p", "text": "no picture"})


def test_twin_text_swaps_pictures_only(setup):
    base, folder, _ = setup
    pipe = Pipeline(folder, streams="block0")
    text = f"a <image:3x2> b <image:{base / 'wall.png'}> c <image> d"
    built = pipe.build([{"id": "x", "text": text, "images": [base / "wall.png"]}])[0]
    assert twin_text(text, built.spans) == "a <image:3x2> b <image:150x100px> c <image:150x100px> d"
