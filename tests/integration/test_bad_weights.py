"""Bad weights end to end: a damaged tiny-LM folder is read by the same validated reader as every
checkpoint (a ``CheckpointError`` naming the file, never a raw ``SafetensorError``), NaN/Inf
weights stop ``Pipeline`` and ``engram-viz report`` with one line naming the file, the tensor and
the rows, and nothing is left half-written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file
from weights_kit import poke

from engram_viz.errors import CheckpointError, EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.tiny.files import load_tiny_model
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.nonfinite import NonFiniteError
from engram_viz.weights.safetensors import read_safetensors_header
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD

SCALE1 = "layers.1.engram.embed.scale"


@pytest.fixture()
def tiny(tmp_path) -> Path:
    """A private copy of the committed tiny Engram LM folder (weights and config only)."""
    out = tmp_path / "tiny"
    out.mkdir()
    for name in ("config.json", INDEX_FILE, LM_SHARD, ENGRAM_SHARD):
        shutil.copy(DEFAULT_DIR / name, out / name)
    return out


def _poke_lm(folder: Path, name: str, values: bytes) -> None:
    info = read_safetensors_header(folder / LM_SHARD).tensors[name]
    fd = os.open(info.path, os.O_WRONLY)
    try:
        os.pwrite(fd, values, info.start)
    finally:
        os.close(fd)


def _edit_json(path: Path, edit) -> None:
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _garbage_header(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(8)
        fh.write(b"\xff\xfe garbage")


def _reshape_lm(folder: Path) -> None:
    tensors = load_file(str(folder / LM_SHARD))
    tensors["tiny.norm.weight"] = tensors["tiny.norm.weight"][:-1].contiguous()
    save_file(tensors, str(folder / LM_SHARD))


DAMAGE = {
    "truncated LM shard": (lambda d: os.truncate(d / LM_SHARD, 5000), LM_SHARD, "truncated"),
    "garbage LM header": (lambda d: _garbage_header(d / LM_SHARD), LM_SHARD, "corrupt safetensors header"),
    "truncated Engram shard": (lambda d: os.truncate(d / ENGRAM_SHARD, 100_000), ENGRAM_SHARD, "truncated"),
    "garbage Engram header": (lambda d: _garbage_header(d / ENGRAM_SHARD), ENGRAM_SHARD, "corrupt safetensors"),
    "shard missing": (lambda d: (d / LM_SHARD).unlink(), LM_SHARD, "does not exist"),
    "index outside": (
        lambda d: _edit_json(d / INDEX_FILE, lambda x: x["weight_map"].update({"tiny.norm.weight": "../x"})),
        INDEX_FILE,
        "points outside the checkpoint folder",
    ),
    "index corrupt": (lambda d: (d / INDEX_FILE).write_text("{"), INDEX_FILE, "not valid JSON"),
    "config corrupt": (lambda d: (d / "config.json").write_bytes(b"\xff{"), "config.json", "not valid JSON"),
    "no tiny_lm": (lambda d: _edit_json(d / "config.json", lambda c: c.pop("tiny_lm")), "config.json", "tiny_lm"),
    "bad tiny_lm": (
        lambda d: _edit_json(d / "config.json", lambda c: c["tiny_lm"].update(bogus=1)),
        "config.json",
        "bogus",
    ),
    "LM tensor dropped": (
        lambda d: _edit_json(d / INDEX_FILE, lambda x: x["weight_map"].pop("tiny.norm.weight")),
        "tiny",
        "differ from the architecture",
    ),
    "LM tensor reshaped": (_reshape_lm, "tiny", "'tiny.norm.weight' has shape"),
    "LM tensor NaN": (lambda d: _poke_lm(d, "tiny.norm.weight", b"\xc0\x7f"), LM_SHARD, "'tiny.norm.weight': non-fin"),
    "raw ids out of range": (
        lambda d: _poke_lm(d, "tiny.embed.raw_ids", b"\0" * 8 + (10**9).to_bytes(8, "little")),
        "tiny",
        "tiny.embed.raw_ids",
    ),
    "table scale NaN": (lambda d: poke(d, SCALE1, 0, b"\xff" * 1000), ENGRAM_SHARD, "rows [0, 1, 2,"),
    "wkv NaN": (lambda d: poke(d, "layers.3.engram.wkv.weight", 4, b"\x7f"), ENGRAM_SHARD, "wkv.weight'"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_tiny_folder_is_named(tiny, case):
    damage, file, needle = DAMAGE[case]
    damage(tiny)
    with pytest.raises(CheckpointError) as info:
        load_tiny_model(tiny)
    msg = str(info.value)
    assert isinstance(info.value, EngramVizError) and needle in msg, msg
    assert str(tiny / file) in msg or (file == "tiny" and str(tiny) in msg), msg
    with pytest.raises(CheckpointError):  # the runner goes through the same loader
        Pipeline(tiny, device="cpu")
    assert load_tiny_model().config.name == DEFAULT_DIR.name  # and the process keeps working


def test_nan_table_rows_stop_a_run_naming_the_rows(tmp_path):
    """A synthetic checkpoint whose layer-1 scales are all 0xFF: the run stops at the first gather
    with the file, the tensor and the row ids (before: NaN gates in every table and figure)."""
    ckpt = write_synthetic_checkpoint(tmp_path / "nan", "tiny", seed=0, tokenizer=False)
    path = poke(ckpt, SCALE1, 0, b"\xff" * 50_148)
    pipe = Pipeline(ckpt, streams="embedding", device="cpu")
    with pytest.raises(NonFiniteError, match=rf"{path}: tensor '{SCALE1}': non-finite.*rows \[\d+"):
        pipe.run(["Alexander the Great conquered Persia."])


def run_cli(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "engram_viz.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)


def test_cli_report_on_bad_weights_is_one_line(tmp_path, tiny):
    """``engram-viz report`` on a checkpoint with NaN weights and on a truncated tiny-LM shard: exit
    code 2, one line naming the file, no traceback, no report written."""
    nan = write_synthetic_checkpoint(tmp_path / "nan", "tiny", seed=0, tokenizer=False)
    poke(nan, "layers.1.engram.q_weight", 0, b"\xc0\x7f")
    os.truncate(tiny / LM_SHARD, 5000)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "p1", "category": "test", "text": "hello world"}) + "\n")
    for ckpt, needle in ((nan, "q_weight"), (tiny, str(tiny / LM_SHARD))):
        out = tmp_path / f"out-{ckpt.name}"
        proc = run_cli("report", "--checkpoint", str(ckpt), "--prompts", str(prompts), "--out", str(out), "--quiet")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("engram-viz report: error: ") and needle in lines[0], lines
        assert not (out / "report.html").exists()
