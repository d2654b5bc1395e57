"""Paragraph mode read in blocks (``documents._paragraphs``) against the line-by-line reading it
replaced: the same pieces, whatever the line ends, Unicode blanks, block size and piece length."""

from __future__ import annotations

import io
import random

import pytest

from engram_viz.analysis.corpus import documents
from engram_viz.analysis.corpus.documents import _split_long

ATOMS = ["ab", "x", " ", "\t", "\r", "\n", "\r\n", "\n\n", "\u3000", "\x0c", "\x0b", "\x85", "\u2028", "é", "中文"]


def line_by_line(text: str, max_doc_chars: int) -> list[tuple[str, bool]]:
    """The reading before blocks: every line through ``str.strip``, independently written here."""
    out, buf, size, started = [], [], 0, False
    for line in io.StringIO(text, newline=""):
        if line.strip():
            buf.append(line)
            size += len(line)
            if size > max_doc_chars:
                *full, rest = _split_long("".join(buf), max_doc_chars)
                for piece in full:
                    out.append((piece, started))
                    started = True
                buf, size = [rest], len(rest)
            continue
        if buf:
            out.append(("".join(buf).rstrip("\r\n"), started))
        buf, size, started = [], 0, False
    if buf:
        out.append(("".join(buf).rstrip("\r\n"), started))
    return out


@pytest.mark.parametrize("block", [1, 2, 3, 7, 64, 1 << 20])
def test_paragraphs_in_blocks_match_line_by_line(monkeypatch, block):
    monkeypatch.setattr(documents, "_BLOCK_CHARS", block)
    rng = random.Random(block)
    for _ in range(300):
        text = "".join(rng.choice(ATOMS) for _ in range(rng.randrange(0, 60)))
        for max_doc_chars in (3, 10, 1 << 16):
            got = list(documents._paragraphs(io.StringIO(text, newline=""), max_doc_chars))
            assert got == line_by_line(text, max_doc_chars), (text, max_doc_chars)


def test_paragraphs_linear_on_a_long_blank_line():
    """A megabyte of spaces with no line end is one blank line: no paragraph, and no quadratic search."""
    text = " " * (1 << 20) + "\n" + "a\r\nb\r" + " " * 1000
    assert list(documents._paragraphs(io.StringIO(text, newline=""), 1 << 16)) == [("a\r\nb", False)]


def test_both_patterns_find_the_same_paragraphs_without_cr():
    """The \\n-only pattern (a block with no \\r) against the general one."""
    rng = random.Random(0)
    atoms = [a for a in ATOMS if "\r" not in a]
    for _ in range(2000):
        text = "".join(rng.choice(atoms) for _ in range(rng.randrange(0, 80)))
        spans = [[m.span() for m in p.finditer(text)] for p in (documents._PARAGRAPH, documents._PARAGRAPH_LF)]
        assert spans[0] == spans[1], text
