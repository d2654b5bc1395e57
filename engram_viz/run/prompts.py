"""Prompt sets: ``data/prompts/default.jsonl`` and user JSONL files, built into model inputs.

One JSON object per line: ``{"id": str, "category": str, "text": str}``. Text may hold image
placeholders (``<image:WxH>``, ``<image:WxHpx>``; see ``images``). A random-token control stores
no text but a seed: ``{"id", "category": "random_token", "text": null, "seed": int, "length": int}``;
its raw ids are drawn at load time by ``numpy.random.default_rng(seed).integers(3, 128000, length)``
(the base vocabulary without BOS/EOS/pad; added tokens excluded), so they never depend on a
tokenizer's text round trip. Blank lines and lines starting with ``#`` are skipped; ``id``
defaults to ``line<N>`` and ``category`` to ``custom``.

The default set's categories (``CATEGORIES``): English and Chinese named entities (the Engram
paper's Figure 7 examples among them: Alexander the Great, the Milky Way, Princess of Wales,
四大发明, 张仲景 - in sentences of our own), idioms and formulaic phrases (English and Chinese),
code, math, random-token controls and prompts with image spans.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engram_viz.config import DATA_DIR, TEXT, EngramConfig
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.errors import EngramVizError
from engram_viz.run.images import ImageTextInput, build_input

DEFAULT_PROMPTS = DATA_DIR / "prompts" / "default.jsonl"
CATEGORIES = ("english_entities", "chinese_entities", "idioms", "code", "math", "random_token", "image")
RANDOM_ID_RANGE = (3, 128000)


class PromptError(EngramVizError, ValueError):
    """A prompt file is missing, malformed or inconsistent."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set; ``text`` is None for a random-token control (``seed``, ``length``)."""

    id: str
    category: str
    text: str | None
    seed: int | None = None
    length: int | None = None

    @property
    def is_random(self) -> bool:
        return self.text is None

    def random_ids(self) -> np.ndarray:
        """int64 ``[length]`` raw ids drawn from the seed (random-token controls only)."""
        if not self.is_random:
            raise PromptError(f"prompt {self.id!r} has text; only random-token controls draw ids")
        rng = np.random.default_rng(self.seed)
        return rng.integers(RANDOM_ID_RANGE[0], RANDOM_ID_RANGE[1], size=self.length, dtype=np.int64)


def _parse(obj: object, where: str, lineno: int) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
    pid = obj.get("id", f"line{lineno}")
    category = obj.get("category", "custom")
    if not isinstance(pid, str) or not pid:
        raise PromptError(f"{where}: 'id' must be a non-empty string, got {pid!r}")
    if not isinstance(category, str) or not category:
        raise PromptError(f"{where}: 'category' must be a non-empty string, got {category!r}")
    text = obj.get("text")
    if text is None:
        seed, length = obj.get("seed"), obj.get("length")
        if not (isinstance(seed, int) and isinstance(length, int) and length > 0 and seed >= 0):
            raise PromptError(
                f"{where}: prompt {pid!r} has no 'text'; a random-token control needs an integer 'seed' >= 0 "
                f"and 'length' > 0, got seed={seed!r} length={length!r}"
            )
        return Prompt(pid, category, None, seed, length)
    if not isinstance(text, str) or not text:
        raise PromptError(f"{where}: prompt {pid!r} needs a non-empty string 'text', got {text!r}")
    return Prompt(pid, category, text)


def load_prompts(path: str | Path | None = None, categories: list[str] | None = None) -> list[Prompt]:
    """Prompts of a JSONL file (default: the shipped set), optionally only some categories."""
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise PromptError(f"prompt file {path} does not exist") from None
    except UnicodeDecodeError as err:
        raise PromptError(f"prompt file {path} is not UTF-8: {err}") from None
    prompts, seen = [], set()
    for lineno, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise PromptError(f"{where}: not valid JSON: {err}") from None
        p = _parse(obj, where, lineno)
        if p.id in seen:
            raise PromptError(f"{where}: duplicate prompt id {p.id!r}")
        seen.add(p.id)
        prompts.append(p)
    if categories is not None:
        unknown = set(categories) - {p.category for p in prompts}
        if unknown:
            raise PromptError(f"{path} has no prompts of categories {sorted(unknown)}")
        prompts = [p for p in prompts if p.category in categories]
    if not prompts:
        raise PromptError(f"prompt file {path} holds no prompts")
    return prompts


def build_prompt(
    prompt: Prompt, tokenizer=None, config: EngramConfig | str | None = None, bos: bool = True
) -> ImageTextInput:
    """Model inputs ``[T]`` of one prompt (image spans expanded; random ids drawn from the seed)."""
    if tokenizer is None:
        tokenizer = get_tokenizer(config or "tiny")
    if not prompt.is_random:
        return build_input(prompt.text, tokenizer, config, bos=bos)
    drawn = prompt.random_ids()
    ids = np.concatenate([[BOS_ID], drawn]).astype(np.int64) if bos else drawn
    types = np.full(len(ids), TEXT, dtype=np.int64)
    return ImageTextInput(ids, types, np.ones(len(ids), dtype=bool), (), tokenizer.decode(drawn), ((0, len(ids)),))
