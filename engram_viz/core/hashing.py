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

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from engram_viz.config import IMAGE_END, TEXT, EngramConfig, load_config
from engram_viz.core.devices import resolve_device
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import TokenInputError, TokenInputTypeError

DEAD = -1  # compressed-id sentinel for masked (image) positions, written into the cache only
_INT_DTYPES = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _check_ids(name: str, ids: torch.Tensor, vocab: int) -> None:
    if not isinstance(ids, torch.Tensor):
        raise TokenInputTypeError(f"{name} must be a torch.Tensor, got {type(ids).__name__}")
    if ids.dim() != 2:
        raise TokenInputError(f"{name} must have shape [batch, seq_len], got rank {ids.dim()} shape {list(ids.shape)}")
    check_id_values(name, ids, vocab)


def check_id_values(name: str, ids: torch.Tensor, vocab: int) -> None:
    """``ids`` must be an int64 or int32 tensor of raw ids in ``0..vocab-1`` (any shape)."""
    if ids.dtype not in (torch.int64, torch.int32):
        raise TokenInputTypeError(f"{name} must be int64 or int32 token ids, got {ids.dtype}")
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            bad = lo if lo < 0 else hi
            raise TokenInputError(f"{name} holds token id {bad}; expected raw ids in 0..{vocab - 1}")


def id_sequence(name: str, value: Any) -> torch.Tensor:
    """One sequence of integers ``[T]`` (a list, numpy array or tensor) as int64, refusing what a
    silent conversion would change: floats (even whole ones), bools, strings, nested lists (rank 2)."""
    if isinstance(value, torch.Tensor):
        t = value
    elif isinstance(value, np.ndarray):
        if value.dtype.kind not in "iu":
            raise TokenInputTypeError(f"{name} must hold integer ids, got numpy dtype {value.dtype}")
        t = torch.from_numpy(value.astype(np.int64))
    elif isinstance(value, (list, tuple)):
        for v in value:
            if isinstance(v, (list, tuple, np.ndarray, torch.Tensor)):
                raise TokenInputError(f"{name} must be one sequence [T] of ids, got nested sequences (rank 2)")
            if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
                raise TokenInputTypeError(f"{name} must hold integer ids, got {v!r} ({type(v).__name__})")
        t = torch.tensor([int(v) for v in value], dtype=torch.int64)
    else:
        raise TokenInputTypeError(
            f"{name} must be a list, numpy array or tensor of integer ids, got {type(value).__name__}"
        )
    if t.dtype not in _INT_DTYPES:
        raise TokenInputTypeError(f"{name} must hold integer ids, got {t.dtype}")
    if t.dim() != 1:
        raise TokenInputError(f"{name} must be one sequence [T], got shape {list(t.shape)}")
    return t.to(torch.int64)


def check_token_types(name: str, types: torch.Tensor) -> None:
    """Token types must be TEXT (-1) or an image-span part (0..3, reference section 6)."""
    bad = types[(types < TEXT) | (types > IMAGE_END)]
    if bad.numel():
        raise TokenInputError(
            f"{name} holds the token type {int(bad[0])}; expected -1 (text) or 0..3 (image start, image, newline, end)"
        )


