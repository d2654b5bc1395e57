"""Corpus files as documents: plain text (paragraphs, lines or the whole file) or JSONL.

Plain text (``.txt``, or anything not JSONL; ``.gz`` is read transparently):
``doc_mode='paragraph'`` (default) makes every run of non-blank lines a document,
``'line'`` every non-blank line, ``'file'`` the whole file. JSONL (``.jsonl``, ``.ndjson``,
also ``.gz``): one document per line, its ``text_field`` (``text``). A document longer than
``max_doc_chars`` is cut at line ends into pieces (``continues`` True for the later ones). Text is
decoded as UTF-8 with invalid bytes replaced by U+FFFD.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from engram_viz.errors import EngramVizError

DOC_MODES = ("paragraph", "line", "file")
JSONL_SUFFIXES = (".jsonl", ".ndjson")


class CorpusError(EngramVizError, ValueError):
    """A corpus file is missing or malformed, or the default corpus is not installed."""


def is_jsonl(path: str | Path) -> bool:
    name = Path(path).name.lower()
    name = name.removesuffix(".gz")
    return name.endswith(JSONL_SUFFIXES)


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _split_long(text: str, max_chars: int) -> Iterator[str]:
    """Cut at line ends into pieces of about ``max_chars`` (a single longer line is cut hard)."""
    while len(text) > max_chars:
        cut = text.rfind("\n", 0, max_chars) + 1 or max_chars
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def iter_documents(
    path: str | Path, text_field: str = "text", doc_mode: str = "paragraph", max_doc_chars: int = 1 << 16
) -> Iterator[tuple[str, bool]]:
    """``(text, continues)`` pieces of the documents of one file, in order; ``continues`` is True
    for the second and later pieces of a document longer than ``max_doc_chars``."""
    path = Path(path)
    if doc_mode not in DOC_MODES:
        raise CorpusError(f"doc_mode {doc_mode!r} unknown; expected one of {DOC_MODES}")

    def pieces(doc: str) -> Iterator[tuple[str, bool]]:
        for i, piece in enumerate(_split_long(doc, max_doc_chars)):
            yield piece, i > 0

    with _open_text(path) as fh:
        try:
            if is_jsonl(path):
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise CorpusError(f"{path}:{lineno}: not valid JSON: {err}") from None
                    text = obj.get(text_field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        raise CorpusError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
                    if text:
                        yield from pieces(text)
            elif doc_mode == "line":
                for line in fh:
                    if line.strip():
                        yield from pieces(line.rstrip("\r\n"))
            elif doc_mode == "paragraph":
                buf: list[str] = []
                size = 0
                started = False  # a piece of the current paragraph was already yielded
                for line in fh:
                    if line.strip():
                        buf.append(line)
                        size += len(line)
                        if size > max_doc_chars:  # emit the full pieces, keep the rest buffered
                            *full, rest = _split_long("".join(buf), max_doc_chars)
                            for piece in full:
                                yield piece, started
                                started = True
                            buf, size = [rest], len(rest)
                        continue
                    if buf:
                        yield "".join(buf).rstrip("\r\n"), started
                    buf, size, started = [], 0, False
                if buf:
                    yield "".join(buf).rstrip("\r\n"), started
            else:  # file: one sequence streamed in pieces
                first = True
                while True:
                    chunk = fh.read(max_doc_chars)
                    if not chunk:
                        break
                    rest = fh.readline()  # finish the line so cuts fall at line ends
                    yield chunk + rest, not first
                    first = False
        except (OSError, EOFError, UnicodeError) as err:
            raise CorpusError(f"corpus file {path} could not be read: {err}") from None
