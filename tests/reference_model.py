"""A small model written with the reference's structure (seed: ``inference/model.py``), for the attach tests.

Nothing here imports the suite's Engram module: ``Linear`` (fp8 weight + e8m0 block scale, the
activation-quantised GEMM), ``ParallelEngramEmbedding`` (row-sharded over ranks, zero the rows of
other ranks, all-reduce) and ``Engram`` follow the seed line for line at small dimensions; the
hash is the suite's ``NgramHasher`` (tested against the reference elsewhere); the blocks between
Engram layers are a simple deterministic mix so later layers see different streams.

Run on its own under torchrun to produce rank-0 traces::

    python -m torch.distributed.run --standalone --nproc_per_node 2 tests/reference_model.py OUT_DIR
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from engram_viz.config import IMAGE, IMAGE_END, IMAGE_NEWLINE, IMAGE_START, TEXT, EngramConfig, load_config
from engram_viz.core import fp8
from engram_viz.core.hashing import NgramHasher
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer

world_size = 1
rank = 0
fp8_block_size = 32
scale_dtype = torch.float8_e8m0fnu


class Linear(nn.Module):
    """fp8 weight ``[out, in]`` with 32 x 32 e8m0 block scales; activations quantised per 32 values."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(
            torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        sn, sk = math.ceil(out_features / fp8_block_size), math.ceil(in_features / fp8_block_size)
        self.scale = nn.Parameter(torch.empty(sn, sk, dtype=scale_dtype), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8.fp8_linear(x, self.weight, self.scale)


class ParallelEngramEmbedding(nn.Module):
    """The n-gram hash table, sharded over its rows. Stays fp8: rows are dequantized on lookup."""

    def __init__(self, num_embeddings: int, dim: int):
        super().__init__()
        self.num_embeddings = num_embeddings
        self.dim = dim
        self.part_num_embeddings = (num_embeddings + world_size - 1) // world_size
        self.vocab_start_idx = rank * self.part_num_embeddings
        self.vocab_end_idx = self.vocab_start_idx + self.part_num_embeddings
        self.block_size = fp8_block_size
        self.weight = nn.Parameter(
            torch.empty(self.part_num_embeddings, dim, dtype=torch.float8_e4m3fn), requires_grad=False
        )
        self.scale = nn.Parameter(
            torch.empty(self.part_num_embeddings, dim // self.block_size, dtype=scale_dtype), requires_grad=False
        )

    def forward(self, indices: torch.Tensor) -> torch.Tensor:
        mask = (indices < self.vocab_start_idx) | (indices >= self.vocab_end_idx)
        local_indices = indices - self.vocab_start_idx
        local_indices = local_indices.masked_fill(mask, 0)
        values = F.embedding(local_indices, self.weight)
        scales = F.embedding(local_indices, self.scale)
        values = values.float().unflatten(-1, (-1, self.block_size)) * scales.float().unsqueeze(-1)
        values = values.flatten(-2).to(torch.bfloat16)
        values = values.masked_fill(mask.unsqueeze(-1), 0)
        if world_size > 1:
            dist.all_reduce(values)
        return values


class Engram(nn.Module):
    """The seed's Engram, with ``args``/``layout`` replaced by an EngramConfig."""

    def __init__(self, config: EngramConfig, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.layer_hash_index = config.engram_layer_ids.index(layer_id)
        self.dim = config.dim
        self.hc_mult = config.hc_mult
        self.clamp_value = 1e-6
        self.embed = ParallelEngramEmbedding(
            config.engram_num_embeddings[self.layer_hash_index], config.engram_head_dim
        )
        n_hash_cols = (config.engram_max_ngram_size - 1) * config.engram_n_heads
        self.wkv = Linear(n_hash_cols * config.engram_head_dim, config.dim * (config.hc_mult + 1))
        self.eps = config.norm_eps
        self.q_weight = nn.Parameter(torch.ones(config.hc_mult, config.dim))
        self.k_weight = nn.Parameter(torch.ones(config.hc_mult, config.dim))

    def forward(self, x: torch.Tensor, hash_ids: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
        kv = self.wkv(self.embed(hash_ids).flatten(-2))
        key, value = kv.split([self.hc_mult * self.dim, self.dim], dim=-1)
        key = key.float().unflatten(-1, (self.hc_mult, self.dim))
        weight = self.q_weight.float() * self.k_weight.float()
        h, eps = x.float(), self.eps
        rstd = torch.rsqrt(h.square().mean(-1) + eps) * torch.rsqrt(key.square().mean(-1) + eps)
        dot = (h * weight * key).sum(-1) * rstd * self.dim**-0.5
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(self.clamp_value).sqrt(), dot))
        if token_mask is not None:
            gate = gate.masked_fill(~token_mask.unsqueeze(-1), 0)
        return (h + gate.unsqueeze(-1) * value.float().unsqueeze(-2)).to(x.dtype)


class Block(nn.Module):
    """Stand-in for a transformer block: a fixed causal mix that changes the streams (a running mean
    over earlier positions stands in for attention, so a text position reads what came before it)."""

    def __init__(self, layer_id: int, config: EngramConfig):
        super().__init__()
        self.engram = Engram(config, layer_id) if layer_id in config.engram_layer_ids else None
        self.mix = nn.Parameter(torch.randn(config.dim, config.dim) * config.dim**-0.5, requires_grad=False)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        m = h.float().mean(2, keepdim=True)  # [B, T, 1, dim]
        past = m.cumsum(1) / torch.arange(1, m.shape[1] + 1, dtype=m.dtype).view(1, -1, 1, 1)
        return (h.float() + torch.tanh(past @ self.mix)).to(h.dtype)


@dataclass(frozen=True)
class ReferenceLayout:
    """The reference's ``EngramLayout`` fields, exposed on the Transformer as ``engram_layout``."""

    max_ngram_size: int
    layer_ids: tuple[int, ...]
    num_embeddings: tuple[int, ...]
    primes: tuple[tuple[tuple[int, ...], ...], ...]
    n_heads: int
    head_dim: int

    @classmethod
    def from_config(cls, config: EngramConfig) -> ReferenceLayout:
        primes = tuple(tuple(tuple(int(p) for p in o) for o in li) for li in EngramLayout(config).primes)
        return cls(
            config.engram_max_ngram_size,
            tuple(config.engram_layer_ids),
            tuple(config.engram_num_embeddings),
            primes,
            config.engram_n_heads,
            config.engram_head_dim,
        )


@dataclass
class ImageInput:
    """One image of one prompt, as the reference hands it to ``merge_image_embeddings``: where its
    span starts, the span's token types, and (standing in for ViT + aligner) its features [n_image, dim]."""

    start: int
    types: torch.Tensor
    features: torch.Tensor


class Transformer(nn.Module):
    """``forward(input_ids [B, T], start_pos, token_types)`` as the seed: hash, embed, hc copies, layers."""

    def __init__(self, config: EngramConfig, token_map, max_seq_len: int = 256, max_batch: int = 4):
        super().__init__()
        self.hc_mult = config.hc_mult
        self.embed = nn.Embedding(config.vocab_size, config.dim, dtype=torch.bfloat16)
        self.layers = nn.ModuleList(Block(i, config) for i in range(config.n_layers))
        self.engram_hash = NgramHasher(config, token_map, max_batch=max_batch, max_seq_len=max_seq_len)
        self.engram_layout = ReferenceLayout.from_config(config)
        g = torch.Generator().manual_seed(7)  # learned span delimiters in the reference; fixed here
        self.register_buffer("image_delims", torch.randn(3, config.dim, generator=g), persistent=False)

    def merge_image_embeddings(self, images, h: torch.Tensor) -> None:
        """As the reference: IMAGE slots take the features in order, delimiters their embeddings."""
        for i, sample in enumerate(images):
            for img in sample or ():
                span = h[i, img.start : img.start + img.types.numel()]
                for k, kind in enumerate((IMAGE_START, IMAGE_END, IMAGE_NEWLINE)):
                    span[img.types == kind] = self.image_delims[k].to(h.dtype)
                span[img.types == IMAGE] = img.features.to(h.dtype)

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, start_pos: int = 0, images=None, token_types=None) -> torch.Tensor:
        image_mask = None if token_types is None else token_types >= 0
        engram_mask = None if image_mask is None else ~image_mask
        engram_hashes = self.engram_hash(input_ids, start_pos, engram_mask)
        h = self.embed(input_ids)
        if images is not None:
            assert start_pos == 0, "image spans must be prefilled in a single chunk"
            self.merge_image_embeddings(images, h)
        h = h.unsqueeze(2).repeat(1, 1, self.hc_mult, 1)
        for layer in self.layers:
            if layer.engram is not None:
                h = layer.engram(h, engram_hashes[:, :, layer.engram.layer_hash_index, :], engram_mask)
            h = layer(h)
        return h.float().mean(2)


def full_weights(config: EngramConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Deterministic weights under the checkpoint's names (whole tables, before any sharding)."""
    g = torch.Generator().manual_seed(seed)
    out = {"embed.weight": (torch.randn(config.vocab_size, config.dim, generator=g) * 0.5).to(torch.bfloat16)}
    n, k = config.dim * (config.hc_mult + 1), config.n_hash_cols * config.engram_head_dim
    for i in range(config.n_layers):
        out[f"layers.{i}.mix"] = torch.randn(config.dim, config.dim, generator=g) * config.dim**-0.5
        if i not in config.engram_layer_ids:
            continue
        rows = config.engram_num_embeddings[config.engram_layer_ids.index(i)]
        p = f"layers.{i}.engram."
        out[p + "embed.weight"], out[p + "embed.scale"] = fp8.quantize_rows(
            torch.randn(rows, config.engram_head_dim, generator=g)
        )
        out[p + "wkv.weight"], out[p + "wkv.scale"] = fp8.quantize_matrix(torch.randn(n, k, generator=g) * k**-0.5)
        out[p + "q_weight"] = (1 + 0.5 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16)
        out[p + "k_weight"] = (1 + 0.5 * torch.randn(config.hc_mult, config.dim, generator=g)).to(torch.bfloat16)
    return out


def build(config: EngramConfig | str = "tiny", seed: int = 0) -> Transformer:
    """The model for this process's (world_size, rank), its table shard cut from the full weights."""
    config = load_config(config)
    model = Transformer(config, get_tokenizer(config).token_map)
    weights = full_weights(config, seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            src = weights[name]
            if name.endswith(("embed.weight", "embed.scale")) and ".engram." in name:
                emb = model.get_submodule(name.rsplit(".", 1)[0])
                part = src[emb.vocab_start_idx : emb.vocab_end_idx]
                param.zero_()
                param[: len(part)] = part
            else:
                param.copy_(src.to(param.dtype))
    return model


def example_batch(config: EngramConfig | str = "tiny") -> tuple[torch.Tensor, torch.Tensor]:
    """Two prompts of equal length: text, and text with a 2 x 2 image span (reference span format)."""
    config = load_config(config)
    tok = get_tokenizer(config)
    a = tok.encode("Alexander the Great was a king of Macedon. He conquered Persia.")
    pre, post = tok.encode("Look at this:"), tok.encode(" It shows the Great Wall of China.")
    span = [IMAGE_START] + ([IMAGE] * 2 + [IMAGE_NEWLINE]) * 2 + [IMAGE_END]
    b_ids = pre + [config.image_token_id] * len(span) + post
    b_types = [TEXT] * len(pre) + span + [TEXT] * len(post)
    t = max(len(a), len(b_ids))
    pad = config.engram_pad_id
    ids = torch.tensor([a + [pad] * (t - len(a)), b_ids + [pad] * (t - len(b_ids))])
    types = torch.tensor([[TEXT] * t, b_types + [TEXT] * (t - len(b_types))])
    return ids, types


def example_images(config: EngramConfig | str = "tiny", seed: int = 3) -> list[list[ImageInput]]:
    """Image features for ``example_batch``'s second prompt (its 2 x 2 span), none for the first."""
    config = load_config(config)
    _, types = example_batch(config)
    span = torch.nonzero(types[1] >= 0).flatten()
    start, n = int(span[0]), len(span)
    span_types = types[1, start : start + n].clone()
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(int((span_types == IMAGE).sum()), config.dim, generator=g)
    return [[], [ImageInput(start, span_types, features)]]


def main(out_dir: str) -> None:
    """Under torchrun: every rank runs; rank 0 saves the traces, every rank its model output."""
    global world_size, rank
    from engram_viz.run.attach import attach
    from engram_viz.run.capture import force_gate

    dist.init_process_group("gloo")
    world_size, rank = dist.get_world_size(), dist.get_rank()
    out = Path(out_dir)
    model = build("tiny")
    ids, types = example_batch("tiny")
    with attach(model, "tiny", model_label="reference-structured test model") as attached:
        trace = attached.run(ids, types, names=["engram.*.dot", "engram.*.value"])
        edited = attached.run(ids, types, hooks={"engram.L3.gate": force_gate(0.0)})
        plain = model(ids, token_types=types)
        _, cache = attached.run_with_cache(ids, token_types=types, names=["engram.*.gate"])
    torch.save({"plain": plain, "captured": len(cache), "world_size": world_size}, out / f"rank{rank}.pt")
    if rank == 0:
        trace.save(out / "trace")
        edited.save(out / "edited")
    else:
        assert trace is None and edited is None
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
