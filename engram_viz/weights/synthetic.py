"""Synthetic checkpoints: random weights with the real names, dtypes and shapes, labelled SYNTHETIC.

- ``write_synthetic_checkpoint``: a whole folder (``hf`` index + shards, or ``model{i}-mp{n}``
  parts) for small configs (``tiny``), with ``config.json``, the ``SYNTHETIC.json`` marker and the
  bundled ``tokenizer.json``.
- ``synthetic_checkpoint``: the cached, opened one for any config; configs over 2 GiB
  (``v41-flash``) are procedural (``ProceduralTable`` / ``ProceduralEmbedding``), their ``wkv``
  cached on disk.

Every tensor draws from its own seed (``_derive_seed(seed, name)``), so a tensor's values do not
depend on which others are generated.
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import zlib
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram_viz._cache import cached, cached_folder
from engram_viz._files import atomic_folder
from engram_viz.config import CONFIG_DIR, FP8_BLOCK_SIZE, PRESETS, EngramConfig, load_config
from engram_viz.core import fp8
from engram_viz.core.block0_config import Block0Config
from engram_viz.core.blocks_config import BlocksConfig
from engram_viz.core.schema import EMBED_NAME, engram_names, expected_tensors, is_table_name, wkv_shape
from engram_viz.core.tokenizer import bundled_tokenizer_file
from engram_viz.core.vision_config import VisionConfig
from engram_viz.errors import CheckpointError, InputError
from engram_viz.settings import cache_dir
from engram_viz.weights.block0_synthetic import add_block0
from engram_viz.weights.blocks_synthetic import add_blocks
from engram_viz.weights.checkpoint import Checkpoint, EngramWeights, open_checkpoint
from engram_viz.weights.procedural import ProceduralEmbedding, ProceduralTable
from engram_viz.weights.safetensors import read_safetensors_header, read_tensor
from engram_viz.weights.scan import INDEX_FILE, LAYOUT_HF, LAYOUT_MP, LAYOUT_PROCEDURAL, MARKER_FILE
from engram_viz.weights.vision_synthetic import add_vision

SYNTHETIC_FORMAT = 1  # bump when the synthetic generator changes (invalidates cached folders)
MAX_WRITE_BYTES = 2 * 2**30  # larger configs get the procedural synthetic checkpoint instead


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
    block0: Block0Config | None = None,
    vision: VisionConfig | None = None,
    blocks: BlocksConfig | None = None,
) -> Path:
    """Write a whole synthetic checkpoint folder (real names, dtypes and shapes) and return its path.
    With ``block0`` (hf layout only) the folder also holds block 0's tensors and config fields
    (``weights.block0_synthetic.add_block0``), so ``streams="block0"`` can run on it; with ``vision``
    (hf layout only) the vision tower, aligner and span delimiters (``weights.vision_synthetic.add_vision``),
    so real pictures get image features; with ``blocks`` every block before the last Engram layer
    (``weights.blocks_synthetic.add_blocks``), so ``streams="model"`` can.

    ``layout`` is ``"hf"`` (index + 3 shards; the default when ``world_size == 1``) or ``"mp"``
    (``model{i}-mp{world_size}.safetensors``; the default when ``world_size > 1``). The folder gets
    ``config.json``, ``SYNTHETIC.json`` (the marker that labels it synthetic; every shard's
    metadata says so too) and, with ``tokenizer``, the bundled ``tokenizer.json``. Written through
    ``_files.atomic_folder`` (built beside it, swapped in whole): an error leaves nothing behind.
    Configs over 2 GiB (v41-flash) are refused: use ``synthetic_checkpoint`` (procedural tables).
    """
    cfg = load_config(config)
    layout = layout or (LAYOUT_HF if world_size == 1 else LAYOUT_MP)
    _check_write(cfg, layout, world_size)
    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"{out} already exists; remove it or choose another folder")
    with atomic_folder(out) as folder:
        _write_folder(folder, cfg, seed, layout, world_size, tokenizer)
        if block0 is not None:
            if layout != LAYOUT_HF:
                raise InputError(f"block0= needs the hf layout, got {layout!r}")
            add_block0(folder, block0, lambda name: _generator(seed, name), {"engram_viz_synthetic": "true"})
        if vision is not None:
            if layout != LAYOUT_HF:
                raise InputError(f"vision= needs the hf layout, got {layout!r}")
            add_vision(folder, vision, lambda name: _generator(seed, name), {"engram_viz_synthetic": "true"})
        if blocks is not None:
            if layout != LAYOUT_HF or block0 is not None:
                raise InputError(f"blocks= needs the hf layout and no block0= (it holds block 0), got {layout!r}")
            add_blocks(folder, blocks, lambda name: _generator(seed, name), {"engram_viz_synthetic": "true"})
    return out


def _check_write(cfg: EngramConfig, layout: str, world_size: int) -> None:
    """Refuse an unknown layout, a world size the layout cannot take and configs over 2 GiB."""
    if layout not in (LAYOUT_HF, LAYOUT_MP):
        raise InputError(f"layout must be 'hf' or 'mp', got {layout!r}")
    if world_size < 1 or (layout == LAYOUT_HF and world_size != 1):
        raise InputError(f"world_size {world_size}: expected 1 for the hf layout, >= 1 for mp")
    if layout == LAYOUT_MP and cfg.vocab_size % world_size:
        raise InputError(
            f"world_size {world_size} must divide vocab_size {cfg.vocab_size} (embed.weight is split evenly)"
        )
    size = synthetic_bytes(cfg)
    if size > MAX_WRITE_BYTES:
        raise InputError(
            f"a synthetic {cfg.name!r} checkpoint would take {size / 1e9:.1f} GB; use synthetic_checkpoint({cfg.name!r}), "
            "which serves procedural tables without writing them"
        )


def _write_folder(folder: Path, cfg: EngramConfig, seed: int, layout: str, world_size: int, tokenizer: bool) -> None:
    """The checkpoint's files in ``folder``: shards or mp parts, config.json, the marker, the tokenizer."""
    tensors = synthetic_tensors(cfg, seed)
    marker = {
        "synthetic": True,
        "config": cfg.name,
        "seed": seed,
        "format": SYNTHETIC_FORMAT,
        "layout": layout,
        "world_size": world_size,
        "generator": "engram_viz.weights.synthetic.write_synthetic_checkpoint",
        "note": "random weights drawn by engram-viz, not trained: gates are not DeepSeek's",
    }
    meta = {"format": "pt", "engram_viz_synthetic": "true", "config": cfg.name, "seed": str(seed)}
    if layout == LAYOUT_HF:
        shards = _hf_shards(cfg)
        weight_map = {}
        for i, names in enumerate(shards, start=1):
            fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            _save({n: tensors[n] for n in names}, folder / fname, meta)
            weight_map.update(dict.fromkeys(names, fname))
        index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())}, "weight_map": weight_map}
        (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    else:
        for rank in range(world_size):
            _save(_mp_part(cfg, tensors, rank, world_size), folder / f"model{rank}-mp{world_size}.safetensors", meta)
    (folder / "config.json").write_text(_config_text(cfg))
    (folder / MARKER_FILE).write_text(json.dumps(marker, indent=2))
    if tokenizer:
        shutil.copyfile(bundled_tokenizer_file(), folder / "tokenizer.json")


def _mp_part(
    cfg: EngramConfig, tensors: dict[str, torch.Tensor], rank: int, world_size: int
) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s file: tables row-split into ``ceil(rows / n)``-row parts (the last padded with
    zero rows of scale 1, as each rank's parameter has ``part`` rows), ``embed.weight`` split evenly,
    everything else replicated."""
    out = {}
    for name, t in tensors.items():
        if is_table_name(name):
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

    Small configs (``tiny``) are written once into ``settings.cache_dir()/synthetic/`` and opened
    like a real folder (lazy tables). Large ones (``v41-flash``) are procedural: each table is a
    ``ProceduralTable`` (row r a fixed function of (seed, r)), the token embedding a
    ``ProceduralEmbedding``, and ``wkv`` / ``q_weight`` / ``k_weight`` are generated eagerly (the
    wkv pair is cached on disk after the first build: 157 MB per layer at v41-flash size).
    One object per (config, seed) per process.
    """
    cfg = load_config(config)
    key = (cfg, int(seed))
    if key in _SYNTHETIC_CACHE:
        return _SYNTHETIC_CACHE[key]
    if synthetic_bytes(cfg) <= MAX_WRITE_BYTES:
        folder = cache_dir() / "synthetic" / f"{_config_slug(cfg)}-seed{seed}-v{SYNTHETIC_FORMAT}"
        ckpt = cached_folder(
            folder,
            lambda path: open_checkpoint(path, cfg),
            lambda build: _write_folder(build, cfg, seed, LAYOUT_HF, 1, True),
            damaged=(CheckpointError,),  # a damaged cache entry is rebuilt
        )
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

    def read(path: Path) -> tuple[torch.Tensor, torch.Tensor] | None:  # the sidecar already matched
        try:
            header = read_safetensors_header(path)
            w = read_tensor(header.tensors[names["wkv_weight"]])
            s = read_tensor(header.tensors[names["wkv_scale"]])
        except (CheckpointError, KeyError):
            return None
        n, k = wkv_shape(cfg)
        ok = w.shape == (n, k) and w.dtype == torch.float8_e4m3fn and s.dtype == torch.float8_e8m0fnu
        return (w, s) if ok else None

    def write(ws: tuple[torch.Tensor, torch.Tensor], tmp: Path) -> None:
        _save({names["wkv_weight"]: ws[0], names["wkv_scale"]: ws[1]}, tmp, {"engram_viz_synthetic": "true"})

    return cached(path, read, lambda: _synthetic_wkv(cfg, seed, layer_id), write, suffix=".partial")
