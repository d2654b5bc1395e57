"""``engram-viz compare "A" "B"``: one line (or one JSON object) of how B's gates differ from A's per
aligned token, checked against each prompt run alone through a Pipeline; ``--out`` writes a figure
or an offline page whole, and a suffix it cannot write is refused before anything runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engram_viz.cli import main
from engram_viz.run.pipeline import Pipeline

pytestmark = pytest.mark.integration
A, B = "The Great Wall of China", "The Great Wall of Chile"


def test_the_largest_difference_is_the_prompts_own(capsys):
    assert main(["compare", A, B, "--layer", "3", "--device", "cpu", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    pipe = Pipeline(device="cpu")
    li = list(pipe.config.engram_layer_ids).index(3)
    ga, gb = (pipe.run([p]).gates[0, :, li].numpy().mean(-1) for p in (A, B))  # [T] mean of streams
    assert ga.shape == gb.shape  # one token replaced: positions align one to one
    diff = np.abs(gb - ga)
    assert got["aligned"] == len(ga) and got["replace"] == 1 and got["equal"] == len(ga) - 1
    assert got["max_abs_diff"] == pytest.approx(float(diff.max()), abs=1e-5)
    assert got["max_at"] == [int(diff.argmax())] * 2 and got["changed"] == int((diff > 1e-6).sum())


@pytest.mark.parametrize("suffix", ["pdf", "html"])
def test_out_writes_the_comparison_whole(tmp_path, capsys, suffix):
    out = tmp_path / f"diff.{suffix}"
    assert main(["compare", A, B, "--device", "cpu", "--out", str(out)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    assert line.startswith("layer 1, mean of streams: ") and line.endswith(f"wrote {out}")
    data = out.read_bytes()
    if suffix == "pdf":
        assert data.startswith(b"%PDF")
    else:
        page = data.decode()
        assert page.startswith("<!DOCTYPE html>") and "Chile" in page and "China" in page and "<script" not in page
    assert [p.name for p in tmp_path.iterdir()] == [out.name]  # no temp file left beside it


def test_a_suffix_it_cannot_write_is_one_line_before_the_run(tmp_path, capsys):
    out = tmp_path / "diff.txt"
    assert main(["compare", A, B, "--device", "cpu", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "expected a file ending in .html, .pdf, .svg, .png" in err
    assert not out.exists()
    assert main(["compare", A, B, "--device", "cpu", "--layer", "2"]) == 2
    assert "layer 2: this model's Engram layers are [1, 3]" in capsys.readouterr().err
