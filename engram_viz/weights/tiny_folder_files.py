"""A tiny Engram LM folder's files and label, without torch: what ``scan`` and ``weights_config``
need to recognise the folder (``tiny_folder`` reads its tensors). The folder's layout is in
``tiny_folder``'s docstring."""

from __future__ import annotations

import json
from pathlib import Path

from engram_viz.config import DATA_DIR
from engram_viz.errors import CheckpointError
from engram_viz.weights.index import read_json

DEFAULT_DIR = DATA_DIR / "tiny-engram"
LM_SHARD = "model-00001-of-00002.safetensors"  # tiny LM: small embedding, blocks, final norm (bf16)
ENGRAM_SHARD = "model-00002-of-00002.safetensors"  # Engram tensors, real checkpoint names and dtypes
TRAINED_ON = "the King James Bible, WordNet glosses, the Debian Reference (zh-CN) and fortunes-zh"
LM_PREFIX = "tiny."  # the LM's own tensors; the rest are Engram tensors under the checkpoint's names


def is_tiny_lm_folder(path: str | Path | None) -> bool:
    """True when ``path`` is a folder whose ``config.json`` has a ``tiny_lm`` section."""
    if path is None:
        return False
    cfg = Path(path) / "config.json"
    try:
        return cfg.is_file() and "tiny_lm" in json.loads(cfg.read_text())
    except (OSError, ValueError):
        return False


def checkpoint_label(path: str | Path) -> str:
    """The label a tiny-LM folder carries into every output: ``label`` in its ``config.json`` if set,
    else e.g. ``tiny Engram LM trained on ... (engram-viz, data/tiny-engram)``."""
    path = Path(path).resolve()
    raw = json.loads((path / "config.json").read_text())
    if raw.get("label"):
        return str(raw["label"])
    try:
        where = str(path.relative_to(DEFAULT_DIR.parent.parent))
    except ValueError:
        where = str(path)
    seed = raw.get("training", {}).get("seed")
    extra = "" if seed in (None, 0) else f", seed {seed}"
    return f"tiny Engram LM trained on {TRAINED_ON} (engram-viz, {where}{extra})"


def read_tiny_config(path: str | Path) -> dict:
    """The folder's ``config.json`` as a dict, checked to hold a ``tiny_lm`` object."""
    cfg_file = Path(path) / "config.json"
    raw = read_json(cfg_file, "config file")
    if not isinstance(raw.get("tiny_lm"), dict):
        raise CheckpointError(f"{cfg_file} has no 'tiny_lm' object; it is not a tiny Engram LM folder")
    return raw
