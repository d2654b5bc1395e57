"""engram_viz.weights.inspect: ``engram-viz inspect`` on hf and mp folders."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models
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


def _tiny_tokenizer(path: Path) -> None:
    """A valid tokenizer.json of 3 ids (not the V4 tokenizer the config needs)."""
    tok = Tokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    tok.save(str(path))


@pytest.mark.parametrize(
    "case,pattern",
    [
        ("garbage", r"tokenizer file .*tokenizer\.json cannot be read as a tokenizer\.json"),
        ("not utf-8", r"tokenizer file .*tokenizer\.json cannot be read"),
        ("other vocabulary", r"tokenizer .*tokenizer\.json has 3 ids but config 'tiny' expects vocab_size=129280"),
    ],
)
def test_inspect_checks_the_tokenizer(tmp_path, hf_dir, case, pattern, capsys):
    folder = tmp_path / "ckpt"
    shutil.copytree(hf_dir, folder)
    tok = folder / "tokenizer.json"
    report = inspect_checkpoint(folder)
    assert report["valid"] is True and report["tokenizer"] == {"path": str(tok), "ok": True, "ids": 129_280}
    if case == "garbage":
        tok.write_text('{"version": "1.0", "model": 7}')
    elif case == "not utf-8":
        tok.write_bytes(b"\xff\xfe\x00garbage")
    else:
        _tiny_tokenizer(tok)
    report = inspect_checkpoint(folder)
    assert report["valid"] is False and re.search(pattern, report["error"]), report["error"]
    with pytest.raises(SystemExit) as info:
        main(["inspect", str(folder)])
    assert info.value.code == 1 and "FAILED" in capsys.readouterr().out
