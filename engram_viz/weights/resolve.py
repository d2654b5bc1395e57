"""Which weights run when none are given, decided once for every entry point.

The rule: an explicit checkpoint wins; else the folder ``$ENGRAM_VIZ_CHECKPOINT`` names; else the
embedded default, the trained tiny Engram LM in ``data/tiny-engram`` (the synthetic ``tiny``
checkpoint, seed 0, only when that folder is missing). Either may name a Hub repository
(``hf://owner/repo[@revision]``, ``hub.py``): it resolves to its local snapshot folder holding the
shards the run reads. ``resolve_weights`` gives what a ``Pipeline`` opens; ``weights_config`` the
config of the same weights, read without opening them.
"""

from __future__ import annotations

from pathlib import Path

from engram_viz import settings
from engram_viz.config import EngramConfig, load_config, match_preset
from engram_viz.core.schema import gguf_names
from engram_viz.weights.checkpoint import Checkpoint, open_checkpoint
from engram_viz.weights.gguf_checkpoint import gguf_config, open_gguf_checkpoint
from engram_viz.weights.gguf_file import is_gguf_path, open_gguf
from engram_viz.weights.hub import hub_config_file, hub_folder, is_hub_ref
from engram_viz.weights.scan import scan_checkpoint
from engram_viz.weights.schema_check import resolve_config
from engram_viz.weights.synthetic import synthetic_checkpoint
from engram_viz.weights.tiny_folder import DEFAULT_DIR, is_tiny_lm_folder

SYNTHETIC_DEFAULT = ("tiny", 0)  # (config, seed) of the default when data/tiny-engram is missing

Weights = str | Path | Checkpoint


def _chosen(checkpoint: Weights | None) -> Weights | None:
    """The rule's answer as a folder or an opened checkpoint; None: the synthetic default."""
    if checkpoint is not None:
        return checkpoint
    from_env = settings.checkpoint()
    if from_env is not None:
        return from_env if is_hub_ref(from_env) else Path(from_env)
    return DEFAULT_DIR if is_tiny_lm_folder(DEFAULT_DIR) else None


def resolve_weights(checkpoint: Weights | None = None, *, streams: object = None) -> Weights:
    """The weights to run: ``checkpoint`` when given, else ``$ENGRAM_VIZ_CHECKPOINT``, else the
    embedded default (a folder path, or the synthetic checkpoint opened). A Hub repository gives its
    local folder with the shards the run's ``streams`` need (:func:`hub_blocks`); its Engram tables
    stay on the Hub, read by rows."""
    chosen = _chosen(checkpoint)
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


def weights_config(checkpoint: Weights | None = None) -> EngramConfig:
    """The config of ``resolve_weights(checkpoint)``, from its ``config.json`` and tensor headers
    (no weights read): what ``hash``, ``layout``, ``params`` and ``corpus`` use without ``--config``,
    so their row ids are the ones a run on the same weights shows."""
    chosen = _chosen(checkpoint)
    if chosen is None:
        return load_config(SYNTHETIC_DEFAULT[0])
    if isinstance(chosen, Checkpoint):
        return chosen.config
    if is_gguf_path(chosen):
        return gguf_config(open_gguf(chosen), None, gguf_names()["config"])
    if is_hub_ref(chosen):  # its config.json alone, not the tables' shards
        return match_preset(load_config(hub_config_file(str(chosen))))
    return resolve_config(scan_checkpoint(chosen), None)


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
