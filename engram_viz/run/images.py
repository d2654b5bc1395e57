"""Image-masked prompts: text with image placeholders -> ``input_ids`` and ``token_types``.

Reference section 6: each image becomes the span ``[START] + ([IMAGE] * w + [NEWLINE]) * h + [END]``
of ``h * (w + 1) + 2`` positions; every position of the span carries ``image_token_id`` (129264)
in ``input_ids`` and ``token_types`` tells the parts apart (TEXT = -1, START / IMAGE / NEWLINE /
END = 0 / 1 / 2 / 3). ``token_mask = token_types < 0`` is the Engram mask: image positions are
DEAD in the hash (their look-backs block) and their gates are 0: hashes and gates need no vision encoder.

Placeholders (case-insensitive, no spaces):

- ``<image:WxH>`` - an explicit grid of W image tokens per row and H rows; its whole span
  ``H * (W + 1) + 2`` must fit ``vision_max_n_token`` (1,024), as the reference caps it;
- ``<image:WxHpx>`` - an image of W x H pixels (each side 1..1,000,000); the grid follows from the
  reference's grid planning (``core.image_plan``: 640x480 -> 16x12, 1920x1080 -> 41x23, 100x100 -> 13x13);
- ``<image:path/to/picture.png>`` - a real picture (``run.pictures``: PNG, JPEG, any format Pillow reads),
  its grid planned from its size; ``<image>`` - the next picture of ``images=[...]`` (paths, encoded
  bytes or Pillow images), as the reference pairs its image placeholders with its list of images.

The first two are placeholders: their spans carry **no image features** (``NO_FEATURES``; every
stream label and the Trace's ``meta["image_spans"]`` say so). A picture's span carries its ViT patches
(``ImageSpan.picture``), which a stream source with the vision tower turns into image features.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT, EngramConfig, load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.errors import ImagePromptError, InputTypeError
from engram_viz.run.pictures import MAX_IMAGE_SIDE, Picture, load_picture, open_image, plan_for

PLACEHOLDER = re.compile(r"<image(?::([^<>]*))?>", re.IGNORECASE)  # group 1 None: a bare <image>
_OPEN = re.compile(r"<image:", re.IGNORECASE)
_SPEC = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*(px)?\s*$", re.IGNORECASE | re.ASCII)
MAX_SIDE_DIGITS = 7  # longer numbers are refused before conversion
NO_FEATURES = "no image features"  # how every output labels a placeholder span


@dataclass(frozen=True)
class ImageSpan:
    """One image span in a built prompt: positions ``[start, stop)``."""

    start: int  # position of START
    stop: int  # one past END
    width: int  # image tokens per row (w)
    height: int  # rows (h)
    placeholder: str  # the placeholder text, e.g. "<image:640x480px>"
    pixels: tuple[int, int] | None = None  # (W, H) in pixels when given as an image size or a picture
    picture: Picture | None = None  # the real picture, or None for a placeholder (no image features)

    @property
    def length(self) -> int:
        return self.height * (self.width + 1) + 2

    @property
    def has_features(self) -> bool:
        """True for a real picture (the vision encoder fills the span); False for a placeholder."""
        return self.picture is not None

    @property
    def kind(self) -> str:
        """What fills the span: the picture's name, or ``"placeholder: no image features"``."""
        return self.picture.label if self.picture is not None else f"{self.placeholder}: {NO_FEATURES}"


@dataclass
class ImageTextInput:
    """A built prompt. Arrays are numpy ``[T]``."""

    input_ids: np.ndarray  # int64 [T] raw ids (image_token_id inside spans)
    token_types: np.ndarray  # int64 [T]: TEXT -1, START 0, IMAGE 1, NEWLINE 2, END 3
    token_mask: np.ndarray  # bool [T], True for text (the Engram mask)
    spans: tuple[ImageSpan, ...] = ()
    text: str = ""
    text_ranges: tuple[tuple[int, int], ...] = field(default=())  # [start, stop) of each text segment

    def __len__(self) -> int:
        return len(self.input_ids)


def span_length(width: int, height: int) -> int:
    """Positions of an image span of ``height`` rows of ``width`` image tokens: START, a NEWLINE per
    row, END."""
    return height * (width + 1) + 2


def image_grid(width_px: int, height_px: int, config: EngramConfig | str = "tiny") -> tuple[int, int]:
    """Grid ``(w, h)`` of image tokens for an image of ``width_px x height_px`` pixels: the
    reference's grid planning (rule in ``core.image_plan``)."""
    plan = plan_for(width_px, height_px, config)
    return plan.w, plan.h


