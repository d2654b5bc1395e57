"""The vision tower, aligner and span delimiters, read lazily from a checkpoint folder (hf layout).

:func:`open_vision` reads the safetensors headers of the shards holding ``vision.*``, ``aligner.*``
and ``image_start`` / ``image_end`` / ``image_newline`` (about 0.97 GB at V4.1-Flash widths; nothing
else is touched), checks every name, dtype and shape against :func:`engram_viz.core.schema.vision_tensors`
and returns a :class:`VisionWeights` (a ``core.vit.VisionSource``). A tensor is read on first use and
kept, in the dtype the reference holds it in (linear weights, biases and delimiters bf16, RMSNorm
weights float32; F32 or BF16 on disk are both taken, as the reference's loader casts them).
:func:`has_vision` says whether a folder holds a vision tower at all.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engram_viz.core.schema import is_vision_name, vision_tensors
from engram_viz.core.vision_config import VisionConfig
from engram_viz.errors import CheckpointError
from engram_viz.weights.index import INDEX_FILE, read_json, read_weight_map
from engram_viz.weights.safetensors import TensorInfo, read_safetensors_header, read_tensor
from engram_viz.weights.scan import MARKER_FILE, SINGLE_FILE

WIDE = ("F32", "BF16")  # the dtypes a vision tensor may be stored in


def _locate(folder: Path) -> dict[str, TensorInfo]:
    """Headers of the shards holding vision tensors: name -> TensorInfo (empty when there are none)."""
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_weight_map(folder, index)
        shards = sorted({s for n, s in weight_map.items() if is_vision_name(n)})
    elif (folder / SINGLE_FILE).is_file():
        shards = [folder / SINGLE_FILE]
    else:
        return {}
    found: dict[str, TensorInfo] = {}
    for shard in shards:
        header = read_safetensors_header(Path(shard) if Path(shard).is_absolute() else folder / shard)
        found.update({n: t for n, t in header.tensors.items() if is_vision_name(n)})
    return found


def reference_dtype(schema_dtype: str) -> torch.dtype:
    """The dtype the reference holds a vision tensor in: float32 for RMSNorm weights, else bf16."""
    return torch.float32 if schema_dtype == "F32" else torch.bfloat16


class VisionWeights:
    """The vision path of a checkpoint, read lazily (see the module docstring)."""

    def __init__(self, config: VisionConfig, infos: dict[str, TensorInfo], label: str, synthetic: bool):
        self.config, self.label, self.synthetic = config, label, synthetic
        self._infos = infos
        self._dtypes = {n: reference_dtype(dt) for n, (dt, _) in vision_tensors(config).items()}
        self._kept: dict[str, torch.Tensor] = {}

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._kept:
            self._kept[name] = read_tensor(self._infos[name]).to(self._dtypes[name])
        return self._kept[name]

    def __repr__(self) -> str:
        return f"VisionWeights({self.label})"


def open_vision(path: str | Path, config: VisionConfig | None = None, label: str | None = None) -> VisionWeights:
    """The vision path of the checkpoint at ``path`` (its ``config.json`` gives the vision fields unless
    ``config`` is given); every name, dtype and shape is checked now, no data read."""
    folder = Path(path)
    folder = folder.parent if folder.is_file() else folder
    if config is None:
        config = VisionConfig.from_dict(read_json(folder / "config.json", "config file"), str(folder / "config.json"))
    if not config.enabled:
        raise CheckpointError(f"checkpoint {folder}: its config has no vision tower (vision_n_layers is 0)")
    infos = _locate(folder)
    want = vision_tensors(config)
    missing = [f"{n!r} ({dt} {list(shape)})" for n, (dt, shape) in want.items() if n not in infos]
    if missing:
        more = f", and {len(missing) - 3} more" if len(missing) > 3 else ""
        raise CheckpointError(
            f"checkpoint {folder}: {len(missing)} of {len(want)} vision tensors are missing: "
            f"{', '.join(missing[:3])}{more}; real pictures need the vision tower, aligner and span delimiters"
        )
    for name, (_, shape) in want.items():
        info = infos[name]
        if info.dtype not in WIDE or tuple(info.shape) != shape:
            raise CheckpointError(
                f"{info.path}: tensor {name!r} is {info.dtype} {list(info.shape)}; expected F32 or BF16 {list(shape)}"
            )
    synthetic = (folder / MARKER_FILE).is_file()
    label = label or f"{'SYNTHETIC ' if synthetic else ''}vision tower + aligner of {folder}"
    return VisionWeights(config, {n: infos[n] for n in want}, label, synthetic)


def has_vision(path: str | Path) -> bool:
    """True when the folder lists vision tensors (the vision path can be opened or says what is missing)."""
    try:
        return bool(_locate(Path(path)))
    except CheckpointError:
        return False


__all__ = ["VisionWeights", "has_vision", "open_vision"]
