"""How tokens are shown (core/token_text.py, viz/token_labels.py) on the real V4 tokenizer: pieces
are lossless (the bytes they spell are the text's bytes, checked against UTF-8 encoding of the
text itself), never U+FFFD; a character split over tokens shows on each with '…'; special tokens
get short labels; image spans are runs."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_viz.core.token_text import readable_text, special_label, token_bytes
from engram_viz.viz.token_labels import image_spans, token_label, token_labels

pytestmark = pytest.mark.unit
SPLIT = "\u9e3a\u9e60 \U0001d518 \U0001f9ec naïve"  # rare CJK, a math letter, an emoji: byte fragments


def spelled_bytes(piece: str) -> bytes:
    """The bytes a piece spells: its text as UTF-8, each '<0xE7>' as that byte."""
    parts = re.split(r"<0x([0-9A-F]{2})>", piece)
    return b"".join(bytes([int(p, 16)]) if k % 2 else p.encode("utf-8") for k, p in enumerate(parts))


def test_pieces_spell_the_text_bytes_and_never_u_fffd(tokenizer):
    raw = tokenizer.encode(SPLIT)
    pieces = tokenizer.pieces(raw)
    assert tokenizer.decode(raw) == SPLIT
    assert any("<0x" in p for p in pieces), pieces  # the test text does split characters
    assert not any("\ufffd" in p for p in pieces)
    assert b"".join(spelled_bytes(p) for p in pieces) == SPLIT.encode("utf-8")


@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12))
def test_labels_never_show_u_fffd_and_rebuild_split_characters(tokenizer, text):
    text = text.replace("\ufffd", "")
    labels, notes = token_labels(tokenizer.pieces(tokenizer.encode(text)))
    assert not any("\ufffd" in label for label in labels)
    for note in notes.values():
        assert any(f"of {c!r} (U+{ord(c):04X})" in note for c in text), note  # one of the text's own characters


def test_split_character_shown_on_each_token_with_the_merge_marked(tokenizer):
    pieces = tokenizer.pieces(tokenizer.encode("\u9e3a"))
    assert pieces == ["<0xE9><0xB8>", "<0xBA>"]  # 鸺 = E9 B8 BA, split 2 + 1
    labels, notes = token_labels(pieces)
    assert labels == ["\u9e3a\u2026", "\u2026\u9e3a"]
    assert notes[0] == "bytes <0xE9><0xB8> of '\u9e3a' (U+9E3A), split over positions 0-1"
    assert notes[1].startswith("bytes <0xBA> of")
    assert token_labels(["<0xE9>", "x"]) == (["<0xE9>", "x"], {})  # no character to complete: bytes stay


def test_special_tokens_short_and_controls_visible(tokenizer):
    bos, eos, pad = tokenizer.pieces([0, 1, 2])
    assert [token_label(p) for p in (bos, eos, pad)] == ["BOS", "EOS", "PAD"]
    assert special_label("<\uff5cUser\uff5c>") == "<User>"
    assert special_label("BOS") is None and token_label("a\nb\t") == "a\u21b5b\u2192"


def test_byte_alphabet_and_readable_text():
    assert token_bytes("\u0120the") == b" the"  # 'Ġ' is the space
    assert token_bytes("<\uff5cUser\uff5c>") is None
    assert readable_text(b"a\xe9\xb8") == "a<0xE9><0xB8>"
    assert readable_text("é".encode()) == "é"


def test_image_spans():
    assert image_spans([False, True, True, False, True]) == [(1, 2), (4, 4)]
    assert image_spans([]) == [] and image_spans([True]) == [(0, 0)]