def _side(spec: str, digits: str) -> int:
    """One side of a placeholder as an int; a number too long to be a size is refused before
    conversion (Python refuses int() of over 4,300 digits with a message that names nothing)."""
    if len(digits) > MAX_SIDE_DIGITS:
        raise ImagePromptError(
            f"image placeholder <image:{spec[:20]}{'...' if len(spec) > 20 else ''}> holds a number of "
            f"{len(digits):,} digits; sides are at most {MAX_IMAGE_SIDE:,}"
        )
    return int(digits)


def _parse_spec(spec: str) -> tuple[int, int, bool]:
    """``"WxH"`` / ``"WxHpx"`` -> ``(W, H, is_pixels)``: the syntax alone, no config."""
    m = _SPEC.match(spec)
    if not m:
        raise ImagePromptError(
            f"image placeholder <image:{spec[:40]}> is malformed; expected <image:WxH> (a grid of image tokens), "
            "<image:WxHpx> (an image size in pixels) or <image:path/to/picture.png> (a real picture), "
            "e.g. <image:16x12> or <image:640x480px>"
        )
    return _side(spec, m.group(1)), _side(spec, m.group(2)), bool(m.group(3))


def parse_placeholder(spec: str, config: EngramConfig | str = "tiny") -> tuple[int, int, tuple[int, int] | None]:
    """``"WxH"`` (grid), ``"WxHpx"`` (pixels) or a picture's path (read now, relative to the working
    folder) -> ``(w, h, pixels or None)``, checked."""
    cfg = load_config(config)
    if is_picture_spec(spec):
        image, _ = open_image(spec.strip())
        plan = plan_for(image.width, image.height, cfg)
        return plan.w, plan.h, (image.width, image.height)
    a, b, pixels = _parse_spec(spec)
    if pixels:
        w, h = image_grid(a, b, cfg)
        return w, h, (a, b)
    if a < 1 or b < 1:
        raise ImagePromptError(f"image placeholder <image:{spec}>: the grid must be at least 1x1")
    if span_length(a, b) > cfg.vision_max_n_token:
        raise ImagePromptError(
            f"image placeholder <image:{spec}> asks for {a * b} image tokens ({a} x {b}) in a span of "
            f"{span_length(a, b):,} positions (a newline per row, start and end); the model takes a span of at most "
            f"{cfg.vision_max_n_token} positions per image"
        )
    return a, b, None


def is_picture_spec(spec: str | None) -> bool:
    """True when a placeholder names a real picture: a bare ``<image>`` (the next of ``images``) or a
    path (``<image:path/to/picture.png>``: it holds a dot or a slash and is no ``WxH`` size)."""
    return spec is None or (not _SPEC.match(spec) and any(c in spec for c in "./\\"))


def named_pictures(text: str) -> list[str]:
    """The picture paths a text names in ``<image:path>`` placeholders, in order."""
    return [
        m.group(1).strip() for m in PLACEHOLDER.finditer(text) if m.group(1) is not None and is_picture_spec(m.group(1))
    ]


def check_placeholders(text: str, config: EngramConfig | str | None = None, images: int = 0) -> None:
    """The :class:`ImagePromptError` ``build_input`` would raise for the placeholders of ``text``,
    without tokenizing or reading pictures; with ``config`` None only their syntax (well formed,
    terminated, numbers of at most 7 digits, sides at least 1), which no config changes. ``images``:
    how many pictures come with the text for its bare ``<image>`` placeholders."""
    cursor, bare = 0, 0
    for m in PLACEHOLDER.finditer(text):
        _check_terminated(text[cursor : m.start()])
        spec = m.group(1)
        bare += spec is None
        if is_picture_spec(spec):
            pass  # a picture: read when the prompt is built
        elif config is not None:
            parse_placeholder(spec, config)
        else:
            a, b, pixels = _parse_spec(spec)
            if a < 1 or b < 1:
                what = "both sides must be at least 1 pixel" if pixels else "the grid must be at least 1x1"
                raise ImagePromptError(f"image placeholder {m.group(0)[:40]}: {what}")
        cursor = m.end()
    _check_terminated(text[cursor:])
    if bare != images:
        raise ImagePromptError(_count_message(bare, images))


def _count_message(bare: int, images: int) -> str:
    return (
        f"the text holds {bare} bare <image> placeholder{'s' * (bare != 1)} and {images} picture"
        f"{'s' * (images != 1)} come with it; each <image> takes the next picture of 'images' "
        "(or name the file in the text: <image:path/to/picture.png>)"
    )


def _check_terminated(segment: str) -> None:
    bad = _OPEN.search(segment)
    if bad:
        near = segment[bad.start() : bad.start() + 40]
        raise ImagePromptError(f"unterminated image placeholder near {near!r}; expected <image:WxH> or <image:WxHpx>")


