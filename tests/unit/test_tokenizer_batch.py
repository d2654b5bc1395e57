"""``EngramTokenizer.encode_batch``, the corpus path's tokenizer: fastokens (when installed, for the
bundled tokenizer file) gives exactly the ids of the ``tokenizers`` reference, text by text."""

from __future__ import annotations

import copy
import json
import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_viz.core.tokenizer import FAST_AFTER_CHARS, EngramTokenizer, bundled_tokenizer_file, fast_batch_backend

# Pieces where the three-stage pre-tokenizer (digits in threes, CJK/kana runs, the main pattern)
# and the byte-level BPE are easiest to get wrong: digits of several scripts and numerals,
# CJK at the edges of the regex ranges, kana marks and punctuation, emoji sequences, combining
# marks, every kind of whitespace run and line break, contractions, control characters.
PIECES = [
    *"0123456789",
    "٣",
    "०",
    "１２",
    "²",
    "½",
    "Ⅷ",
    "〇",
    "12345",
    "中文",
    "日本語",
    "ひらがな",
    "カタカナ",
    "゙",
    "゛",
    "゠",
    "・",
    "ー",
    "龥",
    "龦",
    "㐀",
    "한국어",
    "ไทย",
    "ا",
    "😀",
    "👨‍👩‍👧",
    "🇫🇷",
    "e\u0301",
    "\u0301",
    "\u0308",
    "ñ",
    "ß",
    "İ",
    "Ω",
    " ",
    "  ",
    "   ",
    "\t",
    "\n",
    "\n\n",
    "\r\n",
    "\r",
    "\u00a0",
    "\u3000",
    "\u2028",
    "\x0b",
    "\x0c",
    "\x85",
    "\u200b",
    "\u200d",
    "\ufeff",
    "\x00",
    "\x7f",
    "a",
    "The",
    " the",
    "HELLO",
    "don't",
    "'s",
    "'S",
    ".",
    ",",
    "!?",
    "...",
    "—",
    "“",
    "”",
    "$",
    "€",
    "+=",
    "<",
    ">",
    "_",
    "@",
    "#",
    "%",
    "\\",
    "/",
    "(",
    ")",
    "[",
    "]",
    "{",
    "}",
]


@pytest.fixture(autouse=True)
def _fast_backend_built(tokenizer):
    """The session tokenizer's fast backend built up front: every batch here takes it (fastokens
    is otherwise built only once FAST_AFTER_CHARS of text went through ``encode_batch``)."""
    _ = tokenizer.batch_backend


def added_tokens() -> list[str]:
    """Every added token's text (matched as one id inside a text, special or not)."""
    return [t["content"] for t in json.loads(bundled_tokenizer_file().read_text(encoding="utf-8"))["added_tokens"]]


def reference(tok, texts: list[str]) -> list[list[int]]:
    return [tok.backend.encode(t, add_special_tokens=False).ids for t in texts]


def split(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    assert ids.dtype == np.int64 and lengths.dtype == np.int64 and lengths.sum() == len(ids)
    return [part.tolist() for part in np.split(ids, np.cumsum(lengths)[:-1])] if len(lengths) else []


TEXTS = st.lists(
    st.one_of(
        st.text(max_size=40),
        st.lists(st.sampled_from(PIECES + added_tokens()[:8]), max_size=40).map("".join),
        st.lists(st.sampled_from(PIECES), max_size=12).map(lambda p: "".join(p) * 50),  # long runs
    ),
    max_size=6,
)


@settings(max_examples=400)
@given(texts=TEXTS)
def test_encode_batch_gives_the_reference_ids_text_by_text(tokenizer, texts):
    assert split(*tokenizer.encode_batch(texts)) == reference(tokenizer, texts)


def test_fastokens_is_the_batch_backend_of_the_bundled_file(tokenizer):
    pytest.importorskip("fastokens")
    assert tokenizer.batch_backend is not None
    assert fast_batch_backend(tokenizer.path, "0" * 64) is None  # any other file: the reference


def test_every_added_token_and_long_runs_match(tokenizer):
    texts = ["x" + t + " 1" for t in added_tokens()]
    texts += [u * 70_000 for u in (" ", "\n", "a", "7", "中", "あ", "!", "😀", "\u0301", " a1中!\n", " \t\u3000\n")]
    texts += ["a" * 100_000 + "   1", " " * 100_000 + "1", ""]
    assert split(*tokenizer.encode_batch(texts)) == reference(tokenizer, texts)


SAMPLE = ["In the beginning 1234 中文 ひらがな 😀", "", "  \n\n x"]


def test_the_tokenizers_path_gives_the_same_batch(tokenizer):
    plain = copy.copy(tokenizer)
    plain.__dict__["batch_backend"] = None  # the tokenizers batch path, as for any other file
    assert split(*plain.encode_batch(SAMPLE)) == reference(tokenizer, SAMPLE)


def test_a_pickled_copy_rebuilds_its_fast_backend(tokenizer):
    pytest.importorskip("fastokens")
    assert tokenizer.batch_backend is not None  # built here, then left out of the pickle
    shipped = pickle.loads(pickle.dumps(tokenizer))  # as a Dask worker receives it
    assert "batch_backend" not in shipped.__dict__
    assert split(*shipped.encode_batch(SAMPLE)) == reference(tokenizer, SAMPLE)
    assert shipped.batch_backend is not None


def test_a_small_input_is_encoded_without_building_fastokens():
    pytest.importorskip("fastokens")
    fresh = EngramTokenizer("v41-flash")
    small = fresh.encode_batch(SAMPLE)
    assert "batch_backend" not in fresh.__dict__  # a one-line corpus pays no build
    big = ["In the beginning 1234 中文 ひらがな 😀 " * 1000] * (FAST_AFTER_CHARS // 30_000 + 1)
    ids = fresh.encode_batch(big)
    assert fresh.__dict__.get("batch_backend") is not None  # past FAST_AFTER_CHARS: fastokens from here on
    assert split(*small) == reference(fresh, SAMPLE) and split(*ids) == reference(fresh, big)


def test_pieces_through_fastokens_are_the_reference_pieces_for_every_id(tokenizer):
    """Where a corpus built fastokens, ``pieces`` decodes with it: the same text for every raw id,
    fragments of a character included, as the ``tokenizers`` reading gives."""
    pytest.importorskip("fastokens")
    assert tokenizer.batch_backend is not None
    plain = copy.copy(tokenizer)
    plain.__dict__["batch_backend"] = None
    every = range(tokenizer.vocab_size)
    assert tokenizer.pieces(every) == plain.pieces(every)
