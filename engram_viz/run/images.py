"""Image-masked prompts: text with image placeholders -> ``input_ids`` and ``token_types``.

Reference section 6: each image becomes the span ``[START] + ([IMAGE] * w + [NEWLINE]) * h + [END]``
of ``h * (w + 1) + 2`` positions; every position of the span carries ``image_token_id`` (129264)
in ``input_ids`` and ``token_types`` tells the parts apart (TEXT = -1, START / IMAGE / NEWLINE /
END = 0 / 1 / 2 / 3). ``token_mask = token_types < 0`` is the Engram mask: image positions are
DEAD in the hash (their look-backs block) and their gates are 0. No vision encoder is needed.

Placeholders (case-insensitive, no spaces):

- ``<image:WxH>`` - an explicit grid of W image tokens per row and H rows (W * H <= 1,024);
- ``<image:WxHpx>`` - an image of W x H pixels; the grid follows from the rule below.

**Grid rule for an image size** (``image_grid``). One image token covers
``factor = patch (14) x downsample (3) = 42`` pixels a side. As in Qwen2-VL's ``smart_resize``:
round each side to the nearest multiple of 42 (half to even, at least 42); if the rounded area exceeds
``max_tokens x 42^2`` (1,024 tokens), scale both sides by ``sqrt(W H / max_area)`` and round
*down*; else if it is below ``min_pixels`` (295,936 = 544^2), scale by ``sqrt(min_pixels / (W H))``
and round *up*. The grid is the rounded sides / 42 (computed in exact integers). An extreme aspect ratio whose short side is
already one token is clamped to ``max_tokens // short`` on the long side. **Not verified**: the
reference image processor's exact rounding is unknown to us; give an explicit grid when it
matters.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT, EngramConfig, load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.errors import EngramVizError

PLACEHOLDER = re.compile(r"<image:([^<>]*)>", re.IGNORECASE)
_OPEN = re.compile(r"<image:", re.IGNORECASE)
_SPEC = re.compile(r"^\s*(\d+)\s*[x×]\s*(\d+)\s*(px)?\s*$", re.IGNORECASE)


class ImagePromptError(EngramVizError, ValueError):
    """A placeholder is malformed or asks for more image tokens than the model takes."""


@dataclass(frozen=True)
class ImageSpan:
    """One image span in a built prompt: positions ``[start, stop)``."""

    start: int  # position of START
    stop: int  # one past END
    width: int  # image tokens per row (w)
    height: int  # rows (h)
    placeholder: str  # the placeholder text, e.g. "<image:640x480px>"
    pixels: tuple[int, int] | None = None  # (W, H) in pixels when given as an image size

    @property
    def length(self) -> int:
        return self.height * (self.width + 1) + 2


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


def _round_half_even(a: int, b: int) -> int:
    """round(a / b) as Python rounds (half to even), in integers."""
    q, r = divmod(a, b)
    return q + 1 if 2 * r > b or (2 * r == b and q % 2) else q


def _ceil_sqrt_ratio(a: int, b: int) -> int:
    """ceil(sqrt(a / b)) for positive integers, exactly."""
    n = math.isqrt(a // b)
    while n * n * b < a:
        n += 1
    return n


def image_grid(width_px: int, height_px: int, config: EngramConfig | str = "tiny") -> tuple[int, int]:
    """Grid ``(w, h)`` of image tokens for an image of ``width_px x height_px`` pixels (rule in the
    module docstring; the reference's exact rounding is not verified)."""
    cfg = load_config(config)
    if width_px < 1 or height_px < 1:
        raise ImagePromptError(f"image size {width_px}x{height_px}px: both sides must be at least 1 pixel")
    factor = cfg.vision_patch_size * cfg.vision_downsample_ratio
    max_tokens = cfg.vision_max_n_token
    W, H = int(width_px), int(height_px)
    # integer arithmetic throughout, so no float rounding at the boundaries
    h = max(1, _round_half_even(H, factor))
    w = max(1, _round_half_even(W, factor))
    if w * h > max_tokens:  # floor(side / beta / factor) with beta = sqrt(W H / (max_tokens factor^2))
        h = max(1, math.isqrt(H * max_tokens // W))
        w = max(1, math.isqrt(W * max_tokens // H))
    elif w * h * factor * factor < cfg.vision_min_pixels:  # ceil(side * beta / factor), beta = sqrt(min / (W H))
        h = _ceil_sqrt_ratio(H * cfg.vision_min_pixels, W * factor * factor)
        w = _ceil_sqrt_ratio(W * cfg.vision_min_pixels, H * factor * factor)
    if w * h > max_tokens:  # extreme aspect ratio: the short side is pinned at one token
        if w >= h:
            w = max_tokens // h
        else:
            h = max_tokens // w
    return w, h


def parse_placeholder(spec: str, config: EngramConfig | str = "tiny") -> tuple[int, int, tuple[int, int] | None]:
    """``"WxH"`` (grid) or ``"WxHpx"`` (pixels) -> ``(w, h, pixels or None)``, checked."""
    cfg = load_config(config)
    m = _SPEC.match(spec)
    if not m:
        raise ImagePromptError(
            f"image placeholder <image:{spec}> is malformed; expected <image:WxH> (a grid of image tokens) "
            "or <image:WxHpx> (an image size in pixels), e.g. <image:16x12> or <image:640x480px>"
        )
    a, b = int(m.group(1)), int(m.group(2))
    if m.group(3):
        w, h = image_grid(a, b, cfg)
        return w, h, (a, b)
    if a < 1 or b < 1:
        raise ImagePromptError(f"image placeholder <image:{spec}>: the grid must be at least 1x1")
    if a * b > cfg.vision_max_n_token:
        raise ImagePromptError(
            f"image placeholder <image:{spec}> asks for {a * b} image tokens ({a} x {b}); "
            f"the model takes at most {cfg.vision_max_n_token} per image"
        )
    return a, b, None


def image_span(width: int, height: int, config: EngramConfig | str = "tiny") -> tuple[np.ndarray, np.ndarray]:
    """``(input_ids, token_types)`` int64 ``[h * (w + 1) + 2]`` of one image span."""
    cfg = load_config(config)
    if width < 1 or height < 1 or width * height > cfg.vision_max_n_token:
        raise ImagePromptError(
            f"image grid {width}x{height}: expected at least 1x1 and at most {cfg.vision_max_n_token} image tokens"
        )
    row = [IMAGE] * width + [IMAGE_NEWLINE]
    types = np.array([IMAGE_START, *(row * height), IMAGE_END], dtype=np.int64)
    return np.full(len(types), cfg.image_token_id, dtype=np.int64), types


def _encode_segment(tokenizer, segment: str) -> list[int]:
    bad = _OPEN.search(segment)
    if bad:
        near = segment[bad.start() : bad.start() + 40]
        raise ImagePromptError(f"unterminated image placeholder near {near!r}; expected <image:WxH> or <image:WxHpx>")
    return tokenizer.encode(segment) if segment else []


def build_input(
    text: str, tokenizer=None, config: EngramConfig | str | None = None, bos: bool = True
) -> ImageTextInput:
    """Tokenize ``text``, expanding every ``<image:...>`` placeholder into an image span.

    Text segments are tokenized separately (no special tokens); ``bos`` prepends the BOS token
    (a text position). ``tokenizer``: an ``EngramTokenizer`` (default: the bundled one for
    ``config``, default config ``tiny``).
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if tokenizer is None:
        tokenizer = get_tokenizer(config or "tiny")
    cfg = load_config(config) if config is not None else tokenizer.config
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
        w, h, pixels = parse_placeholder(m.group(1), cfg)
        span_ids, span_types = image_span(w, h, cfg)
        spans.append(ImageSpan(pos, pos + len(span_ids), w, h, m.group(0), pixels))
        ids.append(span_ids)
        types.append(span_types)
        pos += len(span_ids)
        cursor = m.end()
    add_text(_encode_segment(tokenizer, text[cursor:]))
    input_ids = np.concatenate(ids) if ids else np.empty(0, dtype=np.int64)
    token_types = np.concatenate(types) if types else np.empty(0, dtype=np.int64)
    return ImageTextInput(input_ids, token_types, token_types < 0, tuple(spans), text, tuple(text_ranges))
