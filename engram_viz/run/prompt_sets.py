"""The shipped prompt sets and which one fits a model.

``default`` (``data/prompts/default.jsonl``) is for the embedded tiny Engram LM: its entities and
set phrases (English and Chinese, several tokens each) occur in the tiny LM's training text (the
KJV, WordNet, the Chinese Debian Reference and fortunes-zh), beside controls: the same templates
with names the model never read (``unseen_names``), ``novel_sentences``, ``random_token`` and
``image`` spans. ``paper`` (``data/prompts/paper.jsonl``) holds the Engram paper's Figure-7-style
prompts (Alexander the Great, the Milky Way, Princess of Wales, 四大发明, ...) for a real
checkpoint, which has read such text. :func:`prompt_set_for` picks by the model: a tiny LM folder
gets ``default``, any other weights ``paper``.
"""

from __future__ import annotations

from pathlib import Path

from engram_viz.config import DATA_DIR
from engram_viz.run.prompts import PromptError

PROMPT_SETS = {"default": DATA_DIR / "prompts" / "default.jsonl", "paper": DATA_DIR / "prompts" / "paper.jsonl"}


def prompt_set_path(name: str) -> Path:
    """The file of a shipped prompt set by name (``default`` or ``paper``)."""
    if name not in PROMPT_SETS:
        raise PromptError(f"prompt set {name!r} unknown; expected one of {sorted(PROMPT_SETS)}")
    return PROMPT_SETS[name]


def prompt_set_for(is_tiny_lm: bool) -> str:
    """``default`` for the embedded tiny Engram LM (or another tiny LM folder), ``paper`` for any
    other weights (a real checkpoint, or synthetic tables that have read nothing)."""
    return "default" if is_tiny_lm else "paper"
