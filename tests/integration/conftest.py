"""Fixtures of the notebook tests (test_notebook.py, test_trace_analyses.py): a pipeline from the
environment and one trace over an image caption, two entity prompts and a random-token control."""

from __future__ import annotations

import pytest

from engram_viz.apps.notebook import load_pipeline


@pytest.fixture(scope="module")
def pipe():
    return load_pipeline()


@pytest.fixture(scope="module")
def trace(pipe):
    return pipe.run(
        [
            {"id": "caption", "category": "image", "text": "Here is the Milky Way: <image:6x3> It stretches across."},
            {"id": "en", "category": "english_entities", "text": "Only Alexander the Great could tame the horse."},
            {"id": "zh", "category": "chinese_entities", "text": "万里长城东起山海关，西至嘉峪关。"},
            {"id": "rnd", "category": "random_token", "seed": 3, "length": 40},
        ]
    )
