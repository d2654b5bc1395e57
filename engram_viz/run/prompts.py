"""Prompt sets: ``data/prompts/default.jsonl`` and user JSONL files, built into model inputs.

One JSON object per line: ``{"id": str, "category": str, "text": str}``. Text may hold image
placeholders (``<image:WxH>``, ``<image:WxHpx>``; see ``images``) and real pictures: ``<image:pic.png>``
in the text, or bare ``<image>`` placeholders filled in order from ``"images": ["pic.png", ...]``; a
file's pictures are read relative to its folder and may not lead outside it. A random-token control stores
no text but a seed: ``{"id", "category": "random_token", "text": null, "seed": int, "length": int}``;
its raw ids are drawn at load time by ``numpy.random.default_rng(seed).integers(3, 128000, length)``
(the base vocabulary without BOS/EOS/pad; added tokens excluded), so they never depend on a
tokenizer's text round trip. Blank lines and lines starting with ``#`` are skipped; ``id``
defaults to ``line<N>`` and ``category`` to ``custom``.

The default set's categories (``CATEGORIES``; the set is for the embedded tiny LM, see
:func:`prompt_set_for`): English and Chinese named entities and set phrases (``idioms``) that occur in
the tiny LM's training text, and controls: the same templates with unseen names, novel sentences,
random tokens and image spans. The ``paper`` set (``PAPER_CATEGORIES``): the Engram paper's
Figure 7 examples (Alexander the Great, the Milky Way, Princess of Wales, 四大发明, 张仲景 - in
sentences of our own), idioms, code, math, random-token controls and image spans.

The shipped sets and which one fits a model: ``default`` (``data/prompts/default.jsonl``) is for the embedded tiny Engram LM: its entities and
set phrases (English and Chinese, several tokens each) occur in the tiny LM's training text (the
KJV, WordNet, the Chinese Debian Reference and fortunes-zh), beside controls: the same templates
with names the model never read (``unseen_names``), ``novel_sentences``, ``random_token`` and
``image`` spans. ``paper`` (``data/prompts/paper.jsonl``) holds the Engram paper's Figure-7-style
prompts (Alexander the Great, the Milky Way, Princess of Wales, 四大发明, ...) for a real
checkpoint, which has read such text. :func:`prompt_set_for` picks by the model: a tiny LM folder
gets ``default``, any other weights ``paper``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeGuard

import numpy as np

from engram_viz.config import DATA_DIR, TEXT, EngramConfig
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.errors import PictureError, PromptError
from engram_viz.run.images import ImagePromptError, ImageTextInput, build_input, check_placeholders, named_pictures
from engram_viz.run.pictures import open_image
from engram_viz.run.prompt_text import PromptInputError, check_prompt_text

DEFAULT_PROMPTS = DATA_DIR / "prompts" / "default.jsonl"
CATEGORIES = (
    "english_entities",
    "chinese_entities",
    "idioms",
    "unseen_names",
    "novel_sentences",
    "random_token",
    "image",
)
PAPER_CATEGORIES = ("english_entities", "chinese_entities", "idioms", "code", "math", "random_token", "image")
RANDOM_ID_RANGE = (3, 128000)
MAX_RANDOM_LENGTH = 1_000_000  # tokens of one random-token control


@dataclass(frozen=True)
class Prompt:
    """One prompt of a set; ``text`` is None for a random-token control (``seed``, ``length``).
    ``source`` (``FILE:LINE``) says where a prompt read from a file came from."""

    id: str
    category: str
    text: str | None
    seed: int | None = None
    length: int | None = None
    source: str | None = field(default=None, compare=False)
    images: tuple[str, ...] = ()  # pictures for the text's bare <image> placeholders, in order
    folder: Path | None = field(default=None, compare=False)  # a prompt file's folder: its pictures stay inside

    @property
    def is_random(self) -> bool:
        return self.text is None

    def random_ids(self) -> np.ndarray:
        """int64 ``[length]`` raw ids drawn from the seed (random-token controls only)."""
        if not self.is_random:
            raise PromptError(f"prompt {self.id!r} has text; only random-token controls draw ids")
        rng = np.random.default_rng(self.seed)
        return rng.integers(RANDOM_ID_RANGE[0], RANDOM_ID_RANGE[1], size=self.length, dtype=np.int64)


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _images(obj: dict, where: str, pid: str) -> tuple[str, ...]:
    """The ``"images"`` field: a list of picture paths (relative to the prompt file's folder)."""
    images = obj.get("images", [])
    if not isinstance(images, list) or not all(isinstance(x, str) and x.strip() for x in images):
        raise PromptError(
            f"{where}: prompt {pid!r}: 'images' must be a list of picture paths (strings), got {_short(images)}"
        )
    return tuple(images)


def _parse(obj: object, where: str, lineno: int, folder: Path | None = None) -> Prompt:
    if not isinstance(obj, dict):
        raise PromptError(f"{where}: expected a JSON object per line, got {type(obj).__name__}")
    pid = obj.get("id", f"line{lineno}")
    category = obj.get("category", "custom")
    if not isinstance(pid, str) or not pid.strip():
        raise PromptError(f"{where}: 'id' must be a non-empty string, got {_short(pid)}")
    if not isinstance(category, str) or not category.strip():
        raise PromptError(f"{where}: prompt {pid!r}: 'category' must be a non-empty string, got {_short(category)}")
    text = obj.get("text")
    if text is None:
        seed, length = obj.get("seed"), obj.get("length")
        if not (_is_int(seed) and _is_int(length) and 0 < length <= MAX_RANDOM_LENGTH and seed >= 0):
            raise PromptError(
                f"{where}: prompt {pid!r} has no 'text'; a random-token control needs an integer 'seed' >= 0 "
                f"and 'length' in 1..{MAX_RANDOM_LENGTH:,}, got seed={_short(seed)} length={_short(length)}"
            )
        return Prompt(pid, category, None, seed, length, source=where)
    images = _images(obj, where, pid)
    try:  # one rule with the widget and Pipeline.run: text, not blank, valid UTF-8 (no lone surrogate)
        text = check_prompt_text(text, name="'text'")
        check_placeholders(text, images=len(images))  # syntax now; limits and pictures when it is built
    except (PromptInputError, ImagePromptError) as err:
        raise PromptError(f"{where}: prompt {pid!r}: {err}") from None
    try:  # every picture read now (before any model loads), again when the prompt is built
        for picture in [*named_pictures(text), *images]:
            open_image(picture, folder, confined=folder is not None)
    except PictureError as err:
        raise PictureError(f"{where}: prompt {pid!r}: {err}") from None
    return Prompt(pid, category, text, source=where, images=images, folder=folder)


def _short(value: object) -> str:
    """``repr`` of a value, cut to 60 characters (a field may hold a 5,000-digit number)."""
    text = (
        repr(value)
        if not isinstance(value, int) or abs(value) < 10**50
        else f"an integer of {len(str(abs(value))):,} digits"
    )
    return text if len(text) <= 60 else text[:57] + "..."


def _decode_line(raw: bytes, path: Path, lineno: int) -> str:
    """One line of a prompt file as text; bytes that are not UTF-8 (a lone surrogate written as
    UTF-8, a Latin-1 byte) name the file, line, column and, when the line still parses, the prompt."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        pid = None
        try:
            obj = json.loads(raw.decode("utf-8", errors="replace"))
            pid = obj.get("id") if isinstance(obj, dict) else None
        except (ValueError, RecursionError):
            pass
        who = f"prompt {pid!r}: " if isinstance(pid, str) else ""
        raise PromptError(
            f"{path}:{lineno}: {who}not UTF-8 text: byte 0x{raw[err.start]:02x} at column {err.start + 1} "
            "(a lone surrogate or a byte of another encoding); save the file as UTF-8"
        ) from None


def load_prompts(path: str | Path | None = None, categories: list[str] | None = None) -> list[Prompt]:
    """Prompts of a JSONL file (default: the shipped set), optionally only some categories. Every
    error is a :class:`PromptError` naming the file, the line and (when it has one) the prompt."""
    path = Path(path) if path is not None else DEFAULT_PROMPTS
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise PromptError(f"prompt file {path} does not exist") from None
    except OSError as err:
        raise PromptError(f"prompt file {path} cannot be read: {err.strerror or err}") from None
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]  # a UTF-8 byte order mark
    prompts, seen = [], set()
    for lineno, raw in enumerate(data.split(b"\n"), 1):
        line = _decode_line(raw, path, lineno)
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        where = f"{path}:{lineno}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as err:  # JSONDecodeError; an integer of over 4,300 digits
            raise PromptError(f"{where}: not valid JSON: {str(err)[:200]}") from None
        p = _parse(obj, where, lineno, path.parent)
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
    if prompt.text is not None:  # not a random-token control (Prompt.is_random)
        try:
            return build_input(
                prompt.text,
                tokenizer,
                config,
                bos=bos,
                images=prompt.images,
                folder=prompt.folder,
                confined=prompt.folder is not None,
            )
        except ImagePromptError as err:
            if prompt.source is None:
                raise
            raise type(err)(f"{prompt.source}: prompt {prompt.id!r}: {err}") from None
    drawn = prompt.random_ids()
    ids = np.concatenate([[BOS_ID], drawn]).astype(np.int64) if bos else drawn
    types = np.full(len(ids), TEXT, dtype=np.int64)
    return ImageTextInput(ids, types, np.ones(len(ids), dtype=bool), (), tokenizer.decode(drawn), ((0, len(ids)),))


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
