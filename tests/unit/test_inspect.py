"""engram_viz.weights.inspect: ``engram-viz inspect`` on hf and mp folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from weights_kit import SHARD

from engram_viz.cli import main
from engram_viz.config import load_config
from engram_viz.weights.inspect import inspect_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("hf") / "tiny-hf", "tiny", seed=0)


def test_inspect_cli(hf_dir, tmp_path, capsys):
    assert main(["inspect", str(hf_dir), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["valid"] is True and report["synthetic"] and report["layout"] == "hf" and report["config"] == "tiny"
    by_name = {t["name"]: t for t in report["tensors"]}
    assert len(by_name) == 13
    assert by_name["layers.1.engram.embed.weight"] == {
        "name": "layers.1.engram.embed.weight",
        "dtype": "F8_E4M3",
        "shape": [50148, 32],
        "parts": 1,
        "part_shapes": None,
        "split": False,
        "files": [SHARD.format(2)],
        "bytes": 50148 * 32,
    }
    assert by_name["embed.weight"]["files"] == [SHARD.format(1)]

    assert main(["inspect", str(hf_dir)]) == 0
    text = capsys.readouterr().out
    assert "SYNTHETIC" in text and "layers.3.engram.embed.weight  F8_E4M3  [54840, 32]" in text
    assert "check against config tiny: ok" in text

    with pytest.raises(SystemExit) as info:
        main(["inspect", str(hf_dir), "--config", "v41-flash"])
    assert info.value.code == 1 and "FAILED" in capsys.readouterr().out

    assert main(["inspect", str(tmp_path / "nowhere")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_inspect_mp_folder(tmp_path):
    mp = write_synthetic_checkpoint(tmp_path / "mp", "tiny", world_size=4, tokenizer=False)
    report = inspect_checkpoint(mp)
    assert report["valid"] is True and report["world_size"] == 4
    by_name = {t["name"]: t for t in report["tensors"]}
    table = by_name["layers.3.engram.embed.weight"]
    assert table["split"] and table["parts"] == 4 and table["shape"] == [54840, 32]
    assert not by_name["layers.3.engram.wkv.weight"]["split"] and by_name["layers.3.engram.wkv.weight"]["parts"] == 4
    assert by_name["embed.weight"]["split"] and by_name["embed.weight"]["shape"] == [129280, 64]
    assert load_config("tiny").name == report["config"]
