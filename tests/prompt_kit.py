"""Test helpers for built prompts (``run.images.ImageTextInput``, ``run.prompts.Prompt``)."""

from __future__ import annotations

import torch

from engram_viz.config import EngramConfig
from engram_viz.run.images import ImageSpan, ImageTextInput
from engram_viz.run.prompts import Prompt, build_prompt, load_prompts


def as_torch(x: ImageTextInput) -> dict[str, torch.Tensor]:
    """``input_ids`` int64, ``token_types`` int64 and ``token_mask`` bool tensors, each ``[1, T]``."""
    return {
        "input_ids": torch.from_numpy(x.input_ids.copy())[None],
        "token_types": torch.from_numpy(x.token_types.copy())[None],
        "token_mask": torch.from_numpy(x.token_mask.copy())[None],
    }


def span_rows(span: ImageSpan) -> list[tuple[int, int]]:
    """``[start, stop)`` position ranges of each grid row's IMAGE tokens."""
    return [
        (span.start + 1 + r * (span.width + 1), span.start + 1 + r * (span.width + 1) + span.width)
        for r in range(span.height)
    ]


def build_prompts(
    prompts: list[Prompt] | None = None, tokenizer=None, config: EngramConfig | str | None = None, bos: bool = True
) -> list[tuple[Prompt, ImageTextInput]]:
    """``(prompt, inputs)`` for every prompt (default: the shipped set)."""
    prompts = load_prompts() if prompts is None else prompts
    return [(p, build_prompt(p, tokenizer, config, bos)) for p in prompts]
