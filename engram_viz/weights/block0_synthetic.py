"""Synthetic block-0 weights: the reference's names, dtypes and shapes, random values, labelled SYNTHETIC.

- :func:`block0_tensors` draws every tensor, each by name (its own seed, so values do not depend on which
  others are drawn): fp8 GEMM weights ~ N(0, 1 / in) quantised with 32 x 32 e8m0 block scales,
  fp4 expert weights as uniform e2m1 codes with per-32 e8m0 scales of about ``1 / (3 sqrt(in))``,
  RMSNorm weights ~ 1 + 0.1 N(0, 1), hyper-connection projections ~ N(0, 1 / (hc dim)) and
  biases ~ 0.5 N(0, 1), attention sinks ~ N(0, 1), router weights ~ N(0, 1 / dim), its biases
  ~ 0.1 N(0, 1).
- :func:`add_block0` writes every block-0 tensor into one more shard of an hf-layout folder and adds
  the block-0 fields to its ``config.json``; ``write_synthetic_checkpoint(..., block0=cfg)`` calls it.
- :class:`ProceduralBlock0` serves the same tensors without writing any (dense ones drawn once, each
  routed expert drawn when asked for): V4.1-Flash widths for benchmarks.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from safetensors.torch import save_file

from engram_viz.core import fp4, fp8
from engram_viz.core.block0_config import PREFIX, Block0Config, dense_tensors, expert_names, expert_tensors
from engram_viz.weights.block0_reader import fp4_gemm, fp8_gemm
from engram_viz.weights.index import INDEX_FILE

GeneratorFn = Callable[[str], torch.Generator]  # tensor name -> its own generator
BLOCK0_SHARD = "model-block0.safetensors"


def _fp4_weight(shape: tuple[int, int], g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Uniform random e2m1 codes ``[out, in / 2]`` (float4_e2m1fn_x2) and e8m0 scales ``[out, in / 32]``."""
    out, k = shape
    codes = torch.randint(0, 256, (out, k // 2), dtype=torch.uint8, generator=g)
    exp = round(math.log2(1 / (3 * math.sqrt(k))))  # mean |e2m1| is ~2.1: rows of norm ~ 1
    jitter = torch.randint(-1, 2, (out, k // fp4.FP4_BLOCK), generator=g)
    scale = (127 + exp + jitter).to(torch.uint8).view(torch.float8_e8m0fnu)
    return codes.view(torch.float4_e2m1fn_x2), scale


def _dense(name: str, dtype: str, shape: tuple[int, ...], cfg: Block0Config, g: torch.Generator) -> torch.Tensor:
    short = name.split(".", 2)[2] if name.startswith("layers.") else name  # relative to its block
    if dtype == "F8_E8M0":
        raise AssertionError("scales are drawn with their weights")
    if short.endswith("norm.weight"):
        return (1 + 0.1 * torch.randn(shape, generator=g)).to(torch.bfloat16)
    if short.startswith("hc_"):
        if short.endswith("_fn"):
            return torch.randn(shape, generator=g) / math.sqrt(shape[1])
        return 0.5 * torch.randn(shape, generator=g) + (0.5 if short.endswith("_scale") else 0.0)
    if short == "attn.attn_sink":
        return torch.randn(shape, generator=g)
    if short.startswith("ffn.gate.bias"):
        return 0.1 * torch.randn(shape, generator=g)
    # bf16 matrices: wo_a [G * o_lora, H * D / G], the router [E, dim]
    return (torch.randn(shape, generator=g) / math.sqrt(shape[1])).to(torch.bfloat16)


def block0_tensors(
    cfg: Block0Config, gen: GeneratorFn, experts: bool = True, spec: dict | None = None, prefix: str = PREFIX
) -> dict[str, torch.Tensor]:
    """Every block-0 tensor (routed experts too unless ``experts=False``) by checkpoint name; ``spec``
    (name -> (dtype, shape)) and ``prefix`` draw another block's the same way."""
    out: dict[str, torch.Tensor] = {}
    for name, (dtype, shape) in (spec or dense_tensors(cfg)).items():
        if name.endswith(".scale"):
            continue
        if dtype == "F8_E4M3":
            w = torch.randn(shape, generator=gen(name)) / math.sqrt(shape[1])
            out[name], out[name.removesuffix(".weight") + ".scale"] = fp8.quantize_matrix(w)
        else:
            out[name] = _dense(name, dtype, shape, cfg, gen(name))
    for e in range(cfg.n_routed_experts if experts else 0):
        out.update(expert_weights(cfg, e, gen, prefix))
    return out


def expert_weights(cfg: Block0Config, e: int, gen: GeneratorFn, prefix: str = PREFIX) -> dict[str, torch.Tensor]:
    """Routed expert ``e``'s fp4 weights and e8m0 scales by checkpoint name."""
    names, specs = expert_names(e, prefix), expert_tensors(cfg, e, prefix)
    out = {}
    for k in ("w1", "w2", "w3"):
        out[names[k]], out[names[k + ".scale"]] = _fp4_weight(specs[names[k]][1], gen(names[k]))
    return out


def add_block0(folder: str | Path, cfg: Block0Config, gen: GeneratorFn, metadata: dict[str, str] | None = None) -> Path:
    """Write block 0 into ``folder/model-block0.safetensors`` of an hf-layout checkpoint folder, list
    it in the index and put the block-0 fields into ``config.json`` (for folders being built; not atomic)."""
    folder = Path(folder)
    tensors = block0_tensors(cfg, gen)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / BLOCK0_SHARD), metadata=metadata or {})
    index = json.loads((folder / INDEX_FILE).read_text())
    index["weight_map"].update(dict.fromkeys(tensors, BLOCK0_SHARD))
    (folder / INDEX_FILE).write_text(json.dumps(index, indent=2))
    config = json.loads((folder / "config.json").read_text())
    fields = {
        k: v
        for k, v in cfg.to_dict().items()
        if k not in ("compress_ratio", "vocab_size", "dim", "hc_mult", "norm_eps")
    }
    config.update(fields, compress_ratios=[cfg.compress_ratio])
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return folder / BLOCK0_SHARD


class ProceduralBlock0:
    """A ``core.block0.Block0Source`` drawing its tensors (dense once, experts on each request): no disk."""

    def __init__(self, cfg: Block0Config, gen: GeneratorFn, embed: Callable[[torch.Tensor], torch.Tensor], label: str):
        self.config, self._gen, self._embed, self.label = cfg, gen, embed, label
        self.synthetic = True
        self._dense = block0_tensors(cfg, gen, experts=False)
        self._linears = {}
        self.experts_read = 0

    def tensor(self, name: str) -> torch.Tensor:
        return self._dense[PREFIX + name]

    def linear(self, name: str):
        if name not in self._linears:
            self._linears[name] = fp8_gemm(self._dense[f"{PREFIX}{name}.weight"], self._dense[f"{PREFIX}{name}.scale"])
        return self._linears[name]

    def expert(self, e: int):
        self.experts_read += 1
        t, n = expert_weights(self.config, e, self._gen), expert_names(e)
        w1, w2, w3 = (fp4_gemm(t[n[k]], t[n[k + ".scale"]]) for k in ("w1", "w2", "w3"))
        return w1, w2, w3

    def embed(self, raw_ids: torch.Tensor) -> torch.Tensor:
        return self._embed(raw_ids)
