"""Scanning a checkpoint folder: which Engram-path tensors it holds, where, and in which layout.

Layouts (a folder, or a file inside it):

- ``hf``: ``model.safetensors.index.json`` (``weight_map``: name -> shard) and its shards, or a
  single ``model.safetensors``; ``config.json`` in the folder.
- ``mp``: the inference-converted ``model{i}-mp{n}.safetensors``, i = 0..n-1. Each Engram table
  is row-split as in ``ParallelEngramEmbedding``: part i holds rows ``[i * part, (i + 1) * part)``
  with ``part = ceil(rows / n)`` (the last part padded to ``part`` rows, or short). ``embed.weight``
  is row-split the same way or replicated; ``wkv``, ``q_weight`` and ``k_weight`` are replicated.

Index entries must name shards inside the folder (``index.py``). A scan reads headers only (those of
shards a Hub snapshot left on the Hub by byte ranges, ``hub_shards.py``); every problem raises a
``CheckpointError`` naming the file and the tensor.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from engram_viz.config import EngramConfig
from engram_viz.core.schema import EMBED_NAME, ENGRAM_RE, is_engram_path_name, is_table_name
from engram_viz.errors import CheckpointError
from engram_viz.weights.hub import hub_folder, hub_name, is_hub_ref
from engram_viz.weights.hub_shards import is_remote_shard, remote_header
from engram_viz.weights.index import INDEX_FILE, read_json, read_weight_map
from engram_viz.weights.safetensors import SafetensorsHeader, TensorInfo, read_safetensors_header
from engram_viz.weights.tiny_folder_files import checkpoint_label, is_tiny_lm_folder

SINGLE_FILE = "model.safetensors"
MP_RE = re.compile(r"^model(\d+)-mp(\d+)\.safetensors$")
MARKER_FILE = "SYNTHETIC.json"
LAYOUT_HF, LAYOUT_MP, LAYOUT_PROCEDURAL = "hf", "mp", "procedural"


@dataclass
class TensorEntry:
    """One Engram-path tensor found in a checkpoint; ``parts`` has one entry per file holding it
    (one in the HF layout, n in the mp layout)."""

    name: str
    parts: list[TensorInfo]
    split: bool = False  # row-split over the parts (mp tables; embed.weight unless replicated)

    @property
    def dtype(self) -> str:
        return self.parts[0].dtype

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape: the parts' rows added up when split."""
        first = self.parts[0].shape
        if self.split and len(first) == 2:
            return (sum(p.shape[0] for p in self.parts), first[1])
        return first

    @property
    def nbytes(self) -> int:
        """Bytes on disk over all parts."""
        return sum(p.nbytes for p in self.parts)

    @property
    def files(self) -> list[str]:
        return [p.path.name for p in self.parts]


@dataclass
class CheckpointScan:
    """What a checkpoint folder holds, before any check against a config."""

    path: Path  # the folder
    layout: str  # "hf" or "mp"
    files: list[Path]  # shards (hf) or parts (mp) holding Engram-path tensors, plus the index
    world_size: int
    tensors: dict[str, TensorEntry]  # Engram-path tensors only
    n_tensors: int  # every tensor name the checkpoint lists
    marker: dict | None  # content of SYNTHETIC.json, or the shards' synthetic metadata
    index_path: Path | None = None

    @property
    def synthetic(self) -> bool:
        return self.marker is not None

    @property
    def config_path(self) -> Path | None:
        p = self.path / "config.json"
        return p if p.is_file() else None

    @property
    def tokenizer_path(self) -> Path | None:
        p = self.path / "tokenizer.json"
        return p if p.is_file() else None

    def label(self, cfg: EngramConfig) -> str:
        """Where the weights come from, carried into every output (``SYNTHETIC ...`` for synthetic ones)."""
        if is_tiny_lm_folder(self.path):
            return checkpoint_label(self.path)
        where = hub_name(self.path) or self.path  # a Hub checkpoint by its repository and commit
        if self.synthetic:
            m = self.marker or {}
            return f"SYNTHETIC {m.get('config', cfg.name)} checkpoint (seed {m.get('seed', '?')}; random weights, not trained) at {where}"
        return f"checkpoint {where} ({self.layout} layout, {len(self.files)} files)"

    def describe(self) -> dict:
        """Plain-JSON summary (used by ``engram-viz inspect``)."""
        return {
            "path": str(self.path),
            "layout": self.layout,
            "world_size": self.world_size,
            "files": [p.name for p in self.files],
            "synthetic": self.synthetic,
            "marker": self.marker,
            "n_tensors": self.n_tensors,
            "tensors": [
                {
                    "name": e.name,
                    "dtype": e.dtype,
                    "shape": list(e.shape),
                    "parts": len(e.parts),
                    "part_shapes": [list(p.shape) for p in e.parts] if len(e.parts) > 1 else None,
                    "split": e.split,
                    "files": e.files,
                    "bytes": e.nbytes,
                }
                for e in sorted(self.tensors.values(), key=_name_order)
            ],
            "engram_bytes": sum(e.nbytes for e in self.tensors.values()),
        }


def _name_order(e: TensorEntry) -> tuple:
    m = ENGRAM_RE.match(e.name)
    return (0, int(m.group(1)), e.name) if m else (1, 0, e.name)


