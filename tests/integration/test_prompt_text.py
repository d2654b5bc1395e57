"""Prompt text checks (``run.prompt_text``): each bad prompt named with what is wrong."""

from __future__ import annotations

import json
import time

import pytest

from engram_viz.cli import main
from engram_viz.errors import EngramVizError, PromptError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompt_text import MAX_PROMPT_CHARS, PromptInputError, check_prompt_text, without_lone_surrogates
from engram_viz.run.prompts import load_prompts


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


# ---------------------------------------------------------------- long prompts (issue 23)

HUGE = "北京是中国的首都。And the children of Israel went up. " * 25_000  # 1,050,000 characters


def _says_limit_and_split(message: str) -> None:
    assert "\n" not in message and f"{len(HUGE):,} characters" in message
    assert f"at most {MAX_PROMPT_CHARS:,}" in message and "split it" in message


def test_long_prompt_is_refused_up_front_everywhere(tmp_path, capsys):
    assert len(HUGE) > 1_000_000
    with pytest.raises(PromptInputError) as info:
        check_prompt_text(HUGE)
    _says_limit_and_split(str(info.value))
    assert check_prompt_text("x" * MAX_PROMPT_CHARS) == "x" * MAX_PROMPT_CHARS
    # no caller lifts the limit past what a forward runs in seconds
    with pytest.raises(PromptInputError):
        check_prompt_text("x" * (MAX_PROMPT_CHARS + 1), max_chars=10**9)

    prompts = tmp_path / "long.jsonl"
    prompts.write_text(json.dumps({"id": "book", "text": HUGE}, ensure_ascii=False) + "\n", encoding="utf-8")
    with pytest.raises(PromptError) as info:
        load_prompts(prompts)
    _says_limit_and_split(str(info.value))

    start = time.perf_counter()
    with pytest.raises(PromptInputError) as info:
        Pipeline(device="cpu").run([HUGE])
    _says_limit_and_split(str(info.value))
    assert time.perf_counter() - start < 30  # refused before any forward (minutes before)

    assert main(["report", "--prompts", str(prompts), "--out", str(tmp_path / "r"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "split it" in err and not (tmp_path / "r").exists()
