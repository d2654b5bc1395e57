"""The tiny LM's training data: documents, the fixed split, the small vocabulary, the windows.

Sources (:data:`TRAIN_SOURCES`, read by ``engram_viz.tiny.sources``, licences there): the King
James Bible, the Chinese Debian Reference, WordNet noun glosses and examples, and Chinese sayings
and poems (fortunes-zh). Each document is tokenised with the V4 tokenizer, BOS first. Within each
source every 25th document (index % 25 == 12) is held out; the rest are concatenated, source by
source, into one training stream. A training batch is ``batch`` windows of ``seq_len + 1`` tokens starting at
offsets drawn from a ``torch.Generator`` seeded with the seed (:func:`batch_offsets`); held-out
loss is the mean over fixed non-overlapping windows of the held-out stream
(:func:`heldout_windows`). Every window hashes as a fresh prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from engram_viz.config import load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.tiny.sources import source_documents

HOLDOUT_EVERY, HOLDOUT_AT = 25, 12
VOCAB_ROWS = 8192  # the small vocabulary: unknown row 0 + the 8,191 commonest raw ids of the training split
HELDOUT_WINDOWS = 320  # held-out windows scored (evenly spread over the ~1,000 of the held-out stream)
TRAIN_SOURCES = ("kjv", "zh-ref", "wordnet", "zh-sayings")  # keys of ``tiny.sources.SOURCES``, in stream order


@dataclass
class Corpus:
    """Token streams (raw V4 ids, int64) of the fixed split, and the small vocabulary."""

    train: torch.Tensor
    heldout: torch.Tensor
    raw_ids: torch.Tensor  # [V] raw id of each small-vocab row; raw_ids[0] = -1 (unknown)
    n_docs: dict


def build_corpus(config="tiny", vocab_rows: int = VOCAB_ROWS, sources: tuple[str, ...] = TRAIN_SOURCES) -> Corpus:
    """Tokenise the sources' documents (``tiny.sources``), split every 25th document of each
    source off, build the vocabulary from train: the ``vocab_rows - 1`` commonest raw ids (ties:
    lower id first), sorted by id, after the unknown row. ``n_docs`` counts documents and tokens
    per source and split."""
    tok = get_tokenizer(load_config(config))
    train, held = [], []
    n_docs: dict = {}
    for key in sources:
        docs = source_documents(key)
        for i, e in enumerate(tok.backend.encode_batch(docs, add_special_tokens=False)):
            split = "heldout" if i % HOLDOUT_EVERY == HOLDOUT_AT else "train"
            (held if split == "heldout" else train).append([BOS_ID, *e.ids])
            n_docs[f"{key}_{split}"] = n_docs.get(f"{key}_{split}", 0) + 1
            n_docs[f"{key}_{split}_tokens"] = n_docs.get(f"{key}_{split}_tokens", 0) + len(e.ids) + 1
    train_ids = torch.tensor([t for d in train for t in d], dtype=torch.int64)
    held_ids = torch.tensor([t for d in held for t in d], dtype=torch.int64)
    counts = torch.bincount(train_ids, minlength=tok.vocab_size)
    order = np.lexsort((np.arange(len(counts)), -counts.numpy()))  # by count desc, then id
    kept = torch.from_numpy(np.sort(order[: vocab_rows - 1]))
    raw_ids = torch.cat([torch.tensor([-1]), kept])
    return Corpus(train_ids, held_ids, raw_ids, n_docs)


def batch_offsets(n_tokens: int, seq_len: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """``[steps, batch]`` window starts, a pure function of the seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len - 1, (steps, batch), generator=g)


def windows_at(stream: torch.Tensor, offsets: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The windows ``[..., seq_len + 1]`` of ``stream`` starting at ``offsets [...]``: a training
    batch is ``windows_at(corpus.train, offsets[step], seq_len)``; the model reads ``[..., :-1]``
    and predicts ``[..., 1:]``."""
    return stream[offsets[..., None] + torch.arange(seq_len + 1)]


def heldout_windows(heldout: torch.Tensor, seq_len: int, max_windows: int | None = HELDOUT_WINDOWS) -> torch.Tensor:
    """Fixed non-overlapping windows ``[N, seq_len + 1]`` of the held-out stream; with
    ``max_windows``, that many spread evenly over the stream (every source is represented)."""
    n = (len(heldout) - 1) // seq_len
    starts = torch.arange(n)
    if max_windows is not None and n > max_windows:
        starts = starts[torch.linspace(0, n - 1, max_windows).round().long()]
    idx = starts[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return heldout[idx]
