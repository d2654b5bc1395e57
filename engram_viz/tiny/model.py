"""A tiny Engram language model: the suite's embedded default, trained here on the CPU.

Architecture (documented again in ``data/tiny-engram/MODEL_CARD.md``)::

    raw ids [B, T] --(id remap: raw id -> row of the small vocabulary, unknown -> 0)--> E [V, dim]
    h = E[ids] repeated into hc_mult streams                                  [B, T, hc, dim]
    for block i in 0..n_layers-1:
        if i is an Engram layer:  h = Engram_i(h, hash_ids[:, :, k], token_mask)  (the suite's module)
        u = mean of the streams                                               [B, T, dim]
        d = Block_i(u) - u        (pre-norm causal self-attention with RoPE + GELU MLP)
        h = h + d  (the same update added to every stream)
    logits = rmsnorm(mean of the streams) @ E.T (tied)                        [B, T, V]

The Engram modules are :class:`engram_viz.core.engram.Engram` unchanged; during training their table
is a :class:`TrainableTable` (float32 rows, same ``row_ids -> rows`` interface as the fp8 tables);
the exported checkpoint stores it as fp8 e4m3 + e8m0 scales under the real checkpoint's names.

The vocabulary is restricted to the 4,095 commonest raw ids of the training split, so the token
embedding stays small (``tiny.embed.raw_ids`` lists them; row 0 is the unknown token).

Its files (``config.json``, index, two shards) are written and read by ``engram_viz.tiny.files``
(``save_tiny_model`` / ``load_tiny_model``); the weights layer opens such a folder as a suite
``Checkpoint`` (``engram_viz.weights.tiny_folder``), and ``data/tiny-engram`` is
``engram_viz.weights.resolve.default_checkpoint()``.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import asdict, dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import InputError

UNK_INDEX = 0  # row 0 of the small vocabulary: every raw id outside it


@dataclass(frozen=True)
class TinyLMConfig:
    """The language-model part of the tiny model (the Engram part is an :class:`EngramConfig`)."""

    vocab_rows: int  # rows of the small embedding, including the unknown row 0
    attn_heads: int = 4
    mlp_mult: int = 4
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    use_engram: bool = True

    def to_dict(self) -> dict:
        return asdict(self)


def engram_config(engram_vocab_size: int, base: str = "tiny") -> EngramConfig:
    """The ``base`` preset with its tables resized: ``engram_vocab_size`` (the start of each
    column's prime search) replaced and ``engram_num_embeddings`` recomputed from the primes."""
    raw = load_config(base).to_dict()
    raw["engram_vocab_size"] = int(engram_vocab_size)
    probe = EngramConfig(**raw)
    raw["engram_num_embeddings"] = tuple(int(r) for r in EngramLayout(probe).rows_per_layer)
    raw["name"] = base if raw == load_config(base).to_dict() else f"{base}-v{engram_vocab_size}"
    return EngramConfig(**raw)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin ``[T, head_dim / 2]`` for rotary position embeddings."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    ang = torch.arange(seq_len, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x ``[B, H, T, hd]`` rotated pairwise (first half, second half)."""
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


class Block(nn.Module):
    """A standard pre-norm transformer block on one stream ``[B, T, dim]``."""

    def __init__(self, dim: int, lm: TinyLMConfig):
        super().__init__()
        self.n_heads = lm.attn_heads
        self.attn_norm = RMSNorm(dim, lm.rms_eps)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.mlp_norm = RMSNorm(dim, lm.rms_eps)
        self.w1 = nn.Linear(dim, lm.mlp_mult * dim, bias=False)
        self.w2 = nn.Linear(lm.mlp_mult * dim, dim, bias=False)

    def forward(self, u: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, d = u.shape
        q, k, v = self.wqkv(self.attn_norm(u)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        u = u + self.wo(att.transpose(1, 2).reshape(b, t, d))
        return u + self.w2(F.gelu(self.w1(self.mlp_norm(u))))


class TrainableTable(nn.Module):
    """A float32 Engram table ``[rows, head_dim]`` for training; ``row_ids [...] -> rows [..., head_dim]``.

    Same callable interface as the suite's fp8 tables; exported with ``fp8.quantize_rows``.
    """

    def __init__(self, num_rows: int, head_dim: int, init_std: float = 0.02):
        super().__init__()
        self.num_rows, self.head_dim = num_rows, head_dim
        self.weight = nn.Parameter(torch.randn(num_rows, head_dim) * init_std)

    def forward(self, row_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(row_ids, self.weight)


class TinyEngramLM(nn.Module):
    """The tiny model. ``forward(input_ids [B, T] raw ids) -> logits [B, T, vocab_rows]`` over the
    small vocabulary; ``raw_ids[j]`` is the raw V4 token id of logit column j (column 0: unknown)."""

    def __init__(
        self,
        config: EngramConfig | str,
        token_map: np.ndarray,
        raw_ids: torch.Tensor,
        lm: TinyLMConfig,
        engrams: dict[int, Engram] | None = None,
        provenance: dict | None = None,
    ):
        super().__init__()
        self.config = load_config(config)
        self.lm = lm
        self.provenance = provenance  # the ``training`` section of its config.json (recipe, seed, sources), if known
        if len(raw_ids) != lm.vocab_rows:
            raise InputError(f"raw_ids has {len(raw_ids)} entries, expected vocab_rows={lm.vocab_rows}")
        self.token_map = np.asarray(token_map)
        raw_ids = torch.as_tensor(raw_ids, dtype=torch.int64)
        self.register_buffer("raw_ids", raw_ids, persistent=False)
        remap = torch.full((self.config.vocab_size,), UNK_INDEX, dtype=torch.int64)
        remap[raw_ids[1:]] = torch.arange(1, len(raw_ids))
        self.register_buffer("remap", remap, persistent=False)
        dim = self.config.dim
        self.embed = nn.Embedding(lm.vocab_rows, dim)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.ModuleList(Block(dim, lm) for _ in range(self.config.n_layers))
        self.norm = RMSNorm(dim, lm.rms_eps)
        self.engrams = nn.ModuleDict()
        if lm.use_engram:
            for li, layer_id in enumerate(self.config.engram_layer_ids):
                engram = (engrams or {}).get(layer_id)
                if engram is None:  # fresh, trainable: float32 table and wkv
                    table = TrainableTable(self.config.engram_num_embeddings[li], self.config.engram_head_dim, 0.02)
                    engram = Engram(self.config, layer_id, table, mode="float32", device="cpu")
                self.engrams[str(layer_id)] = engram

    def index_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Raw ids -> rows of the small vocabulary (unknown -> 0), same shape."""
        return self.remap[input_ids]

    def hash_ids(self, input_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Row ids ``[B, T, n_engram_layers, 24]`` of one full prefill (the suite's hasher)."""
        return hash_prompt(self.config, self.token_map, input_ids.cpu(), token_mask).to(input_ids.device)

    def forward(
        self,
        input_ids: torch.Tensor,
        token_mask: torch.Tensor | None = None,
        hash_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids ``[B, T]`` raw V4 ids; token_mask ``[B, T]`` (False: image position, gate shut);
        hash_ids optional precomputed ``[B, T, n_engram_layers, 24]``. Returns float32 logits
        ``[B, T, vocab_rows]``."""
        if input_ids.dim() != 2:
            raise InputError(f"input_ids must have shape [batch, seq_len], got {list(input_ids.shape)}")
        t = input_ids.shape[1]
        if len(self.engrams) and hash_ids is None:
            hash_ids = self.hash_ids(input_ids, token_mask)
        x = self.embed(self.index_ids(input_ids)).float()
        h = x.unsqueeze(2).repeat(1, 1, self.config.hc_mult, 1)
        head_dim = self.config.dim // self.lm.attn_heads
        cos, sin = rope_tables(t, head_dim, self.lm.rope_theta, x.device)
        for i, block in enumerate(self.layers):
            engram = self.engrams[str(i)] if str(i) in self.engrams else None  # noqa: SIM401 (ModuleDict has no .get)
            if engram is not None:
                li = self.config.engram_layer_ids.index(i)
                h = engram(h, hash_ids[:, :, li, :], token_mask).float()
            u = h.mean(dim=2)
            h = h + (block(u, cos, sin) - u).unsqueeze(2)
        return self.norm(h.mean(dim=2)) @ self.embed.weight.float().T

    def loss(self, input_ids: torch.Tensor, hash_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Mean next-token cross-entropy (nats) over ``input_ids [B, T+1]`` (targets in the small vocab)."""
        logits = self(input_ids[:, :-1], hash_ids=None if hash_ids is None else hash_ids[:, :-1])
        target = self.index_ids(input_ids[:, 1:])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Parameter counts by part: embedding, blocks, Engram tables, Engram projections."""
    out = {"embed": 0, "blocks": 0, "engram_table": 0, "engram_other": 0}
    for name, p in model.named_parameters():
        if name.startswith("embed."):
            out["embed"] += p.numel()
        elif name.startswith("engrams.") and ".table." in name:
            out["engram_table"] += p.numel()
        elif name.startswith("engrams."):
            out["engram_other"] += p.numel()
        else:
            out["blocks"] += p.numel()
    return out


@contextmanager
def gates_forced(model: TinyEngramLM, value: float = 0.0):
    """Within the block, every Engram gate of ``model`` is replaced by ``value`` through the
    ``engram.L{n}.gate`` hook points (0 shuts the memory)."""
    handles = [e.hook_gate.add_hook(lambda g, name: torch.full_like(g, value)) for e in model.engrams.values()]
    try:
        yield model
    finally:
        for h in handles:
            h.remove()
