"""The tiny Engram LM's files: export to, and load from, a checkpoint folder.

``save_tiny_model(model, out)`` writes ``config.json`` (the Engram config plus a ``tiny_lm``
section and any extra keys such as ``training``), the HF-style index ``INDEX_FILE`` and two
shards: ``ENGRAM_SHARD`` (the Engram tensors under the real checkpoint's names and dtypes: fp8
e4m3 tables and wkv with e8m0 scales, bf16 ``q_weight``/``k_weight``) and ``LM_SHARD`` (the LM's
own bf16 tensors under ``tiny.``, plus ``tiny.embed.raw_ids`` int64 ``[V]``). Every file is
written atomically (``engram_viz._files``). ``load_tiny_model(path)`` gives the model back in eval
mode, the Engram layers built by ``Engram.from_weights`` from the fp8 tensors.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engram_viz._files import atomic_path, atomic_write_text
from engram_viz.config import EngramConfig, match_preset
from engram_viz.core import fp8
from engram_viz.core.engram import Engram
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig, TrainableTable
from engram_viz.weights.checkpoint import EngramWeights
from engram_viz.weights.scan import INDEX_FILE
from engram_viz.weights.tables import InMemoryTable
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD


def write_json(path: Path, obj: dict) -> None:
    """``obj`` as indented JSON (two spaces, trailing newline), written atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2) + "\n")


def export_tensors(model: TinyEngramLM) -> dict[str, dict[str, torch.Tensor]]:
    """Shard file name -> {tensor name: tensor}. Engram tensors use the real checkpoint's names and
    dtypes (``layers.N.engram.embed.weight`` e4m3 + ``.scale`` e8m0, ``wkv`` e4m3 + 32 x 32 e8m0
    block scales, bf16 ``q_weight``/``k_weight``); the LM's own tensors are bf16 under ``tiny.``."""
    lm = {"tiny.embed.weight": model.embed.weight, "tiny.norm.weight": model.norm.weight}
    lm.update({f"tiny.layers.{name}": p for name, p in model.layers.named_parameters()})
    lm = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in lm.items()}
    lm["tiny.embed.raw_ids"] = model.raw_ids.to(torch.int64).contiguous()
    eng: dict[str, torch.Tensor] = {}
    for key, e in model.engrams.items():
        p = f"layers.{key}.engram."
        table = e.table.weight if isinstance(e.table, TrainableTable) else None
        if table is None:
            raise TypeError(f"Engram layer {key} has no trainable float table to export")
        eng[p + "embed.weight"], eng[p + "embed.scale"] = fp8.quantize_rows(table.detach().float())
        eng[p + "wkv.weight"], eng[p + "wkv.scale"] = fp8.quantize_matrix(e.wkv.weight.detach().float())
        eng[p + "q_weight"] = e.q_weight.detach().to(torch.bfloat16)
        eng[p + "k_weight"] = e.k_weight.detach().to(torch.bfloat16)
    shards = {LM_SHARD: lm}
    if eng:
        shards[ENGRAM_SHARD] = {k: v.contiguous() for k, v in eng.items()}
    return shards


def save_tiny_model(model: TinyEngramLM, out: str | Path, extra_config: dict | None = None) -> list[Path]:
    """Write ``config.json`` (the Engram config + ``tiny_lm``), the index and the shards into ``out``
    (atomically, file by file). Returns the written paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shards = export_tensors(model)
    cfg = {k: v for k, v in model.config.to_dict().items() if k != "name"}
    cfg["tiny_lm"] = model.lm.to_dict()
    cfg.update(extra_config or {})
    written = []
    weight_map, total = {}, 0
    for fname, tensors in shards.items():
        with atomic_path(out / fname) as tmp:
            save_file(tensors, str(tmp), metadata={"format": "pt"})
        written.append(out / fname)
        for name, t in tensors.items():
            weight_map[name] = fname
            total += t.numel() * t.element_size()
    write_json(out / INDEX_FILE, {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    write_json(out / "config.json", cfg)
    return [*written, out / INDEX_FILE, out / "config.json"]


def _read_folder(path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    cfg_file, index_file = path / "config.json", path / INDEX_FILE
    for f in (cfg_file, index_file):
        if not f.is_file():
            raise FileNotFoundError(f"tiny model folder {path} lacks {f.name}")
    raw = json.loads(cfg_file.read_text())
    if "tiny_lm" not in raw:
        raise ValueError(f"{cfg_file} has no 'tiny_lm' section; it is not a tiny Engram LM folder")
    index = json.loads(index_file.read_text())
    tensors: dict[str, torch.Tensor] = {}
    for fname in sorted(set(index["weight_map"].values())):
        tensors.update(load_file(str(path / fname)))
    missing = sorted(set(index["weight_map"]) - set(tensors))
    if missing:
        raise ValueError(f"tiny model folder {path}: tensors {missing[:5]} listed in the index are missing")
    return raw, tensors


def load_tiny_model(
    path: str | Path | None = None, mode: str = "fp8", device: str | torch.device = "cpu"
) -> TinyEngramLM:
    """The exported tiny model (default: the committed ``data/tiny-engram``), in eval mode.

    The Engram layers are built with ``Engram.from_weights`` from the fp8 tensors (``mode`` is the
    wkv mode, ``fp8`` as the reference); the LM's bf16 tensors compute in float32."""
    path = Path(path) if path is not None else DEFAULT_DIR
    raw, tensors = _read_folder(path)
    config = match_preset(EngramConfig.from_dict(raw, name=path.name))
    lm = TinyLMConfig(**raw["tiny_lm"])
    engrams = {}
    if lm.use_engram:
        for layer_id in config.engram_layer_ids:
            p = f"layers.{layer_id}.engram."
            w = EngramWeights(
                layer_id=layer_id,
                table=InMemoryTable(
                    tensors[p + "embed.weight"], tensors[p + "embed.scale"], label=f"table {p}embed of {path}"
                ),
                wkv_weight=tensors[p + "wkv.weight"],
                wkv_scale=tensors[p + "wkv.scale"],
                q_weight=tensors[p + "q_weight"],
                k_weight=tensors[p + "k_weight"],
            )
            engrams[layer_id] = Engram.from_weights(config, w, mode=mode, device=device)
    tok = get_tokenizer(config)
    model = TinyEngramLM(config, tok.token_map, tensors["tiny.embed.raw_ids"], lm, engrams=engrams)
    state = {"embed.weight": tensors["tiny.embed.weight"], "norm.weight": tensors["tiny.norm.weight"]}
    state.update({k[len("tiny.") :]: v for k, v in tensors.items() if k.startswith("tiny.layers.")})
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("engrams.")}
    if set(own) != set(state):
        raise ValueError(
            f"tiny model folder {path}: LM tensors differ from the architecture: {sorted(set(own) ^ set(state))[:5]}"
        )
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return model.to(device).eval()
