"""Synthetic vision weights: the reference's names, dtypes and shapes, random values, labelled SYNTHETIC.

- :func:`vision_tensor` draws one tensor by name (its own generator, so values do not depend on which
  others are drawn): linear weights ~ N(0, 1 / in) and biases ~ 0.02 N(0, 1) in bf16, RMSNorm
  weights ~ 1 + 0.1 N(0, 1) in float32, span delimiters ~ N(0, 1) in bf16 (the synthetic token
  embedding's scale).
- :func:`add_vision` writes every vision tensor into one more shard of an hf-layout folder and adds the
  vision fields to its ``config.json``; ``write_synthetic_checkpoint(..., vision=cfg)`` calls it.
- :class:`ProceduralVision` serves the same tensors without writing any, each drawn on first use
  (V4.1-Flash widths for benchmarks: about 0.97 GB once drawn).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram_viz.core.schema import vision_tensors
from engram_viz.core.vision_config import VisionConfig
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.vision_reader import reference_dtype

GeneratorFn = Callable[[str], torch.Generator]  # tensor name -> its own generator
VISION_SHARD = "model-vision.safetensors"


def vision_tensor(name: str, dtype: str, shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """One synthetic vision tensor (rules in the module docstring), in the reference's dtype."""
    if dtype == "F32":  # the RMSNorm weights
        values = 1 + 0.1 * torch.randn(shape, generator=g)
    elif name.endswith(".bias"):
        values = 0.02 * torch.randn(shape, generator=g)
    elif len(shape) == 2:
        values = torch.randn(shape, generator=g) / math.sqrt(shape[1])
    else:  # image_start / image_end / image_newline
        values = torch.randn(shape, generator=g)
    return values.to(reference_dtype(dtype))


def vision_weights(cfg: VisionConfig, gen: GeneratorFn) -> dict[str, torch.Tensor]:
    """Every vision tensor by checkpoint name."""
    return {n: vision_tensor(n, dt, shape, gen(n)) for n, (dt, shape) in vision_tensors(cfg).items()}


def add_vision(folder: str | Path, cfg: VisionConfig, gen: GeneratorFn, metadata: dict[str, str] | None = None) -> Path:
    """Write the vision path into ``folder/model-vision.safetensors`` of an hf-layout checkpoint folder,
    list it in the index and put the vision fields into ``config.json`` (for folders being built; not atomic)."""
    folder = Path(folder)
    tensors = vision_weights(cfg, gen)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / VISION_SHARD), metadata=metadata or {})
    index = json.loads((folder / INDEX_FILE).read_text())
    index["weight_map"].update(dict.fromkeys(tensors, VISION_SHARD))
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    config = json.loads((folder / "config.json").read_text())
    config.update({k: v for k, v in cfg.to_dict().items() if k != "dim"})
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder / VISION_SHARD


class ProceduralVision:
    """A ``core.vit.VisionSource`` drawing each tensor on first use and keeping it: no disk."""

    def __init__(self, cfg: VisionConfig, gen: GeneratorFn, label: str):
        self.config, self._gen, self.label = cfg, gen, label
        self.synthetic = True
        self._specs = vision_tensors(cfg)
        self._kept: dict[str, torch.Tensor] = {}

    def tensor(self, name: str) -> torch.Tensor:
        if name not in self._kept:
            dtype, shape = self._specs[name]
            self._kept[name] = vision_tensor(name, dtype, shape, self._gen(name))
        return self._kept[name]
