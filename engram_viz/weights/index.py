"""The Hugging Face index file ``model.safetensors.index.json``: its ``weight_map`` (tensor name ->
shard file), each entry checked to name a file inside the checkpoint folder, and the JSON reader
every checkpoint file of the weights layer goes through (one error for any corrupt JSON)."""

from __future__ import annotations

import json
from pathlib import Path

from engram_viz.errors import CheckpointError

INDEX_FILE = "model.safetensors.index.json"


def read_json(path: Path, what: str) -> dict:
    """A JSON object from ``path`` (``what`` names it in errors: ``index file``, ``config file``...)."""
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path} does not exist") from None
    except OSError as err:  # a folder, no permission, an I/O error
        raise CheckpointError(f"{what} {path} cannot be read: {err.strerror or err}") from None
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON, a 5,000-digit number, deep nesting
        raise CheckpointError(f"{what} {path} is corrupt: not valid JSON ({str(err)[:200]})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what} {path} is corrupt: expected a JSON object")
    return doc


def _inside(path: Path, folder: Path) -> bool:
    return path == folder or folder in path.parents


def _shard_path(folder: Path, index: Path, name: str, shard: str) -> Path:
    """The shard file an index entry names, refused unless it lies inside the checkpoint folder: a
    relative path without ``..`` that stays inside with every symlink resolved. One exception: a
    Hugging Face cache snapshot (``.../snapshots/<revision>/``) links each file into the cache's own
    ``blobs/`` folder, which is allowed."""
    rel = Path(shard)
    bad = not shard or "\0" in shard or rel.is_absolute() or ".." in rel.parts
    path = folder / rel
    if not bad:
        try:
            root, target = folder.resolve(), path.resolve()
        except (OSError, RuntimeError):  # a symlink loop
            root = target = None
        hf_blobs = (
            root is not None and root.parent.name == "snapshots" and _inside(target, root.parent.parent / "blobs")
        )
        bad = root is None or not (_inside(target, root) or hf_blobs)
    if bad:
        raise CheckpointError(
            f"index file {index}: weight_map entry {name!r} -> {shard!r} points outside the checkpoint folder "
            f"{folder}; expected a shard file inside it"
        )
    return path


def read_weight_map(folder: Path, index: Path) -> dict[str, Path]:
    """The index file's ``weight_map`` (tensor name -> shard file), every entry checked to name a
    shard inside ``folder``."""
    doc = read_json(index, "index file")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"index file {index} is corrupt: expected a 'weight_map' object of name -> shard file")
    paths: dict[str, Path] = {}  # one check per shard, not per tensor (a real index lists ~100k tensors)
    return {
        name: paths.get(s) or paths.setdefault(s, _shard_path(folder, index, name, s)) for name, s in weight_map.items()
    }
