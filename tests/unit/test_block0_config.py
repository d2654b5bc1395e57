"""core.block0_config: the V4.1-Flash defaults are the model's own config.json, not a second copy."""

from __future__ import annotations

import json

import pytest

from engram_viz.config import CONFIG_DIR, ConfigError
from engram_viz.core.block0_config import V41_FLASH_BLOCK0, Block0Config


def test_v41_flash_defaults_equal_the_shipped_config_json():
    raw = json.loads((CONFIG_DIR / "v41-flash.json").read_text(encoding="utf-8"))
    assert Block0Config.from_dict(raw, "v41-flash.json") == V41_FLASH_BLOCK0


def test_a_compressed_block_0_is_refused():
    with pytest.raises(ConfigError, match="compress_ratios"):
        Block0Config.from_dict({"compress_ratios": [2]})
