"""Which weights run when none are given, and their config, read without torch.

The rule: an explicit checkpoint wins; else the folder ``$ENGRAM_VIZ_CHECKPOINT`` names; else the
embedded default, the trained tiny Engram LM in ``data/tiny-engram`` (the synthetic ``tiny``
checkpoint, seed 0, only when that folder is missing). Either may name a Hub repository
(``hf://owner/repo[@revision]``, ``hub.py``). :func:`weights_config` is the config of the chosen
weights from headers alone (``config.json``, safetensors and GGUF headers), so the commands that
need only a config (``corpus``, ``hash``, ``layout``, ``params``) import no torch;
``resolve.resolve_weights`` opens what the rule chose.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from engram_viz import settings
from engram_viz.config import EngramConfig, load_config, match_preset
from engram_viz.core.schema import gguf_names
from engram_viz.weights.gguf_file import gguf_config, is_gguf_path, open_gguf
from engram_viz.weights.hub import hub_config_file, is_hub_ref
from engram_viz.weights.scan import scan_checkpoint
from engram_viz.weights.schema_check import resolve_config
from engram_viz.weights.tiny_folder_files import DEFAULT_DIR, is_tiny_lm_folder

if TYPE_CHECKING:  # an opened checkpoint may be passed; its module (torch) is not imported here
    import engram_viz.weights.checkpoint

SYNTHETIC_DEFAULT = ("tiny", 0)  # (config, seed) of the default when data/tiny-engram is missing


def chosen_weights(
    checkpoint: str | Path | engram_viz.weights.checkpoint.Checkpoint | None,
) -> str | Path | engram_viz.weights.checkpoint.Checkpoint | None:
    """The rule's answer as a folder or an opened checkpoint; None: the synthetic default."""
    if checkpoint is not None:
        return checkpoint
    from_env = settings.checkpoint()
    if from_env is not None:
        return from_env if is_hub_ref(from_env) else Path(from_env)
    return DEFAULT_DIR if is_tiny_lm_folder(DEFAULT_DIR) else None


def weights_config(checkpoint: str | Path | engram_viz.weights.checkpoint.Checkpoint | None = None) -> EngramConfig:
    """The config of ``resolve.resolve_weights(checkpoint)``, from its ``config.json`` and tensor
    headers (no weights read): what ``hash``, ``layout``, ``params`` and ``corpus`` use without
    ``--config``, so their row ids are the ones a run on the same weights shows."""
    chosen = chosen_weights(checkpoint)
    if chosen is None:
        return load_config(SYNTHETIC_DEFAULT[0])
    if not isinstance(chosen, (str, Path)):  # an opened Checkpoint
        return chosen.config
    if is_gguf_path(chosen):
        return gguf_config(open_gguf(chosen), None, gguf_names()["config"])
    if is_hub_ref(chosen):  # its config.json alone, not the tables' shards
        return match_preset(load_config(hub_config_file(str(chosen))))
    return resolve_config(scan_checkpoint(chosen), None)
