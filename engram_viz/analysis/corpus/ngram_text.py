"""Readable text of compressed n-grams."""

from __future__ import annotations

import numpy as np

from engram_viz.analysis.corpus.windows import DEAD
from engram_viz.config import EngramConfig
from engram_viz.core.token_text import joined_text, special_label
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import InputError

CASE_NOTE = (
    "n-grams are keyed on the compressed vocabulary, which folds case, accents and a leading space "
    "('The', ' the' and 'THE' are one id); each id is shown as one of its raw tokens, so case and "
    "spacing may differ from the text"
)


class NgramDecoder:
    """Readable text of compressed n-grams: each compressed id shows as the text of one raw
    member - the most frequent one in ``raw_counts`` (int ``[vocab]``, e.g. counted over a
    corpus) when given, else the lowest raw id. ``The``/`` the``/``THE`` share an id, so case
    and a leading space may differ from the source (:data:`CASE_NOTE`, the line tables carry). The
    compressed pad id shows as ``<pad>``: a blocked look-back (sequence start or image) - or the
    pad token itself, which the key cannot tell apart; other special tokens as ``<BOS>``; a
    character split over tokens is made whole in :meth:`text`, a stray byte shows as ``<0xE7>``."""

    def __init__(self, tokenizer, pad_id: int | None = None, raw_counts: np.ndarray | None = None):
        self.tokenizer = tokenizer
        token_map = np.asarray(tokenizer.token_map)
        self.pad_id = int(token_map[tokenizer.config.engram_pad_id]) if pad_id is None else int(pad_id)
        raw = np.arange(len(token_map), dtype=np.int64)
        if raw_counts is None:
            order = raw[::-1]  # the last write wins: the lowest raw id
        else:
            rc = np.asarray(raw_counts)
            if rc.shape != token_map.shape:
                raise InputError(f"raw_counts must have shape {list(token_map.shape)}, got {list(rc.shape)}")
            order = np.lexsort((-raw, rc))  # ascending count, ties: higher id first -> most frequent, lowest id last
        first = np.full(int(token_map.max()) + 1, -1, dtype=np.int64)
        first[token_map[order]] = order
        self._first = first
        self._cache: dict[int, str] = {}

    def pieces(self, ids) -> list[str]:
        ids = [int(i) for i in ids]
        todo = sorted({i for i in ids if i not in self._cache})
        if todo:
            bad = [i for i in todo if not (i == DEAD or 0 <= i < len(self._first))]
            if bad:
                raise InputError(f"compressed id {bad[0]} out of range; expected 0..{len(self._first) - 1}")
            raw = [int(self._first[i]) for i in todo if i not in (DEAD, self.pad_id)]
            texts = iter(self.tokenizer.pieces(raw))
            for i in todo:
                self._cache[i] = "<DEAD>" if i == DEAD else "<pad>" if i == self.pad_id else _short(next(texts))
        return [self._cache[i] for i in ids]

    def text(self, ids) -> str:
        return joined_text(self.pieces(ids))


def _short(piece: str) -> str:
    """A special token as ``<BOS>`` (n-gram text reads as one string, so labels keep brackets)."""
    label = special_label(piece)
    return piece if label is None else label if label.startswith("<") else f"<{label}>"


def make_decoder(config: EngramConfig, tokenizer, pad_id: int) -> NgramDecoder | None:
    """A decoder over ``tokenizer`` (None: the bundled V4 tokenizer; an NgramDecoder is reused;
    False: no decoding, tables get empty text)."""
    if tokenizer is False:
        return None
    if isinstance(tokenizer, NgramDecoder):
        return tokenizer
    if tokenizer is None:
        tokenizer = get_tokenizer(config)
    return NgramDecoder(tokenizer, pad_id)
