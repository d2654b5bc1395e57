"""Checkpoints: read a real DeepSeek-V4.1-Flash checkpoint's Engram tensors; write synthetic ones.

Tensor names (reference section 4; no ``model.`` prefix), per Engram layer N:

=================================  ===========  ================================================
name                               dtype        shape
=================================  ===========  ================================================
``layers.N.engram.embed.weight``   F8_E4M3      ``[engram_num_embeddings[i], head_dim]``
``layers.N.engram.embed.scale``    F8_E8M0      ``[engram_num_embeddings[i], head_dim / 32]``
``layers.N.engram.wkv.weight``     F8_E4M3      ``[dim * (hc_mult + 1), n_hash_cols * head_dim]``
``layers.N.engram.wkv.scale``      F8_E8M0      ``[ceil(rows / 32), ceil(cols / 32)]``
``layers.N.engram.q_weight``       BF16         ``[hc_mult, dim]``
``layers.N.engram.k_weight``       BF16         ``[hc_mult, dim]``
``embed.weight``                   BF16         ``[vocab_size, dim]``
=================================  ===========  ================================================

Layouts ``open_checkpoint`` accepts (a folder, or a file inside it):

- ``hf``: ``model.safetensors.index.json`` (``weight_map``: name -> shard) and its shards, or a
  single ``model.safetensors``; ``config.json`` in the folder unless a config is given.
- ``mp``: the inference-converted ``model{i}-mp{n}.safetensors``, i = 0..n-1. Each Engram table
  is row-split as in ``ParallelEngramEmbedding``: part i holds rows ``[i * part, (i + 1) * part)``
  with ``part = ceil(rows / n)`` (the last part padded to ``part`` rows, or short). ``embed.weight``
  is row-split the same way or replicated; ``wkv``, ``q_weight`` and ``k_weight`` are replicated
  and read from part 0.

Tables are read lazily (``table.LazyTable``), the rest eagerly. Every problem raises a
``CheckpointError`` naming the file and the tensor.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engram_viz.config import CONFIG_DIR, FP8_BLOCK_SIZE, PRESETS, ConfigError, EngramConfig, load_config, match_preset
from engram_viz.core import fp8
from engram_viz.weights.table import (
    TORCH_TO_SAFETENSORS,
    CheckpointError,
    EngramTable,
    LazyRows,
    LazyTable,
    ProceduralEmbedding,
    ProceduralTable,
    RowIdError,
    TensorInfo,
    TokenEmbedding,
    read_safetensors_header,
    read_tensor,
)

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointScan",
    "EngramWeights",
    "RowIdError",
    "default_checkpoint",
    "expected_tensors",
    "format_inspect",
    "inspect_checkpoint",
    "open_checkpoint",
    "scan_checkpoint",
    "synthetic_checkpoint",
    "write_synthetic_checkpoint",
]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MP_RE = re.compile(r"^model(\d+)-mp(\d+)\.safetensors$")
MARKER_FILE = "SYNTHETIC.json"
EMBED_NAME = "embed.weight"
ENGRAM_RE = re.compile(r"^layers\.(\d+)\.engram\.")
SYNTHETIC_FORMAT = 1  # bump when the synthetic generator changes (invalidates cached folders)
MAX_WRITE_BYTES = 2 * 2**30  # larger configs get the procedural synthetic checkpoint instead

LAYOUT_HF, LAYOUT_MP, LAYOUT_PROCEDURAL = "hf", "mp", "procedural"


def engram_names(layer_id: int) -> dict[str, str]:
    """The checkpoint names of one Engram layer's tensors, keyed by role."""
    p = f"layers.{layer_id}.engram."
    return {
        "table_weight": p + "embed.weight",
        "table_scale": p + "embed.scale",
        "wkv_weight": p + "wkv.weight",
        "wkv_scale": p + "wkv.scale",
        "q_weight": p + "q_weight",
        "k_weight": p + "k_weight",
    }


def wkv_shape(config: EngramConfig) -> tuple[int, int]:
    """``wkv`` is Linear(n_hash_cols * head_dim -> dim * (hc_mult + 1)): weight ``[N, K]``."""
    return config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim


