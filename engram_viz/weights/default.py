"""The checkpoint used when none is given."""

from __future__ import annotations

from engram_viz.weights.checkpoint import Checkpoint, open_checkpoint
from engram_viz.weights.synthetic import synthetic_checkpoint
from engram_viz.weights.tiny_folder import DEFAULT_DIR, is_tiny_lm_folder


def default_checkpoint() -> Checkpoint:
    """The checkpoint used when none is given: the trained tiny Engram LM committed in
    ``data/tiny-engram`` (see its MODEL_CARD.md); the synthetic ``tiny`` checkpoint (seed 0,
    labelled SYNTHETIC) only when that folder is missing."""
    if is_tiny_lm_folder(DEFAULT_DIR):
        return open_checkpoint(DEFAULT_DIR)
    return synthetic_checkpoint("tiny", 0)
