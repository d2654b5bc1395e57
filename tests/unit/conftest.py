"""Fixtures the weights tests share (one instance per test module, as before)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_viz.weights.synthetic import synthetic_tensors, write_synthetic_checkpoint


@pytest.fixture(scope="module")
def tiny_tensors(tiny_config):
    return synthetic_tensors(tiny_config, seed=0)


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("hf") / "tiny-hf", "tiny", seed=0)
