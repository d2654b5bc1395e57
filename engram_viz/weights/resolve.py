"""The checkpoint used when none is given, and its config."""

from __future__ import annotations

from engram_viz.config import EngramConfig, load_config
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


def default_config() -> EngramConfig:
    """The config of ``default_checkpoint()``, read without opening its weights: what the commands
    that take ``--config`` (``hash``, ``layout``, ``params``, ``corpus``) use when it is not given, so
    their row ids are the ones a default report shows."""
    if is_tiny_lm_folder(DEFAULT_DIR):
        return load_config(DEFAULT_DIR / "config.json")
    return load_config("tiny")
