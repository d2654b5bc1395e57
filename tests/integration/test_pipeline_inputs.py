"""Pipeline.run checks what it is given exactly as the hasher and the prompt file do: pre-tokenized
ids and token types are integers of the right range and rank, and one rule for empty text."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engram_viz.core.hashing import hash_prompt
from engram_viz.errors import EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompt_text import PromptInputError
from engram_viz.weights.synthetic import synthetic_checkpoint


@pytest.fixture(scope="module")
def pipe() -> Pipeline:
    return Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu")


BAD_IDS = {
    "float-list": ([0, 100.0, 200], TypeError, r"prompt 'x': input_ids must hold integer ids, got 100.0 \(float\)"),
    "float-array": (np.array([0.0, 100.7]), TypeError, r"input_ids must hold integer ids, got numpy dtype float64"),
    "float-tensor": (torch.tensor([0.0, 1.5]), TypeError, r"input_ids must hold integer ids, got torch.float32"),
    "strings": (["0", "100"], TypeError, r"input_ids must hold integer ids, got '0' \(str\)"),
    "string": ("0 100 200", TypeError, r"input_ids must be a list, numpy array or tensor of integer ids, got str"),
    "bools": ([True, False, True], TypeError, r"input_ids must hold integer ids, got True \(bool\)"),
    "bool-tensor": (torch.tensor([True, False]), TypeError, r"input_ids must hold integer ids, got torch.bool"),
    "2-d-list": ([[0, 100], [200, 300]], ValueError, r"input_ids must be one sequence \[T\] of ids, got nested"),
    "2-d-array": (
        np.array([[0, 100], [200, 300]]),
        ValueError,
        r"input_ids must be one sequence \[T\], got shape \[2, 2\]",
    ),
    "negative": ([0, -1], ValueError, r"input_ids holds token id -1; expected raw ids in 0\.\.129279"),
    "too-large": ([0, 129_280], ValueError, r"input_ids holds token id 129280"),
}


@pytest.mark.parametrize("name", list(BAD_IDS))
def test_bad_pretokenized_ids_are_refused_like_the_hasher_refuses_them(pipe, name):
    ids, error, message = BAD_IDS[name]
    with pytest.raises(error, match=message) as err:
        pipe.run([{"id": "x", "input_ids": ids}])
    assert isinstance(err.value, EngramVizError)


BAD_TYPES = {
    "seven": (
        [-1, 7, -1],
        ValueError,
        r"prompt 'x': token_types holds the token type 7; expected -1 \(text\) or 0\.\.3",
    ),
    "minus-two": ([-2, -1, -1], ValueError, r"token type -2"),
    "half": ([-1, 0.5, -1], TypeError, r"token_types must hold integer ids, got 0.5 \(float\)"),
    "short": ([-1, -1], ValueError, r"prompt 'x': 2 token_types for 3 input_ids"),
    "2-d": ([[-1, -1, -1]], ValueError, r"token_types must be one sequence"),
}


@pytest.mark.parametrize("name", list(BAD_TYPES))
def test_bad_token_types_are_refused(pipe, name):
    types, error, message = BAD_TYPES[name]
    with pytest.raises(error, match=message) as err:
        pipe.run([{"id": "x", "input_ids": [0, 100, 200], "token_types": types}])
    assert isinstance(err.value, EngramVizError)


def test_good_pretokenized_forms_give_the_hashers_rows(pipe, tokenizer):
    ids = [0, *tokenizer.encode("Alexander the Great")]
    types = [-1] * len(ids)
    forms = [ids, tuple(ids), np.asarray(ids, dtype=np.int32), torch.tensor(ids), [np.int64(i) for i in ids]]
    want = hash_prompt(pipe.config, tokenizer.token_map, torch.tensor([ids]))[0]
    for form in forms:
        trace = pipe.run([{"id": "x", "input_ids": form, "token_types": types}])
        assert trace.input_ids[0].tolist() == ids
        assert torch.equal(trace.row_ids[0], want)


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_is_refused_as_the_prompt_file_and_the_widget_refuse_it(pipe, text):
    with pytest.raises(PromptInputError, match=r"prompt 'p0' is empty"):
        pipe.run([text])
    with pytest.raises(PromptInputError, match=r"prompt 'e' is empty"):
        pipe.run([{"id": "e", "text": text}])


def test_text_errors_name_the_prompt(pipe):
    with pytest.raises(PromptInputError, match=r"prompt 'p1' holds U\+D800 at character 2, a lone surrogate"):
        pipe.run(["fine", "ab\ud800"])
    with pytest.raises(
        EngramVizError,
        match=r"prompt 'img': image placeholder <image:32x32> asks for 1024 image tokens \(32 x 32\) in a span of 1,058",
    ):
        pipe.run([{"id": "img", "text": "see <image:32x32>"}])
    with pytest.raises(EngramVizError, match=r"prompt #0 is a int; expected a string"):
        pipe.run([3])
    with pytest.raises(PromptInputError, match=r"prompt 'n': 'text' must be|prompt 'n' must be text"):
        pipe.run([{"id": "n", "text": 12}])