def _folder(path: str | Path) -> Path:
    if is_hub_ref(path):  # a Hub repository: its Engram shards fetched into the Hub cache
        return hub_folder(str(path))
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path.parent if path.is_file() else path


def scan_checkpoint(path: str | Path) -> CheckpointScan:
    """Find the Engram-path tensors of a checkpoint folder (headers only, no tensor data); a Hub
    repository (``hf://owner/repo``) is fetched first (``hub.hub_folder``: index and config; its Engram
    shards' headers by byte ranges)."""
    folder = _folder(path)
    mp_files: dict[int, tuple[int, Path]] = {}
    for p in folder.iterdir():
        m = MP_RE.match(p.name)
        if m:
            mp_files[int(m.group(1))] = (int(m.group(2)), p)
    index = folder / INDEX_FILE
    if index.exists():
        scan = _scan_hf_index(folder, index)
    elif mp_files:
        scan = _scan_mp(folder, mp_files)
    elif (folder / SINGLE_FILE).is_file():
        header = read_safetensors_header(folder / SINGLE_FILE)
        tensors = {n: TensorEntry(n, [t]) for n, t in header.tensors.items() if is_engram_path_name(n)}
        scan = CheckpointScan(folder, LAYOUT_HF, [header.path], 1, tensors, len(header.tensors), _marker([header]))
    else:
        shards = sorted(p.name for p in folder.glob("*.safetensors"))
        hint = (
            f"; it holds {len(shards)} safetensors files ({', '.join(shards[:3])}{', ...' if len(shards) > 3 else ''})"
            if shards
            else ""
        )
        raise CheckpointError(
            f"checkpoint {folder}: missing index file {INDEX_FILE} (and no {SINGLE_FILE} or model{{i}}-mp{{n}}.safetensors){hint}"
        )
    marker_path = folder / MARKER_FILE
    if marker_path.is_file():
        scan.marker = read_json(marker_path, "synthetic marker")
    return scan


def _marker(headers: list[SafetensorsHeader]) -> dict | None:
    """The shards' metadata when one says it is synthetic (written by engram-viz), else None."""
    for h in headers:
        if h.metadata.get("engram_viz_synthetic") == "true":
            return dict(h.metadata)
    return None


def _scan_hf_index(folder: Path, index: Path) -> CheckpointScan:
    weight_map = read_weight_map(folder, index)
    by_shard: dict[Path, list[str]] = {}
    for name, shard in weight_map.items():
        if is_engram_path_name(name):
            by_shard.setdefault(shard, []).append(name)
    tensors: dict[str, TensorEntry] = {}
    headers = []
    for shard_path, names in sorted(by_shard.items()):
        if is_remote_shard(shard_path):  # left on the Hub: read by byte ranges
            header = remote_header(shard_path)
        elif not shard_path.is_file():
            raise CheckpointError(f"{index}: shard {shard_path} (holding tensor {names[0]!r}) does not exist")
        else:
            header = read_safetensors_header(shard_path)
        headers.append(header)
        for name in names:
            if name not in header.tensors:
                raise CheckpointError(
                    f"{shard_path}: tensor {name!r} not found, although {index.name} places it in this shard"
                )
            tensors[name] = TensorEntry(name, [header.tensors[name]])
    files = [index] + [h.path for h in headers]
    return CheckpointScan(folder, LAYOUT_HF, files, 1, tensors, len(weight_map), _marker(headers), index_path=index)


def _scan_mp(folder: Path, mp_files: dict[int, tuple[int, Path]]) -> CheckpointScan:
    sizes = {n for n, _ in mp_files.values()}
    if len(sizes) != 1:
        raise CheckpointError(f"checkpoint {folder}: model{{i}}-mp{{n}} parts disagree on n: {sorted(sizes)}")
    (n,) = sizes
    missing = [f"model{i}-mp{n}.safetensors" for i in range(n) if i not in mp_files]
    if missing or len(mp_files) != n:
        raise CheckpointError(
            f"checkpoint {folder}: the mp layout needs {n} parts; missing {missing or 'none'}, extra {sorted(set(mp_files) - set(range(n)))}"
        )
    headers = [read_safetensors_header(mp_files[i][1]) for i in range(n)]
    names = [name for name in headers[0].tensors if is_engram_path_name(name)]
    vocab = None
    try:
        vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
    except (OSError, ValueError, AttributeError):
        pass
    tensors: dict[str, TensorEntry] = {}
    for name in names:
        parts = []
        for h in headers:
            if name not in h.tensors:
                raise CheckpointError(f"{h.path}: tensor {name!r} not found, although {headers[0].path.name} holds it")
            parts.append(h.tensors[name])
        replicated = name == EMBED_NAME and parts[0].shape[0] == vocab
        split = n > 1 and (is_table_name(name) or (name == EMBED_NAME and not replicated))
        tensors[name] = TensorEntry(name, parts, split)
    for h in headers[1:]:
        extra = [name for name in h.tensors if is_engram_path_name(name) and name not in tensors]
        if extra:
            raise CheckpointError(f"{headers[0].path}: tensor {extra[0]!r} not found, although {h.path.name} holds it")
    return CheckpointScan(
        folder, LAYOUT_MP, [h.path for h in headers], n, tensors, len(headers[0].tensors), _marker(headers)
    )
