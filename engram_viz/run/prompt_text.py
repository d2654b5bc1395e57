"""Prompt text checks: what a typed or pasted prompt must be before the tokenizer sees it.

``check_prompt_text(text)`` returns the text as a ``str`` or raises :class:`PromptInputError`
with a message that names the prompt, what is wrong and what is expected: empty or blank text,
more than ``MAX_PROMPT_CHARS`` characters (every way in: the widget, prompt files and
``Pipeline.run``; a longer text is refused up front with how to split it), bytes that are not UTF-8, a lone surrogate (U+D800..U+DFFF, which no UTF-8 text can hold).
``without_lone_surrogates(text)`` is the same text with each lone surrogate replaced by U+FFFD,
the form a widget can send back to a browser.
"""

from __future__ import annotations

import re
from typing import Any

from engram_viz.errors import PromptInputError

# One prompt runs in one forward: 20,000 characters are ~5,400 tokens, which the tokenizer reads in
# 0.05 s and the tiny LM's forward (with its Engram layers) runs in ~8 s on two CPU cores; time and
# memory grow with the length, so a 1,000,000-character prompt would run for minutes. Longer texts
# go in as several prompts (or through ``engram-viz corpus``, which streams documents in pieces).
MAX_PROMPT_CHARS = 20_000
MAX_CHARS = MAX_PROMPT_CHARS  # the widget's default (its max_chars can only be lower to be useful)

_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD (the text is then valid UTF-8)."""
    return _LONE_SURROGATE.sub("\ufffd", text)


def check_prompt_text(text: Any, *, max_chars: int = MAX_PROMPT_CHARS, name: str = "prompt") -> str:
    """``text`` as a str the tokenizer takes, or a :class:`PromptInputError` that says what is wrong
    and what is expected (bytes are decoded as strict UTF-8). One rule for every way in: the widget,
    prompt files and ``Pipeline.run`` (``max_chars``: at most ``MAX_PROMPT_CHARS``)."""
    max_chars = min(int(max_chars), MAX_PROMPT_CHARS)
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as err:
            raise PromptInputError(
                f"{name} is not valid UTF-8: byte 0x{bytes(text)[err.start]:02x} at offset {err.start} "
                "cannot be decoded; paste plain text"
            ) from None
    if not isinstance(text, str):
        raise PromptInputError(f"{name} must be text (a str), got {type(text).__name__}")
    if not text.strip():
        raise PromptInputError(f"{name} is empty: type some text (image placeholders like <image:16x12> work too)")
    if len(text) > max_chars:
        raise PromptInputError(
            f"{name} has {len(text):,} characters; a prompt takes at most {max_chars:,} (one forward each, "
            f"longer ones run for minutes): split it into prompts of at most {max_chars:,} characters, "
            "e.g. one per paragraph, or count a long text with engram-viz corpus"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        bad = text[err.start]
        raise PromptInputError(
            f"{name} holds U+{ord(bad):04X} at character {err.start}, a lone surrogate that is not valid UTF-8 "
            "(often pasted from a broken source); delete it"
        ) from None
    return text
