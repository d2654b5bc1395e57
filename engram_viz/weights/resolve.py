"""The weights the rule of ``weights_rule`` chooses, opened.

``resolve_weights`` gives what a ``Pipeline`` opens (a Hub repository resolves to its local snapshot
folder holding the shards the run reads); ``weights_rule.weights_config`` the config of the same
weights, read without opening them (imported here too, where callers have long found it).
"""

from __future__ import annotations

from pathlib import Path

from engram_viz import settings
from engram_viz.config import EngramConfig
from engram_viz.weights.checkpoint import Checkpoint, open_checkpoint
from engram_viz.weights.gguf_checkpoint import open_gguf_checkpoint
from engram_viz.weights.gguf_file import is_gguf_path
from engram_viz.weights.hub import hub_folder, is_hub_ref
from engram_viz.weights.synthetic import synthetic_checkpoint
from engram_viz.weights.tiny_folder_files import DEFAULT_DIR, is_tiny_lm_folder
from engram_viz.weights.weights_rule import SYNTHETIC_DEFAULT, chosen_weights, weights_config

__all__ = ["default_checkpoint", "open_weights", "resolve_weights", "weights_config", "weights_source"]

Weights = str | Path | Checkpoint


def resolve_weights(checkpoint: Weights | None = None, *, streams: object = None) -> Weights:
    """The weights to run: ``checkpoint`` when given, else ``$ENGRAM_VIZ_CHECKPOINT``, else the
    embedded default (a folder path, or the synthetic checkpoint opened). A Hub repository gives its
    local folder with the shards the run's ``streams`` need (:func:`hub_blocks`); its Engram tables
    stay on the Hub, read by rows."""
    chosen = chosen_weights(checkpoint)
    if chosen is None:
        return synthetic_checkpoint(*SYNTHETIC_DEFAULT)
    return hub_folder(chosen, blocks=hub_blocks(chosen, streams)) if is_hub_ref(chosen) else chosen


def hub_blocks(checkpoint: str | Path, streams: object) -> tuple[int, ...]:
    """The blocks whose shards a Hub checkpoint downloads for ``streams``: block 0 for ``"block0"``,
    every block before the last Engram layer for ``"model"`` (its config.json read first), none
    for streams of their own (embedding, a captured file, a callable)."""
    if streams == "block0":
        return (0,)
    if streams == "model":
        return tuple(range(max(weights_config(checkpoint).engram_layer_ids)))
    return ()


def open_weights(path: str | Path, config: EngramConfig | str | Path | None = None) -> Checkpoint:
    """A checkpoint folder (``open_checkpoint``) or a GGUF file (``open_gguf_checkpoint``) opened."""
    if is_gguf_path(path):
        return open_gguf_checkpoint(path, config)
    return open_checkpoint(path, config)


def weights_source(checkpoint: Weights | None = None) -> str:
    """Where the rule takes the weights from, in words (for messages)."""
    if checkpoint is not None:
        return str(getattr(checkpoint, "label", checkpoint))
    from_env = settings.checkpoint()
    return f"${settings.CHECKPOINT}={from_env}" if from_env is not None else "the embedded default weights"


def default_checkpoint() -> Checkpoint:
    """The embedded default opened, whatever the environment says: the trained tiny Engram LM
    committed in ``data/tiny-engram`` (see its MODEL_CARD.md); the synthetic ``tiny`` checkpoint
    (seed 0, labelled SYNTHETIC) only when that folder is missing."""
    if is_tiny_lm_folder(DEFAULT_DIR):
        return open_checkpoint(DEFAULT_DIR)
    return synthetic_checkpoint(*SYNTHETIC_DEFAULT)
