"""The n-gram hasher (reference section 3): raw ids -> table row ids ``[B, T, n_layers, 24]``.

A per-sequence cache of compressed ids at absolute positions lets a prompt be hashed in one
prefill, in chunks, or token by token with identical results. For position p and look-back s
the token is ``cache[p - s]`` unless the window is *blocked*: blocking is sticky, so once a
look-back reaches before position 0 or a DEAD (image) position, it and every longer look-back
read ``pad``. The multiplied tokens are XORed one look-back at a time; the running value after
look-back i is the hash of the (i+1)-gram, reduced modulo each head's prime and shifted by the
column's offset into the layer's table.
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout

DEAD = -1  # compressed-id sentinel for masked (image) positions, written into the cache only


def _check_ids(name: str, ids: torch.Tensor, vocab: int) -> None:
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape [batch, seq_len], got rank {ids.dim()} shape {list(ids.shape)}")
    if ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must be int64 or int32 token ids, got {ids.dtype}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name} holds token id {bad}; expected raw ids in 0..{vocab - 1}")


class NgramHasher:
    """Hashes raw token ids into Engram table rows, keeping a cache of compressed ids.

    ``token_map`` is the raw -> compressed map (``EngramTokenizer.token_map``). The cache holds
    ``max_batch`` sequences of up to ``max_seq_len`` positions.
    """

    def __init__(
        self,
        config: EngramConfig | str,
        token_map: np.ndarray | torch.Tensor,
        max_batch: int = 1,
        max_seq_len: int = 4096,
        device: str | torch.device = "cpu",
    ):
        self.config = load_config(config)
        self.layout = EngramLayout(self.config)
        self.device = torch.device(device)
        self.token_map = torch.as_tensor(np.asarray(token_map), dtype=torch.int64, device=self.device)
        if self.token_map.dim() != 1 or len(self.token_map) != self.config.vocab_size:
            raise ValueError(f"token_map must have shape [{self.config.vocab_size}], got {list(self.token_map.shape)}")
        self.pad_id = int(self.token_map[self.config.engram_pad_id])
        self.multipliers = torch.as_tensor(self.layout.multipliers, device=self.device)  # [n_layers, max_ngram]
        self.primes = torch.as_tensor(self.layout.primes, device=self.device)  # [n_layers, max_ngram-1, n_heads]
        self.offsets = torch.as_tensor(self.layout.offsets, device=self.device)  # [n_layers, n_hash_cols]
        self.max_batch, self.max_seq_len = max_batch, max_seq_len
        self.cache = torch.full((max_batch, max_seq_len), self.pad_id, dtype=torch.int64, device=self.device)

    def __call__(
        self, input_ids: torch.Tensor, start_pos: int = 0, token_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids ``[B, L]`` raw ids at positions ``start_pos..start_pos+L-1``; token_mask ``[B, L]``
        bool, False for image positions (allowed only in the first chunk). Returns int64 row ids
        ``[B, L, n_engram_layers, n_hash_cols]``."""
        _check_ids("input_ids", input_ids, self.config.vocab_size)
        batch, seqlen = input_ids.shape
        if batch > self.max_batch:
            raise ValueError(f"input_ids has batch {batch} but the hasher's cache holds max_batch={self.max_batch}")
        if start_pos < 0 or start_pos + seqlen > self.max_seq_len:
            raise ValueError(
                f"chunk at start_pos={start_pos} of length {seqlen} overruns the cache of max_seq_len={self.max_seq_len}"
            )
        input_ids = input_ids.to(self.device, torch.int64)
        compressed = self.token_map[input_ids]
        if token_mask is not None:
            if not isinstance(token_mask, torch.Tensor) or token_mask.dtype != torch.bool:
                raise TypeError(
                    f"token_mask must be a bool tensor, got {getattr(token_mask, 'dtype', type(token_mask))}"
                )
            if token_mask.shape != input_ids.shape:
                raise ValueError(f"token_mask has shape {list(token_mask.shape)}, expected {list(input_ids.shape)}")
            token_mask = token_mask.to(self.device)
            if start_pos != 0 and not bool(token_mask.all()):
                raise ValueError(
                    f"image spans must lie in the first (start_pos 0) chunk; got masked positions at start_pos={start_pos}"
                )
            compressed = torch.where(token_mask, compressed, DEAD)
        self.cache[:batch, start_pos : start_pos + seqlen] = compressed

        positions = torch.arange(start_pos, start_pos + seqlen, device=self.device).expand(batch, seqlen)
        window = self.cache[:batch]
        blocked = torch.zeros((batch, seqlen), dtype=torch.bool, device=self.device)
        hashes, rolling = [], None
        for shift in range(self.config.engram_max_ngram_size):
            source = window.gather(1, (positions - shift).clamp_min(0))
            blocked |= (positions < shift) | (source == DEAD)
            token = torch.where(blocked, self.pad_id, source)
            product = token.unsqueeze(-1) * self.multipliers[:, shift]  # [B, L, n_layers]
            rolling = product if rolling is None else rolling ^ product
            if shift:
                hashes.append(rolling.unsqueeze(-1) % self.primes[:, shift - 1])  # [B, L, n_layers, n_heads]
        return torch.cat(hashes, dim=-1) + self.offsets

    def reset(self) -> None:
        self.cache.fill_(self.pad_id)


def hash_prompt(
    config: EngramConfig | str,
    token_map: np.ndarray | torch.Tensor,
    input_ids: torch.Tensor,
    token_mask: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """One full prefill of ``input_ids`` ``[B, T]`` with a fresh cache; row ids ``[B, T, n_layers, 24]``."""
    _check_ids("input_ids", input_ids, load_config(config).vocab_size)
    batch, seqlen = input_ids.shape
    hasher = NgramHasher(config, token_map, max_batch=max(batch, 1), max_seq_len=max(seqlen, 1), device=device)
    return hasher(input_ids, 0, token_mask)