def expected_tensors(config: EngramConfig) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Every tensor the Engram path needs: name -> (safetensors dtype, shape)."""
    d, b = config.engram_head_dim, FP8_BLOCK_SIZE
    n, k = wkv_shape(config)
    out: dict[str, tuple[str, tuple[int, ...]]] = {}
    for layer_id, rows in zip(config.engram_layer_ids, config.engram_num_embeddings):
        names = engram_names(layer_id)
        out[names["table_weight"]] = ("F8_E4M3", (rows, d))
        out[names["table_scale"]] = ("F8_E8M0", (rows, d // b))
        out[names["wkv_weight"]] = ("F8_E4M3", (n, k))
        out[names["wkv_scale"]] = ("F8_E8M0", (-(-n // b), -(-k // b)))
        out[names["q_weight"]] = ("BF16", (config.hc_mult, config.dim))
        out[names["k_weight"]] = ("BF16", (config.hc_mult, config.dim))
    out[EMBED_NAME] = ("BF16", (config.vocab_size, config.dim))
    return out


def _is_table(name: str) -> bool:
    return bool(ENGRAM_RE.match(name)) and name.endswith((".engram.embed.weight", ".engram.embed.scale"))


def _wanted(name: str) -> bool:
    return name == EMBED_NAME or bool(ENGRAM_RE.match(name))


# --------------------------------------------------------------------------------------------
# scanning a folder


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


def _read_json(path: Path, what: str) -> dict:
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{what} {path} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CheckpointError(f"{what} {path} is corrupt: not valid JSON ({err})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{what} {path} is corrupt: expected a JSON object")
    return doc


def _folder(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    return path.parent if path.is_file() else path


def scan_checkpoint(path: str | Path) -> CheckpointScan:
    """Find the Engram-path tensors of a checkpoint folder (headers only, no tensor data)."""
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
        tensors = {n: TensorEntry(n, [t]) for n, t in header.tensors.items() if _wanted(n)}
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
        scan.marker = _read_json(marker_path, "synthetic marker")
    return scan


def _marker(headers) -> dict | None:
    for h in headers:
        if h.metadata.get("engram_viz_synthetic") == "true":
            return dict(h.metadata)
    return None


def _scan_hf_index(folder: Path, index: Path) -> CheckpointScan:
    doc = _read_json(index, "index file")
    weight_map = doc.get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise CheckpointError(f"index file {index} is corrupt: expected a 'weight_map' object of name -> shard file")
    by_shard: dict[str, list[str]] = {}
    for name, shard in weight_map.items():
        if _wanted(name):
            by_shard.setdefault(shard, []).append(name)
    tensors: dict[str, TensorEntry] = {}
    headers = []
    for shard, names in sorted(by_shard.items()):
        shard_path = folder / shard
        if not shard_path.is_file():
            raise CheckpointError(f"{index}: shard {shard_path} (holding tensor {names[0]!r}) does not exist")
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
    names = [name for name in headers[0].tensors if _wanted(name)]
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
        split = n > 1 and (_is_table(name) or (name == EMBED_NAME and not replicated))
        tensors[name] = TensorEntry(name, parts, split)
    for h in headers[1:]:
        extra = [name for name in h.tensors if _wanted(name) and name not in tensors]
        if extra:
            raise CheckpointError(f"{headers[0].path}: tensor {extra[0]!r} not found, although {h.path.name} holds it")
    return CheckpointScan(
        folder, LAYOUT_MP, [h.path for h in headers], n, tensors, len(headers[0].tensors), _marker(headers)
    )


# --------------------------------------------------------------------------------------------
# opening


@dataclass
class EngramWeights:
    """One Engram layer's weights: the table (lazy or procedural) and the eager small tensors.

    ``wkv_weight`` e4m3 ``[dim * (hc + 1), n_hash_cols * head_dim]`` with e8m0 block scales
    ``wkv_scale`` ``[ceil(N / 32), ceil(K / 32)]``; ``q_weight`` and ``k_weight`` bf16 ``[hc, dim]``.
    """

    layer_id: int
    table: EngramTable
    wkv_weight: torch.Tensor
    wkv_scale: torch.Tensor
    q_weight: torch.Tensor
    k_weight: torch.Tensor


@dataclass
class Checkpoint:
    """An opened checkpoint: config, per-layer Engram weights and the token embedding.

    ``label`` says where the weights come from and, for synthetic ones, starts with ``SYNTHETIC``.
    ``path`` is None for the procedural synthetic checkpoint. ``embed.rows(raw_ids [...])`` gives
    bf16 ``[..., dim]``.
    """

    config: EngramConfig
    path: Path | None
    label: str
    synthetic: bool
    layers: dict[int, EngramWeights]
    embed: TokenEmbedding
    tokenizer_path: Path | None = None
    layout: str = LAYOUT_HF
    files: tuple[Path, ...] = field(default_factory=tuple)

    def layer(self, layer_id: int) -> EngramWeights:
        if layer_id not in self.layers:
            raise KeyError(
                f"layer {layer_id} is not an Engram layer of {self.label}; expected one of {sorted(self.layers)}"
            )
        return self.layers[layer_id]

    def describe(self) -> dict:
        """Plain-JSON provenance and shapes."""
        return {
            "label": self.label,
            "synthetic": self.synthetic,
            "path": str(self.path) if self.path else None,
            "layout": self.layout,
            "config": self.config.name,
            "tokenizer": str(self.tokenizer_path) if self.tokenizer_path else None,
            "layers": {
                str(lid): {
                    "table": self._table_desc(w.table),
                    "wkv_weight": list(w.wkv_weight.shape),
                    "wkv_scale": list(w.wkv_scale.shape),
                    "q_weight": list(w.q_weight.shape),
                    "k_weight": list(w.k_weight.shape),
                }
                for lid, w in self.layers.items()
            },
            "embed": {"rows": self.embed.num_rows, "dim": self.embed.dim, "label": self.embed.label},
        }

    @staticmethod
    def _table_desc(t: EngramTable) -> dict:
        return {
            "rows": t.num_rows,
            "head_dim": t.head_dim,
            "kind": type(t).__name__,
            "label": t.label,
            "synthetic": t.synthetic,
        }

    def close(self) -> None:
        """Close the files behind lazy tables and the embedding (reopened on the next read)."""
        for w in self.layers.values():
            if isinstance(w.table, LazyTable):
                w.table.close()
        if isinstance(self.embed.source, LazyRows):
            self.embed.source.close()


def _resolve_config(scan: CheckpointScan, config) -> EngramConfig:
    if config is not None:
        return load_config(config)
    if scan.config_path is None:
        raise CheckpointError(
            f"checkpoint {scan.path} has no config.json; pass config= (a preset name or a config.json path)"
        )
    try:
        cfg = load_config(scan.config_path)
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {scan.path}: {err}") from None
    return match_preset(cfg)


def _check_entry(
    scan: CheckpointScan, config: EngramConfig, name: str, dtype: str, shape: tuple[int, ...]
) -> list[TensorInfo]:
    """Check one tensor's dtype and shape (per part in the mp layout); returns its parts."""
    entry = scan.tensors.get(name)
    if entry is None:
        where = scan.index_path or (scan.files[0] if scan.layout == LAYOUT_MP else scan.path / SINGLE_FILE)
        raise CheckpointError(f"{where}: tensor {name!r} not found (config {config.name!r} needs it)")
    for p in entry.parts:
        if p.dtype != dtype:
            raise CheckpointError(
                f"{p.path}: tensor {name!r} has dtype {p.dtype}, expected {dtype} (config {config.name!r})"
            )
    n = len(entry.parts)
    split = n > 1 and (_is_table(name) or (name == EMBED_NAME and entry.parts[0].shape[0] != shape[0]))
    if not split:
        for p in entry.parts:
            if p.shape != shape:
                raise CheckpointError(
                    f"{p.path}: tensor {name!r} has shape {list(p.shape)}, expected {list(shape)} (config {config.name!r})"
                )
        return entry.parts[:1]
    rows, rest = shape[0], shape[1:]
    part = -(-rows // n)
    for i, p in enumerate(entry.parts):
        allowed = {part} if i < n - 1 else {part, rows - (n - 1) * part}
        if p.shape[1:] != rest or p.shape[0] not in allowed:
            want = " or ".join(str([r, *rest]) for r in sorted(allowed))
            raise CheckpointError(
                f"{p.path}: tensor {name!r} (part {i} of {n}) has shape {list(p.shape)}, expected {want} "
                f"(rows {list(shape)} of config {config.name!r} split over {n} parts)"
            )
    return entry.parts


def _validated_parts(scan: CheckpointScan, cfg: EngramConfig) -> dict[str, list[TensorInfo]]:
    """Every tensor the config needs, checked for presence, dtype and shape: name -> parts to read.
    A tiny Engram LM folder (``tiny_model``) keeps its own compact token embedding instead of
    ``embed.weight``."""
    from engram_viz.tiny.model import is_tiny_lm_folder

    skip = (EMBED_NAME,) if is_tiny_lm_folder(scan.path) else ()
    return {
        name: _check_entry(scan, cfg, name, dtype, shape)
        for name, (dtype, shape) in expected_tensors(cfg).items()
        if name not in skip
    }


def _label(scan: CheckpointScan, cfg: EngramConfig) -> str:
    from engram_viz.tiny.model import checkpoint_label, is_tiny_lm_folder

    if is_tiny_lm_folder(scan.path):
        return checkpoint_label(scan.path)
    if scan.synthetic:
        m = scan.marker or {}
        return f"SYNTHETIC {m.get('config', cfg.name)} checkpoint (seed {m.get('seed', '?')}; random weights, not trained) at {scan.path}"
    return f"checkpoint {scan.path} ({scan.layout} layout, {len(scan.files)} files)"


def open_checkpoint(path: str | Path, config: EngramConfig | str | Path | None = None) -> Checkpoint:
    """Open a checkpoint folder (HF or mp layout), check every Engram tensor against the config
    (the folder's ``config.json`` unless ``config`` is given) and load: tables lazily, the rest eagerly."""
    scan = scan_checkpoint(path)
    cfg = _resolve_config(scan, config)
    parts = _validated_parts(scan, cfg)
    synthetic = scan.synthetic
    label = _label(scan, cfg)
    prefix = "SYNTHETIC " if synthetic else ""
    layers = {}
    for layer_id, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        names = engram_names(layer_id)
        table = LazyTable(
            LazyRows(parts[names["table_weight"]], num_rows=rows),
            LazyRows(parts[names["table_scale"]], num_rows=rows),
            label=f"{prefix}table layers.{layer_id}.engram.embed of {scan.path}",
            synthetic=synthetic,
        )
        layers[layer_id] = EngramWeights(
            layer_id=layer_id,
            table=table,
            wkv_weight=read_tensor(parts[names["wkv_weight"]][0]),
            wkv_scale=read_tensor(parts[names["wkv_scale"]][0]),
            q_weight=read_tensor(parts[names["q_weight"]][0]),
            k_weight=read_tensor(parts[names["k_weight"]][0]),
        )
    if EMBED_NAME in parts:
        embed = TokenEmbedding(
            LazyRows(parts[EMBED_NAME], num_rows=cfg.vocab_size),
            label=f"{prefix}token embedding embed.weight of {scan.path}",
            synthetic=synthetic,
        )
    else:  # a tiny Engram LM folder: its compact embedding over the raw ids it knows
        from engram_viz.tiny.model import compact_token_embedding

        embed = compact_token_embedding(scan.path, label)
    return Checkpoint(
        config=cfg,
        path=scan.path,
        label=label,
        synthetic=synthetic,
        layers=layers,
        embed=embed,
        tokenizer_path=scan.tokenizer_path,
        layout=scan.layout,
        files=tuple(scan.files),
    )


# --------------------------------------------------------------------------------------------
# synthetic checkpoints


def _derive_seed(seed: int, name: str) -> int:
    """A per-tensor seed, so each tensor's values do not depend on which others are generated."""
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (2**63)


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(_derive_seed(seed, name))


def synthetic_bytes(config: EngramConfig) -> int:
    """Bytes a written synthetic checkpoint of ``config`` would take."""
    total = 0
    for dtype, shape in expected_tensors(config).values():
        total += math.prod(shape) * (2 if dtype == "BF16" else 1)
    return total


def _synthetic_wkv(config: EngramConfig, seed: int, layer_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """wkv ~ N(0, 1 / sqrt(K)) quantised with 32 x 32 block scales, generated 1024 rows at a time."""
    n, k = wkv_shape(config)
    g = _generator(seed, engram_names(layer_id)["wkv_weight"])
    w = torch.empty(n, k, dtype=torch.float8_e4m3fn)
    s = torch.empty(-(-n // FP8_BLOCK_SIZE), -(-k // FP8_BLOCK_SIZE), dtype=torch.float8_e8m0fnu)
    step = 1024  # a multiple of 32: the block scales are those of the whole matrix
    for a in range(0, n, step):
        rows = min(step, n - a)
        q, sc = fp8.quantize_matrix(torch.randn(rows, k, generator=g) / math.sqrt(k))
        w[a : a + rows] = q
        s[a // FP8_BLOCK_SIZE : a // FP8_BLOCK_SIZE + sc.shape[0]] = sc
    return w, s


def _synthetic_gates(config: EngramConfig, seed: int, name: str) -> torch.Tensor:
    """q / k weights ~ 1 + 0.1 N(0, 1), bf16 ``[hc, dim]``."""
    return (1 + 0.1 * torch.randn(config.hc_mult, config.dim, generator=_generator(seed, name))).to(torch.bfloat16)


def synthetic_tensors(config: EngramConfig | str = "tiny", seed: int = 0) -> dict[str, torch.Tensor]:
    """Every Engram-path tensor of a small synthetic checkpoint, with its real name, dtype and shape.

    Tables ~ N(0, 1) quantised per 32 features (``fp8.quantize_rows``), wkv ~ N(0, 1/sqrt(K))
    with 32 x 32 block scales (``fp8.quantize_matrix``), q / k weights ~ 1 + 0.1 N(0, 1),
    ``embed.weight`` ~ N(0, 1) in bf16: gates spread over (0, 1) instead of sitting at 0.5.
    """
    cfg = load_config(config)
    out: dict[str, torch.Tensor] = {}
    for layer_id, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        names = engram_names(layer_id)
        g = _generator(seed, names["table_weight"])
        out[names["table_weight"]], out[names["table_scale"]] = fp8.quantize_rows(
            torch.randn(rows, cfg.engram_head_dim, generator=g)
        )
        out[names["wkv_weight"]], out[names["wkv_scale"]] = _synthetic_wkv(cfg, seed, layer_id)
        out[names["q_weight"]] = _synthetic_gates(cfg, seed, names["q_weight"])
        out[names["k_weight"]] = _synthetic_gates(cfg, seed, names["k_weight"])
    out[EMBED_NAME] = torch.randn(cfg.vocab_size, cfg.dim, generator=_generator(seed, EMBED_NAME)).to(torch.bfloat16)
    return out


def _hf_shards(config: EngramConfig) -> list[list[str]]:
    """Mirror the real layout: the token embedding first, every Engram tensor but the last layer's
    table next (as layer 1's tensors share shard 47), the last layer's table on its own (shard 48)."""
    last = engram_names(config.engram_layer_ids[-1])
    last_table = [last["table_weight"], last["table_scale"]]
    middle = [name for name in expected_tensors(config) if name != EMBED_NAME and name not in last_table]
    return [[EMBED_NAME], middle, last_table]


def _save(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str]) -> None:
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


def _config_text(cfg: EngramConfig) -> str:
    if cfg.name in PRESETS:
        return (CONFIG_DIR / f"{cfg.name}.json").read_text()
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k != "name"}, indent=2)


def write_synthetic_checkpoint(
    out_dir: str | Path,
    config: EngramConfig | str = "tiny",
    seed: int = 0,
    world_size: int = 1,
    layout: str | None = None,
    tokenizer: bool = True,
) -> Path:
    """Write a whole synthetic checkpoint folder (real names, dtypes and shapes) and return its path.

    ``layout`` is ``"hf"`` (index + 3 shards; the default when ``world_size == 1``) or ``"mp"``
    (``model{i}-mp{world_size}.safetensors``; the default when ``world_size > 1``). The folder gets
    ``config.json``, ``SYNTHETIC.json`` (the marker that labels it synthetic; every shard's
    metadata says so too) and, with ``tokenizer``, the bundled ``tokenizer.json``. Written into a
    temporary sibling folder and renamed into place: an error leaves nothing behind.
    Configs over 2 GiB (v41-flash) are refused: use ``synthetic_checkpoint`` (procedural tables).
    """
    cfg = load_config(config)
    layout = layout or (LAYOUT_HF if world_size == 1 else LAYOUT_MP)
    if layout not in (LAYOUT_HF, LAYOUT_MP):
        raise ValueError(f"layout must be 'hf' or 'mp', got {layout!r}")
    if world_size < 1 or (layout == LAYOUT_HF and world_size != 1):
        raise ValueError(f"world_size {world_size}: expected 1 for the hf layout, >= 1 for mp")
    if layout == LAYOUT_MP and cfg.vocab_size % world_size:
        raise ValueError(
            f"world_size {world_size} must divide vocab_size {cfg.vocab_size} (embed.weight is split evenly)"
        )
    size = synthetic_bytes(cfg)
    if size > MAX_WRITE_BYTES:
        raise ValueError(
            f"a synthetic {cfg.name!r} checkpoint would take {size / 1e9:.1f} GB; use synthetic_checkpoint({cfg.name!r}), "
            "which serves procedural tables without writing them"
        )
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".partial", dir=out.parent))
    try:
        tensors = synthetic_tensors(cfg, seed)
        marker = {
            "synthetic": True,
            "config": cfg.name,
            "seed": seed,
            "format": SYNTHETIC_FORMAT,
            "layout": layout,
            "world_size": world_size,
            "generator": "engram_viz.weights.checkpoint.write_synthetic_checkpoint",
            "note": "random weights drawn by engram-viz, not trained: gates are not DeepSeek's",
        }
        meta = {"format": "pt", "engram_viz_synthetic": "true", "config": cfg.name, "seed": str(seed)}
        if layout == LAYOUT_HF:
            shards = _hf_shards(cfg)
            weight_map = {}
            for i, names in enumerate(shards, start=1):
                fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
                _save({n: tensors[n] for n in names}, tmp / fname, meta)
                weight_map.update(dict.fromkeys(names, fname))
            index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
            (tmp / INDEX_FILE).write_text(json.dumps(index, indent=2))
        else:
            for rank in range(world_size):
                _save(_mp_part(cfg, tensors, rank, world_size), tmp / f"model{rank}-mp{world_size}.safetensors", meta)
        (tmp / "config.json").write_text(_config_text(cfg))
        (tmp / MARKER_FILE).write_text(json.dumps(marker, indent=2))
        if tokenizer:
            from engram_viz.core.tokenizer import bundled_tokenizer_file

            shutil.copyfile(bundled_tokenizer_file(), tmp / "tokenizer.json")
        _publish_modes(tmp)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _publish_modes(folder: Path) -> None:
    """mkdtemp makes a private folder; give it (and its files) the modes the umask allows."""
    umask = os.umask(0)
    os.umask(umask)
    folder.chmod(0o777 & ~umask)
    for f in folder.iterdir():
        f.chmod(0o666 & ~umask)


