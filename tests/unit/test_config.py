"""EngramConfig: presets, loading by path, and the errors a bad config file raises."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_viz.config import (
    CONFIG_DIR,
    IMAGE,
    IMAGE_END,
    IMAGE_NEWLINE,
    IMAGE_START,
    PRESETS,
    TEXT,
    ConfigError,
    EngramConfig,
    load_config,
)
from engram_viz.core.layout import EngramLayout


def _raw(name: str = "tiny") -> dict:
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def test_v41_flash_preset_holds_the_model_values(v41_config):
    c = v41_config
    assert c.name == "v41-flash"
    assert c.vocab_size == 129280
    assert c.dim == 5120
    assert c.hc_mult == 4
    assert c.norm_eps == 1e-20
    assert c.n_layers == 40
    assert c.engram_layer_ids == (1, 14)
    assert c.engram_vocab_size == 16_000_000
    assert c.engram_num_embeddings == (384_006_168, 384_016_682)
    assert c.engram_max_ngram_size == 4
    assert c.engram_pad_id == 2
    assert c.engram_compressed_vocab_size == 99_092
    assert c.engram_n_heads == 8
    assert c.engram_head_dim == 256
    assert c.image_token_id == 129264
    assert c.n_engram_layers == 2
    assert c.n_hash_cols == 24
    assert c.ngram_orders == (2, 3, 4)


def test_tiny_preset_shares_the_tokenizer_and_hash_shape(tiny_config, v41_config):
    t = tiny_config
    assert t.name == "tiny"
    for field in (
        "vocab_size",
        "engram_compressed_vocab_size",
        "engram_pad_id",
        "engram_max_ngram_size",
        "engram_n_heads",
        "image_token_id",
    ):
        assert getattr(t, field) == getattr(v41_config, field), field
    assert t.n_hash_cols == 24
    assert t.dim < v41_config.dim
    assert all(n < 100_000 for n in t.engram_num_embeddings)  # small table: collisions show


def test_token_type_constants():
    assert (TEXT, IMAGE_START, IMAGE, IMAGE_NEWLINE, IMAGE_END) == (-1, 0, 1, 2, 3)


def test_load_config_by_file_folder_and_instance(tmp_path, tiny_config):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_raw("tiny")))
    by_file = load_config(path)
    by_folder = load_config(tmp_path)
    by_str = load_config(str(path))
    assert by_file.name == str(path) and by_folder.name == str(path)
    # only the name differs from the preset
    assert dataclasses.replace(by_file, name="tiny") == tiny_config
    assert by_folder == by_file == by_str
    assert load_config(tiny_config) is tiny_config


def test_default_preset_is_tiny():
    assert load_config().name == "tiny"
    assert set(PRESETS) == {"v41-flash", "tiny"}


def test_config_is_frozen_and_hashable(tiny_config):
    with pytest.raises(dataclasses.FrozenInstanceError):
        tiny_config.dim = 1  # type: ignore[misc]
    assert hash(tiny_config) == hash(load_config("tiny"))
    assert tiny_config.to_dict()["engram_layer_ids"] == (1, 3)


def test_unrelated_fields_are_ignored_and_optional_ones_default():
    raw = _raw("v41-flash")
    assert "moe_inter_dim" in raw  # the real config.json carries the whole model
    for key in ("vision_patch_size", "vision_downsample_ratio", "vision_max_n_token", "vision_min_pixels"):
        raw.pop(key)
    cfg = EngramConfig.from_dict(raw, name="x")
    assert cfg.vision_patch_size == 14 and cfg.vision_min_pixels == 295936


def test_unknown_preset_or_missing_path_names_the_input():
    with pytest.raises(ConfigError, match=r"unknown config 'v5-huge'.*v41-flash"):
        load_config("v5-huge")


def test_folder_without_config_json(tmp_path):
    with pytest.raises(ConfigError, match=r"config\.json does not exist"):
        load_config(tmp_path)


def test_invalid_json(tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"vocab_size": 129280,')
    with pytest.raises(ConfigError, match=r"not valid JSON"):
        load_config(path)


@pytest.mark.parametrize("payload", ["[1, 2, 3]", "42", '"tiny"', "null"])
def test_json_that_is_not_an_object(tmp_path, payload):
    path = tmp_path / "config.json"
    path.write_text(payload)
    with pytest.raises(ConfigError, match=r"JSON object"):
        load_config(path)


def test_missing_fields_are_named(tmp_path):
    raw = _raw("tiny")
    del raw["engram_pad_id"], raw["dim"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(ConfigError, match=r"lacks the Engram fields \['dim', 'engram_pad_id'\]"):
        load_config(path)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("vocab_size", "129280"),
        ("engram_layer_ids", "1,3"),
        ("engram_num_embeddings", [1.5, 2]),
        ("engram_n_heads", None),
        ("norm_eps", "tiny"),
        ("engram_pad_id", True),
    ],
)
def test_wrong_field_types_are_named(field, value):
    raw = _raw("tiny")
    raw[field] = value
    with pytest.raises(ConfigError, match=field):
        EngramConfig.from_dict(raw, name="bad")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"engram_num_embeddings": [50148]}, r"one per engram layer"),
        ({"engram_head_dim": 48}, r"multiple of the fp8 block size 32"),
        ({"engram_max_ngram_size": 1}, r"engram_max_ngram_size must be >= 2"),
    ],
)
def test_inconsistent_values(changes, message):
    raw = {**_raw("tiny"), **changes}
    with pytest.raises(ConfigError, match=message):
        EngramConfig.from_dict(raw, name="bad")


def test_config_error_is_a_value_error():
    # the CLI reports ValueErrors as clean one-line errors
    assert issubclass(ConfigError, ValueError)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"engram_pad_id": 129_280}, r"engram_pad_id=129280 must be a raw token id in 0\.\.129279"),
        ({"engram_pad_id": -1}, r"engram_pad_id=-1 must be a raw token id"),
        ({"image_token_id": 200_000}, r"image_token_id=200000 must be a raw token id"),
        (
            {"engram_layer_ids": [1, 1], "engram_num_embeddings": [50148, 50148]},
            r"engram_layer_ids=\(1, 1\) must list distinct",
        ),
        ({"engram_layer_ids": [1, 9]}, r"engram_layer_ids=\(1, 9\) must be layer ids in 0\.\.n_layers-1 = 0\.\.3"),
        ({"engram_layer_ids": [], "engram_num_embeddings": []}, r"engram_layer_ids=\(\) must list distinct layers"),
        ({"engram_num_embeddings": [0, 54840]}, r"engram_num_embeddings=\(0, 54840\) must be positive"),
        ({"engram_compressed_vocab_size": 200_000}, r"engram_compressed_vocab_size=200000 must be at most vocab_size"),
        ({"engram_n_heads": 0}, r"engram_n_heads=0 must be at least 1"),
        ({"vision_max_n_token": 3}, r"vision_max_n_token=3 must be at least 4"),
        ({"norm_eps": 0}, r"norm_eps=0.0 must be a positive finite number"),
        ({"vision_max_wh_ratio": -2}, r"vision_max_wh_ratio=-2.0 must be null or a positive number"),
        ({"vision_max_wh_ratio": "wide"}, r"vision_max_wh_ratio='wide' must be a number or null"),
    ],
)
def test_out_of_range_fields_name_the_file_and_field(tmp_path, changes, message):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**_raw("tiny"), **changes}))
    with pytest.raises(ConfigError, match=rf"config '{path}': {message}"):
        load_config(path)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"vocab_size": \xff}', r"is not UTF-8 text"),
        (b'{"vocab_size": ' + b"9" * 5000 + b"}", r"is not valid JSON"),
        (b"[" * 100_000, r"is not valid JSON"),
    ],
    ids=["not-utf8", "5000-digit-int", "deep"],
)
def test_unreadable_config_files_name_the_file(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=rf"config file {path} {message}"):
        load_config(path)


def test_vision_max_wh_ratio_loads_and_stays_out_of_the_dict_when_null(v41_config):
    assert v41_config.vision_max_wh_ratio is None  # null in DeepSeek-V4.1-Flash's config.json
    assert "vision_max_wh_ratio" not in v41_config.to_dict()
    set_ratio = EngramConfig.from_dict({**_raw("tiny"), "vision_max_wh_ratio": 2}, name="x")
    assert set_ratio.vision_max_wh_ratio == 2.0 and set_ratio.to_dict()["vision_max_wh_ratio"] == 2.0


# ---------------------------------------------------------------- bounds (issue 23): never a hang


@pytest.mark.parametrize(
    ("field", "value", "bound"),
    [
        ("engram_vocab_size", 10**15, "1,099,511,627,776"),
        ("engram_n_heads", 100_000, "64"),
        ("engram_max_ngram_size", 10**7, "16"),
        ("engram_head_dim", 2**20, "4,096"),
        ("vocab_size", 2**40, "2,147,483,647"),
    ],
)
def test_absurd_sizes_are_refused_up_front_naming_field_bound_and_value(v41_config, field, value, bound):
    raw = {k: v for k, v in v41_config.to_dict().items() if k != "name"} | {field: value}
    start = time.perf_counter()
    with pytest.raises(ConfigError) as err:
        EngramConfig.from_dict(raw, "big")
    assert time.perf_counter() - start < 0.5
    message = str(err.value)
    assert "\n" not in message and f"{field}={value}" in message and bound in message


def test_too_many_hash_columns_or_layers_are_refused(v41_config):
    raw = {k: v for k, v in v41_config.to_dict().items() if k != "name"}
    with pytest.raises(ConfigError, match="hash columns must be at most 256"):
        EngramConfig.from_dict(raw | {"engram_max_ngram_size": 16, "engram_n_heads": 64}, "x")
    many = raw | {"n_layers": 100, "engram_layer_ids": list(range(65)), "engram_num_embeddings": [1] * 65}
    with pytest.raises(ConfigError, match="at most 64 layers"):
        EngramConfig.from_dict(many, "x")


_SIZES = st.one_of(st.integers(-3, 70), st.integers(0, 2**70), st.sampled_from([2**31, 2**40, 2**40 + 1, 10**15]))


@settings(max_examples=80, deadline=5000, suppress_health_check=[HealthCheck.too_slow])
@given(
    vocab=_SIZES,
    heads=_SIZES,
    max_ngram=_SIZES,
    head_dim=_SIZES,
    n_layers=st.integers(1, 80),
)
def test_any_config_sizes_give_a_layout_or_a_config_error(v41_config, vocab, heads, max_ngram, head_dim, n_layers):
    raw = {k: v for k, v in v41_config.to_dict().items() if k != "name"}
    raw |= {"engram_vocab_size": vocab, "engram_n_heads": heads, "engram_max_ngram_size": max_ngram}
    raw |= {"engram_head_dim": head_dim, "n_layers": 4096, "engram_layer_ids": list(range(n_layers))}
    raw["engram_num_embeddings"] = [1] * n_layers
    start = time.perf_counter()
    try:
        layout = EngramLayout(EngramConfig.from_dict(raw, "h"))
        rows = layout.rows_per_layer
    except ConfigError as err:
        assert "\n" not in str(err)
    else:
        assert rows.dtype == np.int64 and (rows > 0).all() and layout.offsets.shape == (n_layers, layout.n_hash_cols)
    assert time.perf_counter() - start < 5.0
