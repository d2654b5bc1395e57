"""Blocks 0-13 of DeepSeek-V4.1-Flash at its widths on this CPU: time and memory per block, where the time goes.

    python benchmarks/blocks_forward.py [--tokens 32] [--threads 2] [--blocks 14] [--out FILE]

Weights are procedural (``weights.blocks_synthetic.ProceduralBlocks``: the reference's names, dtypes and
shapes at V4.1-Flash's config, ``core.blocks_config.V41_FLASH_BLOCKS``): each block's dense tensors are
drawn before it is timed (a real checkpoint reads them from disk instead); routed experts come from a
pool of 4 drawn experts (expert e gets pool[e % 4]), so no random draw is timed but every used expert is
dequantised and multiplied as a read one would be. One prompt of random token ids, a prefill, the Engram
layer 1 between blocks 0 and 1 left out (identity: its cost is the Engram path's, benchmarked elsewhere).

Printed per block: wall and CPU time, split into routed experts (fp4 dequantisation + GEMMs), the
compressor + indexer, the rest of attention, the dense fp8 weights' dequantisation, the rest (shared
expert, router, hyper-connections, norms); experts used; RSS after the block. Then the process's peak
RSS (``ru_maxrss``), and blocks 0-13 extrapolated to one 4,096-token prompt: GEMM work scaled by its
flops at the float32 GEMM rate measured in this run, every routed expert (all 384 are used at 4,096
tokens) dequantised once per block at the measured per-expert cost, the sparse attention's gathers
scaled by queries x keys. The machines here are shared: read the times as orders of magnitude.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import ClassVar

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engram_viz.core.blocks as blk
import engram_viz.core.compressed_attention as ca
import engram_viz.core.window_attention as wa
import engram_viz.weights.blocks_synthetic as bsyn
from engram_viz.core.blocks_config import V41_FLASH_BLOCKS
from engram_viz.core.compressed_attention import SharedKV
from engram_viz.core.hyper import stream0
from engram_viz.weights.synthetic import _generator

GIB = 1024**3
CLOCK: dict[str, float] = defaultdict(float)


def rss() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def timed(name: str, fn):
    def run(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            CLOCK[name] += time.perf_counter() - t

    return run


class PooledLayer(bsyn._ProceduralLayer):
    """A procedural block whose experts come from a drawn pool; its GEMMs timed by kind."""

    pool: ClassVar[dict[int, dict]] = {}

    def expert(self, e: int):
        self._counter[0] += 1
        k = e % 4
        if k not in self.pool:
            PooledLayer.pool[k] = bsyn.expert_weights(self.cfg, k, self._gen, "layers.0.")
        t, names = self.pool[k], bsyn.expert_names(k, "layers.0.")
        w = timed(
            "routed experts", lambda: [bsyn.fp4_gemm(t[names[n]], t[names[n + ".scale"]]) for n in ("w1", "w2", "w3")]
        )()
        return tuple(timed("routed experts", f) for f in w)

    def linear(self, name: str):
        if name not in self._linears:
            kind = "attn" if name.startswith("attn.") else "ffn"
            self._linears[name] = timed(f"dense fp8 dequant {kind}", super().linear)(name)
        return self._linears[name]


def gemm_rate(threads: int) -> float:
    a, b = torch.randn(512, 5120), torch.randn(2304, 5120)
    torch.nn.functional.linear(a, b)
    t = time.perf_counter()
    for _ in range(3):
        torch.nn.functional.linear(a, b)
    return 3 * 2 * 512 * 5120 * 2304 / (time.perf_counter() - t)


def extrapolate(cfg, per_expert_s: float, rate: float, attn_gather_s_per_qk: float, t: int = 4096) -> dict[str, float]:
    d, h, hd, q, o = cfg.dim, cfg.n_heads, cfg.head_dim, cfg.q_lora_rank, cfg.o_groups * cfg.o_lora_rank
    dense = t * (d * q + q * h * hd + d * hd + o * d + (h * hd // cfg.o_groups) * o + 3 * d * cfg.moe_inter_dim)
    experts = t * cfg.n_activated_experts * 3 * d * cfg.moe_inter_dim
    out = {"dense GEMMs": 2 * dense / rate, "routed expert GEMMs": 2 * experts / rate}
    out["routed expert dequant"] = cfg.n_routed_experts * per_expert_s
    out["sparse attention (window 128 + top-512)"] = t * (cfg.window_size + cfg.index_topk) * attn_gather_s_per_qk
    tc = t // 2
    out["indexer scores"] = 2 * t * tc * cfg.index_n_heads * cfg.index_head_dim / rate
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--blocks", type=int, default=14)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = V41_FLASH_BLOCKS
    lines: list[str] = []

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")

    flags = subprocess.run("lscpu", check=False, capture_output=True, text=True).stdout
    feats = sorted({f for f in ("avx512_bf16", "amx_bf16", "avx2") if f in flags})
    say(f"# python benchmarks/blocks_forward.py --tokens {args.tokens} --threads {args.threads}")
    say(
        f"# {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, CPU features {feats}, torch {torch.__version__}, "
        f"load average {Path('/proc/loadavg').read_text().split()[:3]}"
    )
    say(
        f"V4.1-Flash widths: dim {cfg.dim}, {cfg.n_heads} heads x {cfg.head_dim}, {cfg.n_routed_experts} fp4 experts of "
        f"{cfg.moe_inter_dim} (top {cfg.n_activated_experts}), window {cfg.window_size}, index top-{cfg.index_topk}; "
        f"1 prompt x {args.tokens} tokens"
    )
    rate = gemm_rate(args.threads)
    say(f"float32 GEMM rate here: {rate / 1e9:.1f} GFLOP/s")
    ca.compress = timed("compressor + indexer", ca.compress)
    ca.index_keys = timed("compressor + indexer", ca.index_keys)
    ca.choose_positions = timed("compressor + indexer", ca.choose_positions)
    ca.sparse_attend = timed("sparse attention", ca.sparse_attend)
    wa.sparse_attend = timed("sparse attention", wa.sparse_attend)
    blk.attention = timed("attention (all)", blk.attention)
    g = torch.Generator().manual_seed(0)
    table = (torch.randn(4096, cfg.dim, generator=g) * 0.12).to(torch.bfloat16)
    src = bsyn.ProceduralBlocks(cfg, lambda n: _generator(0, n), lambda ids: table[ids % 4096], "procedural V4.1-Flash")
    ids = torch.randint(0, cfg.vocab_size, (1, args.tokens), generator=g)
    h = src.embed(ids).unsqueeze(2).repeat(1, 1, cfg.hc_mult, 1)
    pre, shared = stream0(h), SharedKV()
    say("block  ratio  wall s   cpu s  experts-s  comp+idx-s  attn-rest-s  dequant-s  rest-s  experts  RSS GiB")
    totals: dict[str, float] = defaultdict(float)
    per_expert = []
    for n in range(args.blocks):
        layer = PooledLayer(cfg, n, src._gen, src._experts)  # drawn before the clock starts
        CLOCK.clear()
        before = src.experts_read
        w0, c0 = time.perf_counter(), time.process_time()
        with torch.no_grad():
            h, pre = blk.block(h, pre, layer, cfg, n, shared)
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0
        del layer
        used = src.experts_read - before
        dq_a, dq_f = CLOCK["dense fp8 dequant attn"], CLOCK["dense fp8 dequant ffn"]
        attn_rest = CLOCK["attention (all)"] - CLOCK["compressor + indexer"] - dq_a
        rest = wall - CLOCK["routed experts"] - CLOCK["attention (all)"] - dq_f
        say(
            f"{n:5d}  {cfg.ratio(n):5d}  {wall:6.1f}  {cpu:6.1f}  {CLOCK['routed experts']:9.1f}  "
            f"{CLOCK['compressor + indexer']:10.2f}  {attn_rest:11.2f}  {dq_a + dq_f:9.2f}  {rest:6.2f}  "
            f"{used:7d}  {rss() / GIB:7.2f}"
        )
        for k in ("routed experts", "compressor + indexer", "attention (all)", "sparse attention"):
            totals[k] += CLOCK[k]
        totals["dequant"] += dq_a + dq_f
        totals["attn dequant"] += dq_a
        totals["wall"] += wall
        per_expert.append(CLOCK["routed experts"] / max(used, 1))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    share = {k: totals[k] / totals["wall"] for k in ("routed experts", "compressor + indexer")}
    attn = totals["attention (all)"] - totals["compressor + indexer"] - totals["attn dequant"]
    share["attention without compressor/indexer"] = attn / totals["wall"]
    share["dense fp8 dequant"] = totals["dequant"] / totals["wall"]
    say(
        f"total {totals['wall']:.1f} s wall over {args.blocks} blocks; shares: "
        + ", ".join(f"{k} {v:.0%}" for k, v in share.items())
    )
    say(f"peak RSS (ru_maxrss) {peak / GIB:.2f} GiB while the {args.blocks} blocks ran one at a time")
    qk = totals["sparse attention"] / (args.blocks * args.tokens * (cfg.window_size + cfg.index_topk))
    est = extrapolate(cfg, sorted(per_expert)[len(per_expert) // 2], rate, qk)
    say(
        "blocks 0-13 for one 4,096-token prompt, extrapolated per block: "
        + ", ".join(f"{k} {v:.0f} s" for k, v in est.items())
        + f"; total about {sum(est.values()) * 14 / 60:.0f} min for 14 blocks on this CPU"
    )


if __name__ == "__main__":
    main()