def _mp_part(
    cfg: EngramConfig, tensors: dict[str, torch.Tensor], rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s file: tables row-split into ``ceil(rows / n)``-row parts (the last padded with
    zero rows of scale 1, as each rank's parameter has ``part`` rows), ``embed.weight`` split evenly,
    everything else replicated."""
    out = {}
    for name, t in tensors.items():
        if _is_table(name):
            rows = t.shape[0]
            part = -(-rows // world_size)
            piece = t[rank * part : (rank + 1) * part]
            if piece.shape[0] < part:
                fill = 0 if t.dtype == torch.float8_e4m3fn else 127  # e4m3 zero; e8m0 127 = 1.0
                pad = torch.full((part - piece.shape[0], t.shape[1]), fill, dtype=torch.uint8).view(t.dtype)
                piece = torch.cat([piece.view(torch.uint8), pad.view(torch.uint8)]).view(t.dtype)
            out[name] = piece.clone()
        elif name == EMBED_NAME:
            part = t.shape[0] // world_size
            out[name] = t[rank * part : (rank + 1) * part].clone()
        else:
            out[name] = t
    return out


def _config_slug(cfg: EngramConfig) -> str:
    body = json.dumps({k: v for k, v in cfg.to_dict().items() if k != "name"}, sort_keys=True)
    digest = hashlib.sha256(body.encode()).hexdigest()[:10]
    name = cfg.name if cfg.name in PRESETS else "custom"
    return f"{name}-{digest}"


_SYNTHETIC_CACHE: dict[tuple, Checkpoint] = {}


def synthetic_checkpoint(config: EngramConfig | str = "tiny", seed: int = 0) -> Checkpoint:
    """A synthetic checkpoint with the config's names, dtypes and shapes, labelled SYNTHETIC.

    Small configs (``tiny``) are written once into ``tokenizer.cache_dir()/synthetic/`` and opened
    like a real folder (lazy tables). Large ones (``v41-flash``) are procedural: each table is a
    ``ProceduralTable`` (row r a fixed function of (seed, r)), the token embedding a
    ``ProceduralEmbedding``, and ``wkv`` / ``q_weight`` / ``k_weight`` are generated eagerly (the
    wkv pair is cached on disk after the first build: 157 MB per layer at v41-flash size).
    One object per (config, seed) per process.
    """
    from engram_viz.core.tokenizer import cache_dir

    cfg = load_config(config)
    key = (cfg, int(seed))
    if key in _SYNTHETIC_CACHE:
        return _SYNTHETIC_CACHE[key]
    if synthetic_bytes(cfg) <= MAX_WRITE_BYTES:
        folder = cache_dir() / "synthetic" / f"{_config_slug(cfg)}-seed{seed}-v{SYNTHETIC_FORMAT}"
        ckpt = None
        if folder.is_dir():
            try:
                ckpt = open_checkpoint(folder, cfg)
            except CheckpointError:  # a damaged cache entry: rebuild it
                shutil.rmtree(folder, ignore_errors=True)
        if ckpt is None:
            try:
                write_synthetic_checkpoint(folder, cfg, seed)
            except (FileExistsError, OSError):
                if not folder.is_dir():  # another process may have won the rename race
                    raise
            ckpt = open_checkpoint(folder, cfg)
    else:
        ckpt = _procedural_checkpoint(cfg, int(seed), cache_dir() / "synthetic")
    _SYNTHETIC_CACHE[key] = ckpt
    return ckpt


def _procedural_checkpoint(cfg: EngramConfig, seed: int, cache: Path) -> Checkpoint:
    layers = {}
    for layer_id, rows in zip(cfg.engram_layer_ids, cfg.engram_num_embeddings):
        names = engram_names(layer_id)
        table = ProceduralTable(
            rows,
            cfg.engram_head_dim,
            seed=_derive_seed(seed, names["table_weight"]),
            label=f"SYNTHETIC procedural table layers.{layer_id}.engram.embed ({rows:,} x {cfg.engram_head_dim}, seed {seed})",
        )
        wkv_w, wkv_s = _cached_wkv(cfg, seed, layer_id, cache)
        layers[layer_id] = EngramWeights(
            layer_id=layer_id,
            table=table,
            wkv_weight=wkv_w,
            wkv_scale=wkv_s,
            q_weight=_synthetic_gates(cfg, seed, names["q_weight"]),
            k_weight=_synthetic_gates(cfg, seed, names["k_weight"]),
        )
    embed = ProceduralEmbedding(
        cfg.vocab_size,
        cfg.dim,
        seed=_derive_seed(seed, EMBED_NAME),
        label=f"SYNTHETIC procedural token embedding ({cfg.vocab_size:,} x {cfg.dim}, seed {seed})",
    )
    label = (
        f"SYNTHETIC procedural {cfg.name} checkpoint (seed {seed}; random weights, not trained): tables and token "
        "embedding computed row by row, wkv and gate weights drawn at random"
    )
    return Checkpoint(cfg, None, label, True, layers, embed, tokenizer_path=None, layout=LAYOUT_PROCEDURAL)


def _cached_wkv(cfg: EngramConfig, seed: int, layer_id: int, cache: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """``_synthetic_wkv``, kept in a safetensors file in the cache after the first build (atomic write)."""
    names = engram_names(layer_id)
    path = cache / f"{_config_slug(cfg)}-seed{seed}-v{SYNTHETIC_FORMAT}-wkv-L{layer_id}.safetensors"
    if path.is_file():
        try:
            header = read_safetensors_header(path)
            w = read_tensor(header.tensors[names["wkv_weight"]])
            s = read_tensor(header.tensors[names["wkv_scale"]])
            n, k = wkv_shape(cfg)
            if w.shape == (n, k) and w.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu:
                return w, s
        except (CheckpointError, KeyError):
            pass
    w, s = _synthetic_wkv(cfg, seed, layer_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".partial")
    os.close(fd)
    try:
        _save({names["wkv_weight"]: w, names["wkv_scale"]: s}, Path(tmp), {"engram_viz_synthetic": "true"})
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return w, s


def default_checkpoint() -> Checkpoint:
    """The checkpoint used when none is given: the trained tiny Engram LM committed in
    ``data/tiny-engram`` (see its MODEL_CARD.md); the synthetic ``tiny`` checkpoint (seed 0,
    labelled SYNTHETIC) only when that folder is missing."""
    from engram_viz.tiny.model import DEFAULT_DIR, is_tiny_lm_folder

    if is_tiny_lm_folder(DEFAULT_DIR):
        return open_checkpoint(DEFAULT_DIR)
    return synthetic_checkpoint("tiny", 0)


def safetensors_dtype(t: torch.Tensor) -> str:
    """The safetensors dtype string of a tensor (e.g. ``F8_E4M3``)."""
    return TORCH_TO_SAFETENSORS[t.dtype]


# --------------------------------------------------------------------------------------------
# inspect


def inspect_checkpoint(path: str | Path, config: EngramConfig | str | Path | None = None) -> dict:
    """What ``engram-viz inspect`` reports: the Engram-path tensors found (dtype, shape, files, bytes)
    and whether they match the config (``valid``: True / False, or None when no config is known).
    Reads headers only. Raises ``CheckpointError`` when the folder cannot even be scanned."""
    scan = scan_checkpoint(path)
    out = scan.describe()
    out.update(config=None, valid=None, error=None, label=None)
    try:
        cfg = _resolve_config(scan, config)
    except (CheckpointError, ConfigError) as err:
        out["error"] = str(err)
        return out
    out["config"] = cfg.name
    out["label"] = _label(scan, cfg)
    try:
        _validated_parts(scan, cfg)
        out["valid"] = True
    except CheckpointError as err:
        out["valid"], out["error"] = False, str(err)
    return out


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_inspect(report: dict) -> str:
    """Human-readable table of an ``inspect_checkpoint`` report."""
    head = (
        f"checkpoint {report['path']}: {report['layout']} layout, {len(report['files'])} files, "
        f"{report['n_tensors']:,} tensors listed, {len(report['tensors'])} on the Engram path"
    )
    lines = [head]
    if report["synthetic"]:
        lines.append("SYNTHETIC: random weights written by engram-viz, not trained")
    rows = [("tensor", "dtype", "shape", "size", "file(s)")]
    for t in report["tensors"]:
        if t["parts"] > 1:
            how = "rows split" if t["split"] else "replicated"
            files = f"{t['files'][0]} .. {t['files'][-1]} ({how} over {t['parts']})"
        else:
            files = t["files"][0]
        rows.append((t["name"], t["dtype"], str(t["shape"]), _size(t["bytes"]), files))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    lines.append(f"Engram-path bytes: {_size(report['engram_bytes'])}")
    if report["valid"] is True:
        lines.append(f"check against config {report['config']}: ok (every dtype and shape as expected)")
    elif report["valid"] is False:
        lines.append(f"check against config {report['config']}: FAILED: {report['error']}")
    else:
        lines.append(f"not checked against a config: {report['error']}")
    return "\n".join(lines)
