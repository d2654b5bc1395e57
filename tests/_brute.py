"""Brute-force references for the accumulator tests: plain Python loops, no numpy tricks.

Imported by tests/test_ngrams.py, test_usage.py, test_collisions.py, test_corpus.py (pytest puts
tests/ on sys.path).
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict

import numpy as np
import torch

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout

DEAD = -1


def forced_config() -> EngramConfig:
    """``tiny`` with engram_vocab_size 11: primes 11, 13, 17, ... so collisions are certain."""
    tiny = load_config("tiny")
    probe = dataclasses.replace(tiny, name="forced", engram_vocab_size=11)
    rows = tuple(int(x) for x in EngramLayout(probe).rows_per_layer)
    return dataclasses.replace(tiny, name="forced", engram_vocab_size=11, engram_num_embeddings=rows)


def random_sequences(seed: int, n_seq: int = 6, max_len: int = 40, alphabet: int = 14, p_image: float = 0.1):
    """Lists of compressed ids (small alphabet, so n-grams repeat) and bool masks (False = image)."""
    rng = np.random.default_rng(seed)
    seqs, masks = [], []
    for _ in range(n_seq):
        n = int(rng.integers(1, max_len))
        seqs.append([int(x) for x in rng.integers(0, alphabet, n)])
        masks.append([bool(x) for x in rng.random(n) >= p_image])
    return seqs, masks


def ref_windows(seq: list[int], mask: list[bool], pad: int, max_ngram: int) -> list[tuple[int, ...]]:
    """Per position, the ids multiplied at look-backs 0..max_ngram-1 (reference section 3)."""
    cache = [c if m else DEAD for c, m in zip(seq, mask)]
    out = []
    for t in range(len(seq)):
        blocked, window = False, []
        for s in range(max_ngram):
            if t - s < 0 or cache[t - s] == DEAD:
                blocked = True
            window.append(pad if blocked else cache[t - s])
        out.append(tuple(window))
    return out


def ref_counts(config: EngramConfig, seqs, masks, pad: int = 2) -> dict[tuple[int, ...], int]:
    """{n-gram (oldest first): positions} over text positions, all orders."""
    counts: dict[tuple[int, ...], int] = defaultdict(int)
    for seq, mask in zip(seqs, masks):
        for t, w in enumerate(ref_windows(seq, mask, pad, config.engram_max_ngram_size)):
            if not mask[t]:
                continue
            for n in config.ngram_orders:
                counts[tuple(reversed(w[:n]))] += 1
    return dict(counts)


def ref_row(layout: EngramLayout, li: int, ngram: tuple[int, ...], head: int) -> int:
    """Row of an n-gram (oldest first) in one head, in Python integers."""
    h = 0
    for s, c in enumerate(reversed(ngram)):
        h ^= int(c) * int(layout.multipliers[li, s])
    col = (len(ngram) - 2) * layout.n_heads + head
    return h % int(layout.column_primes[li, col]) + int(layout.offsets[li, col])


def ref_row_hits_from_hasher(config: EngramConfig, raw_seqs, masks, token_map) -> dict[tuple[int, int], int]:
    """{(layer, row): hits} counted from the project's NgramHasher over raw id sequences."""
    hits: dict[tuple[int, int], int] = defaultdict(int)
    for raw, mask in zip(raw_seqs, masks):
        rows = hash_prompt(config, token_map, torch.tensor([raw]), torch.tensor([mask]))[0].numpy()
        for t in range(len(raw)):
            if not mask[t]:
                continue
            for li, layer in enumerate(config.engram_layer_ids):
                for r in rows[t, li]:
                    hits[(layer, int(r))] += 1
    return dict(hits)


def ref_buckets(config: EngramConfig, counts: dict[tuple[int, ...], int]):
    """{(layer, order, head): {row: set of n-grams}}."""
    layout = EngramLayout(config)
    out: dict[tuple[int, int, int], dict[int, set]] = defaultdict(lambda: defaultdict(set))
    for li, layer in enumerate(config.engram_layer_ids):
        for key in counts:
            for head in range(config.engram_n_heads):
                out[(layer, len(key), head)][ref_row(layout, li, key, head)].add(key)
    return out