@dataclass(frozen=True)
class HashConstants:
    """What every hash of one config and token map reads, derived and checked once: the checked
    layout (``EngramLayout.checked``), the token map as int64 ``[vocab_size]`` on ``device``, the
    compressed pad id, and the layout's multipliers ``[n_layers, max_ngram]``, primes
    ``[n_layers, max_ngram - 1, n_heads]`` and offsets ``[n_layers, n_hash_cols]`` as tensors.
    A :class:`~engram_viz.run.pipeline.Pipeline` builds one and hashes every run with it."""

    config: EngramConfig
    layout: EngramLayout
    device: torch.device
    token_map: torch.Tensor
    pad_id: int
    multipliers: torch.Tensor
    primes: torch.Tensor
    offsets: torch.Tensor

    @classmethod
    def build(
        cls, config: EngramConfig | str, token_map: np.ndarray | torch.Tensor, device: str | torch.device = "cpu"
    ) -> HashConstants:
        config = load_config(config)
        layout = EngramLayout.checked(config)  # a config whose tables disagree with its primes: ConfigError
        device = resolve_device(device)
        mapped = _checked_token_map(token_map, config).to(device)
        return cls(
            config=config,
            layout=layout,
            device=device,
            token_map=mapped,
            pad_id=int(mapped[config.engram_pad_id]),
            multipliers=torch.as_tensor(layout.multipliers, device=device),
            primes=torch.as_tensor(layout.primes, device=device),
            offsets=torch.as_tensor(layout.offsets, device=device),
        )

    def hash_prompt(self, input_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """One full prefill of ``input_ids`` ``[B, T]`` with a fresh cache; row ids ``[B, T, n_layers, 24]``."""
        _check_ids("input_ids", input_ids, self.config.vocab_size)
        batch, seqlen = input_ids.shape
        return NgramHasher.of(self, max_batch=max(batch, 1), max_seq_len=max(seqlen, 1))(input_ids, 0, token_mask)


class NgramHasher:
    """Hashes raw token ids into Engram table rows, keeping a cache of compressed ids.

    ``token_map`` is the raw -> compressed map (``EngramTokenizer.token_map``). The cache holds
    ``max_batch`` sequences of up to ``max_seq_len`` positions. ``NgramHasher.of(constants, ...)``
    builds one on :class:`HashConstants` made before (no constant derived or checked again).
    """

    def __init__(
        self,
        config: EngramConfig | str,
        token_map: np.ndarray | torch.Tensor,
        max_batch: int = 1,
        max_seq_len: int = 4096,
        device: str | torch.device = "cpu",
    ):
        self._setup(HashConstants.build(config, token_map, device), max_batch, max_seq_len)

    @classmethod
    def of(cls, constants: HashConstants, max_batch: int = 1, max_seq_len: int = 4096) -> NgramHasher:
        hasher = cls.__new__(cls)
        hasher._setup(constants, max_batch, max_seq_len)
        return hasher

    def _setup(self, constants: HashConstants, max_batch: int, max_seq_len: int) -> None:
        self.constants = c = constants
        self.config, self.layout, self.device = c.config, c.layout, c.device
        self.token_map, self.pad_id = c.token_map, c.pad_id
        self.multipliers, self.primes, self.offsets = c.multipliers, c.primes, c.offsets
        for arg, value in (("max_batch", max_batch), ("max_seq_len", max_seq_len)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise TokenInputError(f"{arg} must be a positive integer, got {value!r}")
        self.max_batch, self.max_seq_len = int(max_batch), int(max_seq_len)
        self.cache = torch.full((max_batch, max_seq_len), self.pad_id, dtype=torch.int64, device=self.device)
        self.filled = np.zeros(max_batch, dtype=np.int64)  # positions hashed so far, per sequence

    def __call__(
        self, input_ids: torch.Tensor, start_pos: int = 0, token_mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """input_ids ``[B, L]`` raw ids at positions ``start_pos..start_pos+L-1``; token_mask ``[B, L]``
        bool, False for image positions (allowed only in the first chunk). Returns int64 row ids
        ``[B, L, n_engram_layers, n_hash_cols]``."""
        _check_ids("input_ids", input_ids, self.config.vocab_size)
        batch, seqlen = input_ids.shape
        if batch > self.max_batch:
            raise TokenInputError(
                f"input_ids has batch {batch} but the hasher's cache holds max_batch={self.max_batch}"
            )
        if not isinstance(start_pos, (int, np.integer)) or isinstance(start_pos, bool):
            raise TokenInputTypeError(f"start_pos must be an integer position, got {type(start_pos).__name__}")
        if start_pos < 0 or start_pos + seqlen > self.max_seq_len:
            raise TokenInputError(
                f"chunk at start_pos={start_pos} of length {seqlen} overruns the cache of max_seq_len={self.max_seq_len}"
            )
        hashed = int(self.filled[:batch].min())
        if start_pos > hashed:
            raise TokenInputError(
                f"start_pos={start_pos} skips positions: the cache holds {hashed} hashed positions (0..{hashed - 1}) "
                f"for every sequence of the batch; hash the chunk starting at {hashed} first, or reset()"
            )
        input_ids = input_ids.to(self.device, torch.int64)
        compressed = self.token_map[input_ids]
        if token_mask is not None:
            if not isinstance(token_mask, torch.Tensor) or token_mask.dtype != torch.bool:
                raise TokenInputTypeError(
                    f"token_mask must be a bool tensor, got {getattr(token_mask, 'dtype', type(token_mask))}"
                )
            if token_mask.shape != input_ids.shape:
                raise TokenInputError(
                    f"token_mask has shape {list(token_mask.shape)}, expected {list(input_ids.shape)}"
                )
            token_mask = token_mask.to(self.device)
            if start_pos != 0 and not bool(token_mask.all()):
                raise TokenInputError(
                    f"image spans must lie in the first (start_pos 0) chunk; got masked positions at start_pos={start_pos}"
                )
            compressed = torch.where(token_mask, compressed, DEAD)
        self.cache[:batch, start_pos : start_pos + seqlen] = compressed
        self.filled[:batch] = start_pos + seqlen  # a rewind forgets what followed

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
        self.filled[:] = 0


def _checked_token_map(token_map: Any, config: EngramConfig) -> torch.Tensor:
    """The raw -> compressed map as int64 ``[vocab_size]`` with values in ``0..compressed_vocab-1``
    (a -1 would hash like a DEAD image position; floats would be truncated)."""
    t = torch.as_tensor(np.asarray(token_map)) if not isinstance(token_map, torch.Tensor) else token_map.cpu()
    if t.dim() != 1 or len(t) != config.vocab_size:
        raise TokenInputError(f"token_map must have shape [{config.vocab_size}], got {list(t.shape)}")
    if t.dtype not in _INT_DTYPES:
        raise TokenInputTypeError(f"token_map must hold integer compressed ids, got {t.dtype}")
    t = t.to(torch.int64)
    n = config.engram_compressed_vocab_size
    bad = ((t < 0) | (t >= n)).nonzero()
    if bad.numel():
        i = int(bad[0, 0])
        raise TokenInputError(
            f"token_map[{i}] = {int(t[i])}; compressed ids must lie in 0..{n - 1} "
            f"(engram_compressed_vocab_size of config {config.name!r})"
        )
    return t


def hash_prompt(
    config: EngramConfig | str,
    token_map: np.ndarray | torch.Tensor,
    input_ids: torch.Tensor,
    token_mask: torch.Tensor | None = None,
    device: str | torch.device = "cpu",
) -> torch.Tensor:
    """One full prefill of ``input_ids`` ``[B, T]`` with a fresh cache; row ids ``[B, T, n_layers, 24]``
    (a caller that hashes again and again builds :class:`HashConstants` once and calls its ``hash_prompt``)."""
    _check_ids("input_ids", input_ids, load_config(config).vocab_size)
    return HashConstants.build(config, token_map, device).hash_prompt(input_ids, token_mask)
