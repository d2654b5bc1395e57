"""The reference hash transcribed literally: the arithmetic of the reference's ``NgramHashState``
forward (``inference/engram.py`` of DeepSeek-V4.1-Flash, reference section 3) in torch, as the
baseline the benchmarks measure our hashers against. Only the layout arrays come from
``EngramLayout`` (the same multipliers, primes and offsets the reference derives); the forward
below is the reference's, step for step: cache write, per-shift gather with sticky blocking,
all tokens stacked, products ``[B, L, n_layers, max_ngram]``, XOR one look-back at a time and
``%`` by the primes, ``+ offsets``.
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.core.layout import EngramLayout

DEAD = -1


class ReferenceHash:
    """``ReferenceHash(layout, token_map, max_batch, max_seq_len)(input_ids [B, L], start_pos)``
    -> int64 ``[B, L, n_layers, n_hash_cols]``."""

    def __init__(self, layout: EngramLayout, token_map: np.ndarray, max_batch: int, max_seq_len: int):
        self.max_ngram_size = layout.max_ngram_size
        self.token_map = torch.as_tensor(np.asarray(token_map, dtype=np.int64))
        self.pad_id = int(self.token_map[layout.config.engram_pad_id])
        self.primes = torch.as_tensor(layout.primes)  # [n_layers, max_ngram - 1, n_heads]
        self.offsets = torch.as_tensor(layout.offsets)  # [n_layers, n_hash_cols]
        self.multipliers = torch.as_tensor(layout.multipliers)  # [n_layers, max_ngram]
        self.cache = torch.empty(max_batch, max_seq_len, dtype=torch.int64)

    @torch.inference_mode()
    def __call__(self, input_ids: torch.Tensor, start_pos: int, token_mask: torch.Tensor | None = None):
        batch, seqlen = input_ids.shape
        compressed = self.token_map[input_ids]
        if token_mask is not None:
            compressed = torch.where(token_mask, compressed, DEAD)
        self.cache[:batch, start_pos : start_pos + seqlen] = compressed
        positions = torch.arange(start_pos, start_pos + seqlen).expand(batch, seqlen)
        tokens, blocked = [], torch.zeros_like(positions, dtype=torch.bool)
        for shift in range(self.max_ngram_size):
            source = self.cache[:batch].gather(1, (positions - shift).clamp_min(0))
            blocked = blocked | (positions < shift) | (source == DEAD)
            tokens.append(torch.where(blocked, self.pad_id, source))
        tokens = torch.stack(tokens, dim=-1)  # [B, L, max_ngram]
        products = tokens.unsqueeze(2) * self.multipliers  # [B, L, n_layers, max_ngram]
        rolling, hashes = products[..., 0], []
        for i in range(1, self.max_ngram_size):
            rolling = torch.bitwise_xor(rolling, products[..., i])
            hashes.append(rolling.unsqueeze(-1) % self.primes[:, i - 1])
        return torch.cat(hashes, dim=-1) + self.offsets
