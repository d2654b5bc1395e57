"""Shared fixtures for the whole suite. Keep them small and generic; add yours below."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.tokenizer import EngramTokenizer, get_tokenizer
from engram_viz.weights.synthetic import write_synthetic_checkpoint

# Property tests stay fast and reproducible: bounded examples, no deadline on a shared machine.
settings.register_profile(
    "engram-viz",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "engram-viz"))


@pytest.fixture(scope="session")
def v41_config() -> EngramConfig:
    """The DeepSeek-V4.1-Flash config (preset ``v41-flash``)."""
    return load_config("v41-flash")


@pytest.fixture(scope="session")
def tiny_config() -> EngramConfig:
    """The small preset (same layout rules, a few thousand buckets per head)."""
    return load_config("tiny")


@pytest.fixture(scope="session")
def tokenizer(v41_config: EngramConfig) -> EngramTokenizer:
    """The bundled V4 tokenizer with its compressed map, shared by the whole session."""
    return get_tokenizer(v41_config)


@pytest.fixture(scope="session")
def synthetic_hf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic ``tiny`` checkpoint (hf layout, seed 0, no tokenizer.json), written once: read it,
    never write to it (``damaged_hf`` is the copy to damage)."""
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("synthetic") / "tiny-hf", "tiny", seed=0, tokenizer=False)


@pytest.fixture(autouse=True)
def _default_weights_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test starts on the embedded default weights, whatever ``$ENGRAM_VIZ_CHECKPOINT`` the
    shell holds (a test that wants other weights sets it)."""
    monkeypatch.delenv("ENGRAM_VIZ_CHECKPOINT", raising=False)


@pytest.fixture()
def damaged_hf(tmp_path: Path, synthetic_hf: Path) -> Path:
    """A private copy of ``synthetic_hf`` for a test to damage."""
    return Path(shutil.copytree(synthetic_hf, tmp_path / "ckpt"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its tier, the folder it lives in: ``pytest -m unit`` runs the fast tier."""
    for item in items:
        tier = item.path.parent.name
        if tier in ("unit", "integration", "acceptance"):
            item.add_marker(getattr(pytest.mark, tier))
