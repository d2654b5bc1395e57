"""Prompt text checks (``run.prompt_text``): each bad prompt named with what is wrong."""

from __future__ import annotations

import pytest

from engram_viz.errors import EngramVizError
from engram_viz.run.prompt_text import PromptInputError, check_prompt_text, without_lone_surrogates


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("", "empty"),
        ("   \n\t", "empty"),
        ("x" * 100_000, "100,000 characters"),
        ("ab\ud800cd", "U+D800"),
        (b"\xff\xfeab", "not valid UTF-8"),
        (12, "must be text"),
    ],
)
def test_check_prompt_text_names_the_problem(bad, says):
    with pytest.raises(PromptInputError, match="prompt X") as info:
        check_prompt_text(bad, name="prompt X")
    assert says in str(info.value)


def test_check_prompt_text_accepts_text_and_utf8_bytes():
    assert check_prompt_text("万里长城") == "万里长城"
    assert check_prompt_text("万里长城".encode()) == "万里长城"


def test_prompt_input_error_is_a_user_error_and_a_value_error():
    assert issubclass(PromptInputError, EngramVizError) and issubclass(PromptInputError, ValueError)


def test_without_lone_surrogates_makes_text_sendable():
    assert without_lone_surrogates("ab\ud800cd") == "ab\ufffdcd"
    assert without_lone_surrogates("万里长城") == "万里长城"
