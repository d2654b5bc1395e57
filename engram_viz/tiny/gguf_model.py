"""The tiny Engram LM run whole from a GGUF file that the suite wrote (``weights/gguf_export.py``).

Such a file carries the suite's ``config.json`` (its ``tiny_lm`` section included), the Engram
tensors under the GGUF names (the tables in any GGML type, read lazily as ``GGUFTable``s) and the
LM's own tensors (``tiny.*``). ``load_tiny_gguf(path)`` gives the same model as
``files.load_tiny_model`` on the folder it was written from, with the tables read from the file.
"""

from __future__ import annotations

from pathlib import Path

import torch

from engram_viz.core.devices import resolve_device
from engram_viz.core.engram import Engram
from engram_viz.core.schema import gguf_names
from engram_viz.errors import CheckpointError
from engram_viz.tiny.files import assemble_tiny_model, lm_config
from engram_viz.tiny.model import TinyEngramLM
from engram_viz.weights.gguf_checkpoint import gguf_label, open_gguf_checkpoint
from engram_viz.weights.gguf_file import is_gguf_path, open_gguf, read_small, suite_config
from engram_viz.weights.tiny_folder import LM_PREFIX


def is_tiny_lm_gguf(path: str | Path | None) -> bool:
    """True for a GGUF file whose suite config has a ``tiny_lm`` section."""
    if not is_gguf_path(path):
        return False
    try:
        raw = suite_config(open_gguf(path), gguf_names()["config"])
    except CheckpointError:
        return False
    return isinstance(raw, dict) and isinstance(raw.get("tiny_lm"), dict)


def load_tiny_gguf(path: str | Path, mode: str = "fp8", device: str | torch.device = "cpu") -> TinyEngramLM:
    """The tiny LM of a suite-written GGUF file, in eval mode; tables lazy from the file."""
    device = resolve_device(device)
    path = Path(path)
    ckpt = open_gguf_checkpoint(path)
    file = open_gguf(path)
    raw = suite_config(file, gguf_names()["config"])
    if raw is None or not isinstance(raw.get("tiny_lm"), dict):
        raise CheckpointError(f"{path}: no tiny_lm section in its suite config; not a tiny Engram LM file")
    config, lm = lm_config(path, raw)
    tensors = {n: read_small(t) for n, t in file.tensors.items() if n.startswith(LM_PREFIX)}
    engrams = (
        {n: Engram.from_weights(config, ckpt.layer(n), mode=mode, device=device) for n in config.engram_layer_ids}
        if lm.use_engram
        else {}
    )
    return assemble_tiny_model(config, lm, tensors, engrams, raw, f"GGUF file {path}", device)


def tiny_gguf_label(path: str | Path) -> str:
    """The label every output carries for the tiny LM run from a GGUF file (names its table types)."""
    file = open_gguf(path)
    key = gguf_names()["config"]
    return gguf_label(file, suite_config(file, key), key)