def image_span(width: int, height: int, config: EngramConfig | str = "tiny") -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, token_types)`` int64 ``[h * (w + 1) + 2]`` of one image span."""
    cfg = load_config(config)
    if width < 1 or height < 1 or span_length(width, height) > cfg.vision_max_n_token:
        raise ImagePromptError(
            f"image grid {width}x{height}: expected at least 1x1 and a span h * (w + 1) + 2 of at most "
            f"{cfg.vision_max_n_token} positions"
        )
    row = [IMAGE] * width + [IMAGE_NEWLINE]
    types = np.array([IMAGE_START, *(row * height), IMAGE_END], dtype=np.int64)
    return np.full(len(types), cfg.image_token_id, dtype=np.int64), types


def _encode_segment(tokenizer, segment: str) -> list[int]:
    _check_terminated(segment)
    return tokenizer.encode(segment) if segment else []


def _span_of(
    spec: str | None, placeholder: str, cfg: EngramConfig, pictures: Iterator[Any], folder: Path | None, confined: bool
) -> tuple[int, int, tuple[int, int] | None, Picture | None]:
    """``(w, h, pixels, picture)`` of one placeholder: a size, a grid, a named or the next given picture."""
    if not is_picture_spec(spec):
        assert spec is not None  # a bare <image> is a picture spec
        return (*parse_placeholder(spec, cfg), None)
    source = spec.strip() if spec is not None else next(pictures, None)
    if source is None:
        raise ImagePromptError(f"{placeholder} has no picture: pass images=[...] (one per bare <image>)")
    picture = load_picture(source, cfg, folder=folder, confined=confined)
    return picture.plan.w, picture.plan.h, picture.size, picture


def build_input(
    text: str,
    tokenizer=None,
    config: EngramConfig | str | None = None,
    bos: bool = True,
    *,
    images: Sequence[Any] = (),
    folder: str | Path | None = None,
    confined: bool = False,
) -> ImageTextInput:
    """Tokenize ``text``, expanding every ``<image...>`` placeholder into an image span.

    Text segments are tokenized separately (no special tokens); ``bos`` prepends the BOS token
    (a text position). ``tokenizer``: an ``EngramTokenizer`` (default: the bundled one for
    ``config``, default config ``tiny``). Pictures: ``<image:path>`` names a file (relative to
    ``folder`` when given, else the working folder; ``confined``: it must lie inside ``folder``), and
    each bare ``<image>`` takes the next of ``images`` (paths, encoded bytes or Pillow images).
    """
    if not isinstance(text, str):
        raise InputTypeError(f"text must be a str, got {type(text).__name__}")
    if tokenizer is None:
        tokenizer = get_tokenizer(config or "tiny")
    cfg = load_config(config) if config is not None else tokenizer.config
    if isinstance(images, (str, bytes, Path)) or not isinstance(images, Sequence):
        images = [images]
    bare = sum(m.group(1) is None for m in PLACEHOLDER.finditer(text))
    if bare != len(images):
        raise ImagePromptError(_count_message(bare, len(images)))
    base = Path(folder) if folder is not None else None
    pictures = iter(images)
    ids: list[np.ndarray] = []
    types: list[np.ndarray] = []
    spans: list[ImageSpan] = []
    text_ranges: list[tuple[int, int]] = []
    pos = 0

    def add_text(segment_ids: list[int]) -> None:
        nonlocal pos
        if segment_ids:
            ids.append(np.asarray(segment_ids, dtype=np.int64))
            types.append(np.full(len(segment_ids), TEXT, dtype=np.int64))
            text_ranges.append((pos, pos + len(segment_ids)))
            pos += len(segment_ids)

    if bos:
        add_text([BOS_ID])
    cursor = 0
    for m in PLACEHOLDER.finditer(text):
        add_text(_encode_segment(tokenizer, text[cursor : m.start()]))
        w, h, pixels, picture = _span_of(m.group(1), m.group(0), cfg, pictures, base, confined)
        span_ids, span_types = image_span(w, h, cfg)
        spans.append(ImageSpan(pos, pos + len(span_ids), w, h, m.group(0), pixels, picture))
        ids.append(span_ids)
        types.append(span_types)
        pos += len(span_ids)
        cursor = m.end()
    add_text(_encode_segment(tokenizer, text[cursor:]))
    input_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
    token_types = np.concatenate(types) if types else np.empty(0, dtype=np.int64)
    return ImageTextInput(input_ids, token_types, token_types < 0, tuple(spans), text, tuple(text_ranges))
