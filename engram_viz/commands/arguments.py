"""What several sub-commands read alike from their arguments: the config."""

from __future__ import annotations

import argparse

from engram_viz.config import EngramConfig, load_config
from engram_viz.weights.weights_rule import weights_config


def config_of(args: argparse.Namespace) -> EngramConfig:
    """``--config`` loaded, or the config of the weights the one rule picks when it is not given."""
    return load_config(args.config) if args.config is not None else weights_config()
