"""The shipped prompt set and the prompt-file loader."""

from __future__ import annotations

import json

import numpy as np
import pytest
from prompt_kit import build_prompts

from engram_viz.core.tokenizer import BOS_ID
from engram_viz.run.prompts import (
    CATEGORIES,
    DEFAULT_PROMPTS,
    PAPER_CATEGORIES,
    PROMPT_SETS,
    PromptError,
    build_prompt,
    load_prompts,
    prompt_set_for,
    prompt_set_path,
)


@pytest.mark.parametrize("name,categories", [("default", CATEGORIES), ("paper", PAPER_CATEGORIES)])
def test_shipped_sets_cover_their_categories(tokenizer, name, categories):
    path = prompt_set_path(name)
    prompts = load_prompts(path)
    assert {p.category for p in prompts} == set(categories)
    built = build_prompts(prompts, tokenizer)
    for p, x in built:
        assert len(x) > 1 and x.input_ids[0] == BOS_ID
        assert (len(x.spans) > 0) == (p.category == "image")
        assert x.input_ids.max() < 129280 and x.input_ids.min() >= 0
    for line in path.read_text(encoding="utf-8").splitlines():
        assert set(json.loads(line)) <= {"id", "category", "text", "seed", "length"}


def test_paper_set_holds_the_figure7_examples_and_default_its_controls():
    texts = " ".join(p.text for p in load_prompts(PROMPT_SETS["paper"]) if p.text)
    for needle in ("Alexander the Great", "Milky Way", "Princess of Wales", "四大发明", "张仲景"):
        assert needle in texts
    default = load_prompts()
    assert DEFAULT_PROMPTS == PROMPT_SETS["default"]
    by_id = {p.id: p for p in default}
    # the unseen-name controls reuse the entity templates with other names
    assert by_id["en_israel_egypt"].text.split()[:4] == by_id["en_unseen_israel"].text.split()[:4]
    assert prompt_set_for(True) == "default" and prompt_set_for(False) == "paper"
    with pytest.raises(ValueError, match="unknown"):
        prompt_set_path("nope")


def test_random_controls_are_drawn_from_the_seed(tokenizer):
    prompts = [p for p in load_prompts() if p.category == "random_token"]
    assert prompts and all(p.text is None for p in prompts)
    a = build_prompt(prompts[0], tokenizer)
    b = build_prompt(prompts[0], tokenizer)
    assert np.array_equal(a.input_ids, b.input_ids) and len(a) == prompts[0].length + 1
    assert np.array_equal(
        a.input_ids[1:], np.random.default_rng(prompts[0].seed).integers(3, 128000, prompts[0].length)
    )
    assert not np.array_equal(a.input_ids, build_prompt(prompts[1], tokenizer).input_ids)
    assert a.text == tokenizer.decode(a.input_ids[1:]) and a.token_mask.all()


def test_filter_and_custom_file(tmp_path, tokenizer):
    assert {p.category for p in load_prompts(categories=["idioms"])} == {"idioms"}
    path = tmp_path / "p.jsonl"
    path.write_text(
        '# comment\n\n{"text": "hello world"}\n{"id": "r", "category": "x", "text": null, "seed": 1, "length": 4}\n'
    )
    ps = load_prompts(path)
    assert [(p.id, p.category) for p in ps] == [("line3", "custom"), ("r", "x")]
    assert len(build_prompt(ps[1], tokenizer, bos=False)) == 4


@pytest.mark.parametrize(
    "content,match",
    [
        ('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', "duplicate"),
        ('{"id": "a"}\n', "seed"),
        ("not json\n", "not valid JSON"),
        ('["a"]\n', "JSON object"),
        ('{"id": "a", "text": ""}\n', r"bad.jsonl:1: prompt 'a': 'text' is empty"),
        ("\n", "no prompts"),
    ],
)
def test_bad_files(tmp_path, content, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    with pytest.raises(PromptError, match=match):
        load_prompts(path)


def test_missing_file_and_category(tmp_path):
    with pytest.raises(PromptError, match="does not exist"):
        load_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(PromptError, match="no prompts of categories"):
        load_prompts(categories=["poetry"])
