"""What several sub-commands read alike from their arguments: the config."""

from __future__ import annotations

import argparse

from engram_viz.config import EngramConfig, load_config
from engram_viz.weights.weights_rule import weights_config


def config_of(args: argparse.Namespace) -> EngramConfig:
    """``--config`` loaded, else the config of ``--checkpoint`` (of a Hub repository its
    ``config.json`` alone), else of the weights the one rule picks."""
    if args.config is not None:
        return load_config(args.config)
    return weights_config(getattr(args, "checkpoint", None))
