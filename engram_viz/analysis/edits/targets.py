"""What to edit: the rows of an n-gram, of a position's window, of one head, of an entity.

Each selection is ``{layer: rows}`` (int64 arrays, or a ``range`` for a whole head), ready for
``run.counterfactual.compare_edit`` / ``weights.row_edits.edit_tables`` (rows given without a
spec are zeroed: ablated).

- :func:`ngram_rows`: the ``n_heads`` rows one n-gram lands in, per layer (``EngramLayout.ngram_rows``).
- :func:`window_rows`: all 24 rows a position reads, per layer: the 2-, 3- and 4-gram ending there.
- :func:`head_rows`: every row of one (layer, order, head) column: ``range(offset, offset + prime)``.
- :func:`entity_rows`: an entity inside a text: the rows of the n-grams that lie wholly inside the
  entity's tokens (order >= 2, every token in the span), read where the text puts them
  (``core.hashing.hash_prompt``, so blocked look-backs and images follow the reference rule).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engram_viz.config import EngramConfig
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import EditTargetError
from engram_viz.run.images import build_input
from engram_viz.run.trace import token_pieces

SCOPES = ("inside", "ending")


def ngram_rows(layout: EngramLayout, ngram, layers=None) -> dict[int, np.ndarray]:
    """{layer: int64 [n_heads]}: the rows of one n-gram (compressed ids, oldest first)."""
    return {n: layout.ngram_rows(n, list(ngram)) for n in (layers or layout.layer_ids)}


def window_rows(layout: EngramLayout, window, layers=None) -> dict[int, np.ndarray]:
    """{layer: int64 [n_hash_cols]}: the 24 rows of a window of ``max_ngram_size`` compressed
    ids (oldest first; pad ids for blocked look-backs): every order's suffix n-gram, in column order."""
    w = list(window)
    if len(w) != layout.max_ngram_size:
        raise EditTargetError(f"a window holds {layout.max_ngram_size} compressed ids, got {len(w)}")
    orders = layout.config.ngram_orders
    return {
        n: np.concatenate([layout.ngram_rows(n, w[len(w) - o :]) for o in orders]) for n in (layers or layout.layer_ids)
    }


def head_rows(layout: EngramLayout, layer: int, order: int, head: int) -> dict[int, range]:
    """{layer: range}: every row of column (order, head) of ``layer``."""
    li, col = layout.layer_index(layer), layout.column(order, head)
    lo = int(layout.offsets[li, col])
    return {layer: range(lo, lo + int(layout.column_primes[li, col]))}


@dataclass
class EntityRows:
    """An entity's memory in one text. ``input_ids``/``token_types`` int64 ``[T]`` (as the pipeline
    builds the text, BOS first), ``pieces`` the tokens' text, ``start``/``end`` the entity's token
    span ``[start, end)``, ``ngrams`` one row per (layer, position, order, head) read inside the
    span (ngram text, row), ``rows`` {layer: sorted unique int64} to ablate."""

    text: str
    entity: str
    input_ids: np.ndarray
    token_types: np.ndarray
    pieces: list[str]
    start: int
    end: int
    ngrams: pd.DataFrame
    rows: dict[int, np.ndarray]

    @property
    def continuation(self) -> np.ndarray:
        """Positions whose next token is an entity token after its first: ``start .. end - 2``
        (the loss at t predicts token t + 1)."""
        return np.arange(self.start, self.end - 1)


def token_span(pieces: list[str], text_start: int, text_end: int, offset: int) -> tuple[int, int]:
    """The tokens ``[start, end)`` covering characters ``[text_start, text_end)`` of the text whose
    tokens are ``pieces[offset:]`` (their texts concatenated give the text)."""
    ends = np.cumsum([len(p) for p in pieces[offset:]])
    starts = ends - np.array([len(p) for p in pieces[offset:]])
    inside = np.flatnonzero((ends > text_start) & (starts < text_end))
    return int(inside[0]) + offset, int(inside[-1]) + offset + 1


def entity_rows(
    config: EngramConfig,
    tokenizer,
    text: str,
    entity: str,
    occurrence: int = 0,
    bos: bool = True,
    scope: str = "inside",
) -> EntityRows:
    """The rows of ``entity``'s n-grams where ``text`` puts it; ``occurrence`` picks which
    occurrence of ``entity`` in ``text`` (0: the first). ``scope``: ``"inside"`` (the n-grams
    wholly inside the entity's tokens, see the module docstring) or ``"ending"`` (every n-gram
    ending on an entity token: all 24 rows read there, context included)."""
    if scope not in SCOPES:
        raise EditTargetError(f"scope {scope!r} unknown; expected one of {SCOPES}")
    at = -1
    for _ in range(occurrence + 1):
        at = text.find(entity, at + 1)
        if at < 0:
            raise EditTargetError(f"entity {entity!r} (occurrence {occurrence}) not found in text {text[:60]!r}")
    built = build_input(text, tokenizer, config, bos=bos)
    ids, types = np.asarray(built.input_ids, np.int64), np.asarray(built.token_types, np.int64)
    pieces = token_pieces(tokenizer, ids.tolist(), types.tolist())
    if "".join(pieces[int(bos) :]) != text:
        raise EditTargetError(f"text {text[:60]!r}: its tokens do not spell it back; give plain text (no images)")
    start, end = token_span(pieces, at, at + len(entity), int(bos))
    if scope == "inside" and end - start < 2:
        raise EditTargetError(f"entity {entity!r} is {end - start} token(s) in {text[:60]!r}; an n-gram needs 2")
    layout = EngramLayout(config)
    hid = hash_prompt(config, tokenizer.token_map, torch.from_numpy(ids)[None], torch.from_numpy(types < 0)[None])
    hid = hid[0].numpy()  # [T, n_layers, 24]
    recs = []
    for t in range(start, end):
        for order in config.ngram_orders:
            if scope == "inside" and t - order + 1 < start:
                continue
            for head in range(layout.n_heads):
                col = layout.column(order, head)
                for li, layer in enumerate(layout.layer_ids):
                    recs.append(
                        {
                            "layer": layer,
                            "position": t,
                            "order": order,
                            "head": head,
                            "ngram": "".join(pieces[max(0, t - order + 1) : t + 1]),
                            "row": int(hid[t, li, col]),
                        }
                    )
    frame = pd.DataFrame(recs)
    rows = {int(n): np.unique(g["row"].to_numpy(np.int64)) for n, g in frame.groupby("layer")}
    return EntityRows(text, entity, ids, types, pieces, start, end, frame, rows)
