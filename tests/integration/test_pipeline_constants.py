"""``Pipeline.run`` derives no constant: the layout, its primes and multipliers, the checked token
map and the hash tensors are built once with the Pipeline (``HashConstants``); a run only hashes.
The calls are counted on a second Pipeline's runs, and the rows are the fresh hasher's."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

from engram_viz.config import load_config
from engram_viz.core import hashing, layout
from engram_viz.core.hashing import HashConstants, hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import ConfigError
from engram_viz.run.pipeline import Pipeline

pytestmark = pytest.mark.integration
PROMPTS = ["The Great Wall of China.", "四大发明", "Alexander the Great <image:4x4> tamed the horse."]


def _counted(monkeypatch, owner, name: str, calls: Counter) -> None:
    original = getattr(owner, name)

    def wrapper(*args, **kwargs):
        calls[name] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, wrapper)


def test_a_run_builds_no_layout_and_computes_no_prime(monkeypatch):
    pipe = Pipeline(device="cpu")
    calls: Counter = Counter()
    for owner, name in [
        (EngramLayout, "__init__"),
        (EngramLayout, "check_against_config"),
        (layout, "is_prime"),
        (layout, "next_prime"),
        (layout, "_layout_primes"),
        (hashing, "_checked_token_map"),
        (HashConstants, "build"),
    ]:
        _counted(monkeypatch, owner, name, calls)
    trace = pipe.run(PROMPTS)
    pipe.run(PROMPTS[:1])
    assert calls == Counter(), calls
    monkeypatch.undo()
    for i in range(len(PROMPTS)):
        n = int(trace.lengths[i])
        ids = trace.input_ids[i : i + 1, :n]
        mask = ~trace.is_image[i : i + 1, :n]
        fresh = hash_prompt(pipe.config, pipe.tokenizer.token_map, ids, mask)  # a hasher built from nothing
        assert torch.equal(trace.row_ids[i : i + 1, :n], fresh), PROMPTS[i]


def test_the_checked_layout_is_one_per_config_and_a_bad_config_is_refused_every_time():
    assert EngramLayout.checked(load_config("tiny")) is EngramLayout.checked(load_config("tiny"))
    wrong = load_config("tiny").__class__(**{**vars(load_config("tiny")), "engram_num_embeddings": (7, 7)})
    for _ in range(2):
        with pytest.raises(ConfigError, match="differ from engram_num_embeddings"):
            EngramLayout.checked(wrong)
    assert np.array_equal(EngramLayout.checked(load_config("tiny")).primes, EngramLayout(load_config("tiny")).primes)
