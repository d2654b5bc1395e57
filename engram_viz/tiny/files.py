"""The tiny Engram LM's files: export to, and load from, a checkpoint folder.

``save_tiny_model(model, out)`` writes ``config.json`` (the Engram config plus a ``tiny_lm``
section and any extra keys such as ``training``), the HF-style index ``INDEX_FILE`` and two
shards: ``ENGRAM_SHARD`` (the Engram tensors under the real checkpoint's names and dtypes: fp8
e4m3 tables and wkv with e8m0 scales, bf16 ``q_weight``/``k_weight``) and ``LM_SHARD`` (the LM's
own bf16 tensors under ``tiny.``, plus ``tiny.embed.raw_ids`` int64 ``[V]``). Every file is
written atomically (``engram_viz._files``). ``load_tiny_model(path)`` gives the model back in eval
mode, the Engram layers built by ``Engram.from_weights`` from the fp8 tensors; it reads through the
weights layer's validated reader, as every checkpoint kind does.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram_viz._files import atomic_path, atomic_write_text
from engram_viz.config import ConfigError, EngramConfig, match_preset
from engram_viz.core import fp8
from engram_viz.core.devices import resolve_device
from engram_viz.core.engram import Engram
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError, InputTypeError
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig, TrainableTable
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.tables import InMemoryTable
from engram_viz.weights.tiny_folder import (
    DEFAULT_DIR,
    ENGRAM_SHARD,
    LM_PREFIX,
    LM_SHARD,
    check_raw_ids,
    read_lm_tensors,
    read_tiny_config,
)


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
            raise InputTypeError(f"Engram layer {key} has no trainable float table to export")
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


def lm_config(path: Path, raw: dict) -> tuple[EngramConfig, TinyLMConfig]:
    """The Engram config and the ``tiny_lm`` section of the folder's ``config.json``, checked."""
    try:
        config = match_preset(EngramConfig.from_dict(raw, name=path.name))
        return config, TinyLMConfig(**raw["tiny_lm"])
    except (ConfigError, TypeError) as err:  # TypeError: unknown or missing tiny_lm keys
        raise CheckpointError(f"{path / 'config.json'}: not a valid tiny Engram LM config: {err}") from None


def _engram_layers(path: Path, config: EngramConfig, mode: str, device) -> dict[int, Engram]:
    """The Engram layers from the folder's fp8 tensors, opened by the weights layer like any
    checkpoint (every file validated, small tensors checked finite) and the tables read whole (a
    few MB; every row checked finite as it is read)."""
    ckpt = open_checkpoint(path, config=config)
    engrams = {}
    for layer_id in config.engram_layer_ids:
        w = ckpt.layer(layer_id)
        whole = w.table.materialize()
        w.table = InMemoryTable(whole.weight, whole.scale, label=f"table layers.{layer_id}.engram.embed of {path}")
        engrams[layer_id] = Engram.from_weights(config, w, mode=mode, device=device)
    return engrams


def load_tiny_model(
    path: str | Path | None = None, mode: str = "fp8", device: str | torch.device = "cpu"
) -> TinyEngramLM:
    """The exported tiny model (default: the committed ``data/tiny-engram``), in eval mode.

    Every file goes through the weights layer's validated reader (``weights/index.py``,
    ``safetensors.py``, ``finite.py``), so a damaged folder raises a ``CheckpointError`` naming the
    file. The Engram layers are built with ``Engram.from_weights`` from the fp8 tensors (``mode`` is
    the wkv mode, ``fp8`` as the reference); the LM's bf16 tensors compute in float32."""
    device = resolve_device(device)
    path = Path(path) if path is not None else DEFAULT_DIR
    if not path.is_dir():
        raise CheckpointError(f"tiny model folder {path} does not exist or is not a folder")
    raw = read_tiny_config(path)
    config, lm = lm_config(path, raw)
    tensors = read_lm_tensors(path)
    engrams = _engram_layers(path, config, mode, device) if lm.use_engram else {}
    return assemble_tiny_model(config, lm, tensors, engrams, raw, str(path), device)


def assemble_tiny_model(
    config: EngramConfig,
    lm: TinyLMConfig,
    tensors: dict[str, torch.Tensor],
    engrams: dict[int, Engram],
    raw: dict,
    where: str,
    device: torch.device,
) -> TinyEngramLM:
    """The tiny LM from its configs, its own tensors (``tiny.*``), its Engram layers and the raw
    ``config.json`` (for the training provenance), checked against the architecture, in eval mode."""
    tok = get_tokenizer(config)
    raw_ids = tensors.get("tiny.embed.raw_ids", torch.empty(0, dtype=torch.int64))
    check_raw_ids(raw_ids, lm.vocab_rows, config.vocab_size, where)
    model = TinyEngramLM(config, tok.token_map, raw_ids, lm, engrams=engrams, provenance=raw.get("training"))
    state = {k[len(LM_PREFIX) :]: v for k, v in tensors.items() if k != "tiny.embed.raw_ids"}
    own = {k: v for k, v in model.state_dict().items() if not k.startswith("engrams.")}
    if set(own) != set(state):
        raise CheckpointError(
            f"tiny model {where}: LM tensors differ from the architecture: {sorted(set(own) ^ set(state))[:5]}"
        )
    bad = [k for k, v in state.items() if v.shape != own[k].shape]
    if bad:
        raise CheckpointError(
            f"tiny model {where}: tensor 'tiny.{bad[0]}' has shape {list(state[bad[0]].shape)}, "
            f"expected {list(own[bad[0]].shape)} (config.json's tiny_lm section)"
        )
    model.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    return model.to(device).eval()
