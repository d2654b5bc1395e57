"""engram_viz.weights.index: index entries must name shards inside the checkpoint folder (no ``..``,
no absolute paths, no symlink leading out; a Hugging Face cache snapshot's blob links are fine),
and any corrupt index file is a ``CheckpointError`` naming it."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from weights_kit import SHARD, listing

from engram_viz.errors import CheckpointError
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.inspect import inspect_checkpoint

TABLE = "layers.3.engram.embed.weight"


@pytest.fixture()
def folder(damaged_hf) -> Path:
    return damaged_hf


@pytest.fixture()
def clean(synthetic_hf) -> Path:
    return synthetic_hf


def _point(folder: Path, names: tuple[str, ...], shard: str) -> None:
    doc = json.loads((folder / INDEX_FILE).read_text())
    for name in names:
        doc["weight_map"][name] = shard
    (folder / INDEX_FILE).write_text(json.dumps(doc))


def _escape_cases(folder: Path) -> dict[str, str]:
    """Entry -> what it names: a copy of the real shard outside the folder, so following it would work."""
    outside = folder.parent / "outside"
    outside.mkdir()
    shutil.copy(folder / SHARD.format(3), outside / SHARD.format(3))
    (folder / "linked-dir").symlink_to(outside, target_is_directory=True)
    (folder / "linked.safetensors").symlink_to(outside / SHARD.format(3))
    return {
        "dot-dot": f"../outside/{SHARD.format(3)}",
        "absolute": str(outside / SHARD.format(3)),
        "symlinked folder": f"linked-dir/{SHARD.format(3)}",
        "symlinked file": "linked.safetensors",
        "empty": "",
        "nul": "a\0b",
    }


@pytest.mark.parametrize("case", ["dot-dot", "absolute", "symlinked folder", "symlinked file", "empty", "nul"])
def test_entries_pointing_outside_the_folder_are_refused(folder, case):
    shard = _escape_cases(folder)[case]
    _point(folder, (TABLE, "layers.3.engram.embed.scale"), shard)
    before = listing(folder)
    with pytest.raises(CheckpointError, match=r"points outside the checkpoint folder") as info:
        open_checkpoint(folder)
    assert str(folder / INDEX_FILE) in str(info.value) and TABLE in str(info.value)
    with pytest.raises(CheckpointError, match="points outside"):
        inspect_checkpoint(folder)
    assert listing(folder) == before


def test_subfolders_and_hf_cache_links_are_followed(tmp_path, clean):
    """A shard in a subfolder of the checkpoint, and the Hugging Face cache layout (each snapshot
    file a link into ``blobs/``), open as the plain folder does."""
    sub = tmp_path / "sub"
    shutil.copytree(clean, sub)
    (sub / "shards").mkdir()
    os.replace(sub / SHARD.format(3), sub / "shards" / SHARD.format(3))
    doc = json.loads((sub / INDEX_FILE).read_text())
    doc["weight_map"] = {n: (f"shards/{s}" if s == SHARD.format(3) else s) for n, s in doc["weight_map"].items()}
    (sub / INDEX_FILE).write_text(json.dumps(doc))
    assert open_checkpoint(sub).layers[3].table.num_rows == 54_840

    repo = tmp_path / "hub" / "models--x--tiny"
    snap, blobs = repo / "snapshots" / "abc123", repo / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for i, p in enumerate(sorted(clean.iterdir())):
        shutil.copy(p, blobs / f"blob{i}")
        (snap / p.name).symlink_to(Path("../../blobs") / f"blob{i}")
    assert inspect_checkpoint(snap)["valid"] is True


@pytest.mark.parametrize(
    "text,pattern",
    [
        ('{"weight_map": ', "is corrupt: not valid JSON"),
        ("[1, 2]", "is corrupt: expected a JSON object"),
        ('{"weight_map": {"a": 1}}', "expected a 'weight_map' object"),
        ('{"weight_map": [1]}', "expected a 'weight_map' object"),
        ('{"weight_map": {"a": "b"}, "n": 1' + "0" * 5000 + "}", "is corrupt: not valid JSON"),
        ("[" * 50_000, "is corrupt: not valid JSON"),
    ],
)
def test_corrupt_index_files_name_the_file(folder, text, pattern):
    (folder / INDEX_FILE).write_text(text)
    with pytest.raises(CheckpointError, match=pattern) as info:
        open_checkpoint(folder)
    assert str(folder / INDEX_FILE) in str(info.value)


def test_index_that_is_a_folder(folder):
    (folder / INDEX_FILE).unlink()
    (folder / INDEX_FILE).mkdir()
    with pytest.raises(CheckpointError, match="cannot be read") as info:
        open_checkpoint(folder)
    assert str(folder / INDEX_FILE) in str(info.value)
