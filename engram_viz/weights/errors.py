"""The errors of the weights layer: a bad checkpoint file and a row id outside a table."""

from __future__ import annotations

from engram_viz.errors import EngramVizError


class CheckpointError(EngramVizError, ValueError):
    """A checkpoint or safetensors file is missing, corrupt, truncated or does not match the config."""


class RowIdError(CheckpointError):
    """A row id (table row or token id) outside the table."""
