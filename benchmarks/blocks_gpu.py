"""The blocks before Engram layer 14 (blocks 0-13 of V4.1-Flash) on a device, beside the H200 roofline.

    python benchmarks/blocks_gpu.py                # CUDA: checks at small widths, then 14 blocks x 4,096 tokens timed
    python benchmarks/blocks_gpu.py --dry-run      # no CUDA: the same on the CPU, full widths for blocks 0 and 2 x 2 tokens

1. Agreement at small widths with V4.1-Flash's layer structure (14 blocks: 2 window-only, 12 compressed 2-to-1,
   kv sources 2 and 8, index sources 2 and 8, Engram layers 1 and 14): the streams entering layer 14 on the
   device vs the CPU (both ``core.blocks``, the Engram layer 1 left out), 300 tokens: largest difference
   in bf16 steps and the share of values that are bit-equal.
2. Full widths, procedural weights (``weights.blocks_synthetic``) resident on the device (one window block
   and one compressed block drawn on the host and shared by all 14 blocks; the routed experts from a pool
   of 8, each use dequantised on the device as a read one would be): two prefills of ``--tokens`` tokens,
   the first with the dense fp8 dequantisation (cold), the second warm, per block, beside the roofline of
   the path this port takes (GEMMs in float32 on dequantised weights: CUDA-core FLOP rate) and the bound of
   reading every weight once at the HBM bandwidth.

Exit status 0 when each block, run alone on the device from the CPU's own input, keeps 99% of its outputs within
one bf16 step of the CPU's - on an index source (2, 8) at the queries whose top-k sets agree, where the queries
whose sets differ must differ by ties: every position only one side chose scores within one bf16 step of the
CPU's k-th best score of that query - (the chained difference after 14 blocks is printed, not judged: rounding differences
grow through random blocks, and a flipped expert or top-k choice moves whole rows), and the full-width streams
are finite.
The dry run compares the CPU with itself (it checks the script and the shapes, not a device).
"""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # the small-width config the tests use

from blocks_kit import SMALL_V41

import engram_viz.core.compressed_attention as ca
from engram_viz.core.blocks import block
from engram_viz.core.blocks_config import V41_FLASH_BLOCKS, BlocksConfig
from engram_viz.core.compressed_attention import SharedKV
from engram_viz.core.hyper import stream0
from engram_viz.weights.block0_reader import fp4_gemm, fp8_gemm
from engram_viz.weights.block0_synthetic import expert_weights
from engram_viz.weights.blocks_synthetic import drawn_block
from engram_viz.weights.synthetic import _generator

PEAK_BW = 4.8e12  # bytes/s, H200 HBM3e
PEAK_FP32 = 67e12  # FLOP/s, CUDA cores (the float32 GEMMs of this port)
PEAK_BF16 = 989e12  # FLOP/s, dense bf16 tensor cores (what a bf16-GEMM port could reach)
POOL = 8


class DeviceLayer:
    """Block ``n``'s tensors on ``device`` from a drawn template (a ``core.blocks.LayerSource``)."""

    def __init__(self, template: dict[str, torch.Tensor], pool: list[dict[str, torch.Tensor]], device):
        self.t, self.pool, self.device = template, pool, device
        self._linears: dict = {}
        self.experts = 0

    def has(self, name: str) -> bool:
        return name in self.t

    def tensor(self, name: str) -> torch.Tensor:
        return self.t[name]

    def linear(self, name: str):
        if name not in self._linears:
            self._linears[name] = fp8_gemm(self.t[name + ".weight"], self.t[name + ".scale"])
        return self._linears[name]

    def expert(self, e: int):
        self.experts += 1
        w = self.pool[e % len(self.pool)]
        return tuple(fp4_gemm(w[k], w[k + ".scale"]) for k in ("w1", "w2", "w3"))


def templates(cfg: BlocksConfig, device) -> tuple[dict, dict, list]:
    """(window block, compressed source block, expert pool), drawn on the host, moved to ``device``."""

    def moved(n: int) -> dict[str, torch.Tensor]:
        p = f"layers.{n}."
        return {
            k.removeprefix(p): v.to(device) for k, v in drawn_block(cfg, n, lambda s: _generator(0, s), False).items()
        }

    src = cfg.kv_source_layers[0]
    pool = []
    for e in range(POOL):
        w = expert_weights(cfg, e, lambda s: _generator(0, s), "layers.0.")
        pool.append(
            {
                k.split(f"experts.{e}.")[1].removesuffix(".weight"): v.view(torch.uint8).to(device)
                if v.dtype != torch.float8_e8m0fnu
                else v.to(device)
                for k, v in w.items()
            }
        )
    return moved(0), moved(src), pool


def layers(cfg: BlocksConfig, device, n_blocks: int) -> list[DeviceLayer]:
    window, compressed, pool = templates(cfg, device)
    return [DeviceLayer(compressed if cfg.ratio(n) else window, pool, device) for n in range(n_blocks)]


def prefix(
    cfg, ls: list[DeviceLayer], ids: torch.Tensor, embed: torch.Tensor, sync, numbers: list[int] | None = None
) -> tuple[torch.Tensor, list[float]]:
    """Blocks ``numbers`` (default 0 .. len(ls) - 1) in turn on ``ids`` (Engram layers left out): final streams,
    seconds per block."""
    h = embed[ids % embed.shape[0]].unsqueeze(2).repeat(1, 1, cfg.hc_mult, 1)
    pre, shared, times = stream0(h), SharedKV(), []
    with torch.no_grad():
        for n, lw in zip(numbers or range(len(ls)), ls, strict=True):
            sync()
            t = time.perf_counter()
            h, pre = block(h, pre, lw, cfg, n, shared)
            sync()
            times.append(time.perf_counter() - t)
    return h, times


def roofline(cfg: BlocksConfig, n: int, tokens: int) -> tuple[float, float]:
    """(FLOP-bound s at the float32 rate, memory-bound s reading every weight once) for block n."""
    d, h, hd, q, o, inter = (
        cfg.dim,
        cfg.n_heads,
        cfg.head_dim,
        cfg.q_lora_rank,
        cfg.o_groups * cfg.o_lora_rank,
        cfg.moe_inter_dim,
    )
    macs = tokens * (d * q + q * h * hd + d * hd + o * d + (h * hd // cfg.o_groups) * o + 3 * d * inter)
    macs += tokens * cfg.n_activated_experts * 3 * d * inter
    keys = min(tokens, cfg.window_size) + (min(cfg.index_topk, tokens // cfg.ratio(n)) if cfg.ratio(n) else 0)
    macs += 2 * tokens * h * hd * keys
    if cfg.ratio(n):
        macs += tokens * (tokens // cfg.ratio(n)) * cfg.index_n_heads * cfg.index_head_dim + 2 * tokens * d * hd
    dense = d * q + q * h * hd + d * hd + o * d + 3 * d * inter  # fp8: a byte each
    wo_a = (h * hd // cfg.o_groups) * o * 2
    experts = min(cfg.n_routed_experts, tokens * cfg.n_activated_experts) * 3 * d * inter // 2  # fp4
    return 2 * macs / PEAK_FP32, (dense + wo_a + experts) / PEAK_BW


def cfg_first_compressed() -> int:
    return V41_FLASH_BLOCKS.kv_source_layers[0]


def _steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a - b| in bf16 steps of b (a floor of 2**-8 of the row's largest value where b is near 0)."""
    a, b = a.float().cpu(), b.float().cpu()
    return (a - b).abs() / (torch.maximum(b.abs(), b.abs().amax(-1, keepdim=True) * 2**-8) * 2**-7)


def _moved(shared: SharedKV, device) -> SharedKV:
    return SharedKV(*(None if t is None else t.to(device) for t in (shared.compress_kv, shared.index_k, shared.chosen)))


def chosen_differences(dev: torch.Tensor, cpu: torch.Tensor, cpu_scores: torch.Tensor) -> tuple[torch.Tensor, float]:
    """(queries ``[T]`` whose chosen compressed positions differ between the device and the CPU, the largest
    distance of a position chosen by one side only from the CPU's k-th best score of its query, in bf16
    steps of that score: 0 when every difference is a tie broken the other way)."""
    dev, cpu = dev[0].cpu(), cpu[0]
    differ = (dev != cpu).any(-1)
    gap = 0.0
    for t in differ.nonzero().flatten().tolist():
        s, mine, theirs = cpu_scores[0, t], set(cpu[t].tolist()) - {-1}, set(dev[t].tolist()) - {-1}
        kth = s[sorted(mine)].min()
        swapped = torch.tensor(sorted(mine ^ theirs))
        gap = max(gap, float((s[swapped] - kth).abs().max() / (kth.abs() * 2**-7).clamp_min(2**-133)))
    return differ, gap


def agreement(device, tokens: int) -> tuple[tuple[float, float], list[dict[str, float]]]:
    """(chained: largest steps and bit-equal share of the streams entering layer 14 after every block ran on
    its own device; per block, each block run on the device from the CPU's own input (streams, pre mix and
    shared compressed KV) against the CPU's output: largest steps, share within one step and bit-equal, and on
    an index source the queries whose top-k sets differ, the share within one step at the other positions and
    the tie gap of :func:`chosen_differences`)."""
    cfg = SMALL_V41
    ls_dev, ls_cpu = layers(cfg, device, cfg.n_blocks), layers(cfg, "cpu", cfg.n_blocks)
    g = torch.Generator().manual_seed(1)
    embed = (torch.randn(4096, cfg.dim, generator=g) * 0.5).to(torch.bfloat16)
    ids = torch.randint(0, 129280, (1, tokens), generator=g)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    h_dev, _ = prefix(cfg, ls_dev, ids.to(device), embed.to(device), sync)
    h = embed[ids % embed.shape[0]].unsqueeze(2).repeat(1, 1, cfg.hc_mult, 1)
    pre, shared, per_block, scores = stream0(h), SharedKV(), [], []
    with torch.no_grad(), scores_captured(scores):
        for n in range(cfg.n_blocks):
            forced = _moved(shared, device)
            scores.clear()
            out_dev, _ = block(h.to(device), pre.to(device), ls_dev[n], cfg, n, forced)
            h, pre = block(h, pre, ls_cpu[n], cfg, n, shared)
            full = _steps(out_dev, h)
            st = full.flatten(2).amax(-1)[0]  # [T]: the worst value of each position
            row = {"max": float(st.max()), "within": float((full <= 1).float().mean())}
            row["equal"] = float((out_dev.cpu() == h).float().mean())
            if scores:  # an index source: [device scores, CPU scores]
                differ, row["gap"] = chosen_differences(forced.chosen, shared.chosen, scores[-1])
                row["differ"], row["within_agreed"] = int(differ.sum()), float((st[~differ] <= 1).float().mean())
            per_block.append(row)
    st = _steps(h_dev, h)
    return (float(st.max()), float((h_dev.cpu() == h).float().mean())), per_block


@contextmanager
def scores_captured(into: list):
    """While open, every indexer call appends its full score matrix ``[B, T, Tc]`` (float32, on the CPU) to ``into``."""
    choose = ca.choose_positions

    def capturing(x, qr, index_k, w, wq_b, rot, cfg, ratio):
        q, weights = ca.index_queries(x, qr, w, wq_b, rot, cfg)
        into.append(ca.index_scores(q, weights, index_k, 0, x.shape[1], ratio)[0].float().cpu())
        return choose(x, qr, index_k, w, wq_b, rot, cfg, ratio)

    ca.choose_positions = capturing
    try:
        yield
    finally:
        ca.choose_positions = choose


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--blocks", type=int, default=14)
    p.add_argument(
        "--dry-run", action="store_true", help="no CUDA: the CPU stands in; full widths for blocks 0 and 2 x 2 tokens"
    )
    args = p.parse_args()
    cuda = torch.cuda.is_available() and not args.dry_run
    device = torch.device("cuda" if cuda else "cpu")
    tokens = args.tokens if cuda else 2
    numbers = list(range(args.blocks)) if cuda else [0, cfg_first_compressed()]  # dry run: a window and a source block
    name = torch.cuda.get_device_name() if cuda else "CPU (dry run)"
    print(f"blocks before Engram layer 14 on {name}, torch {torch.__version__}")
    t = time.perf_counter()
    small_tokens = 300 if cuda else 40  # past 2 * index_topk = 32 either way
    (steps, equal), per_block = agreement(device, small_tokens)
    # each block alone: rounding, not a different formula; on an index source, top-k ties broken the other way
    # (the swapped positions score within one bf16 step of the k-th) may move whole rows, so it is judged at the
    # positions whose chosen sets agree
    ok = all(r.get("within_agreed", r["within"]) >= 0.99 and r.get("gap", 0.0) <= 1.0 for r in per_block)
    print(
        f"1. small widths, V4.1 layer structure, 14 blocks x {small_tokens} tokens, {device} vs CPU "
        f"({time.perf_counter() - t:.1f} s)\n   each block alone from the CPU's input (streams, pre mix, shared KV):"
    )
    for n, r in enumerate(per_block):
        line = f"   block {n:2d}: max {r['max']:9.2f} bf16 steps, {r['within']:.3%} within one step, {r['equal']:.2%} bit-equal"
        if "differ" in r:
            line += (
                f"; top-k sets differ at {r['differ']} of {small_tokens} queries, swapped positions within "
                f"{r['gap']:.2f} bf16 steps of the k-th score (0: ties), {r['within_agreed']:.3%} within one step elsewhere"
            )
        print(line)
    print(
        f"   chained (each device on its own streams): streams entering layer 14 max {steps:.2f} bf16 steps, "
        f"{equal:.2%} bit-equal -> {'OK' if ok else 'FAIL'} (criterion: every block alone >= 99% within one step, "
        "on index sources at the queries whose top-k sets agree, the others ties within one bf16 step)"
    )
    cfg = V41_FLASH_BLOCKS
    t = time.perf_counter()
    every = layers(cfg, device, max(numbers) + 1)  # the templates drawn once
    ls = [every[n] for n in numbers]
    print(
        f"2. full widths: block templates + {POOL} pooled experts drawn and moved in {time.perf_counter() - t:.1f} s; "
        f"1 prompt x {tokens} tokens, blocks {', '.join(map(str, numbers)) if len(numbers) < 5 else f'{numbers[0]}-{numbers[-1]}'}, weights resident on {device}"
    )
    g = torch.Generator().manual_seed(0)
    embed = (torch.randn(4096, cfg.dim, generator=g) * 0.12).to(torch.bfloat16).to(device)
    ids = torch.randint(0, cfg.vocab_size, (1, tokens), generator=g).to(device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    h, cold = prefix(cfg, ls, ids, embed, sync, numbers)
    warm = prefix(cfg, ls, ids, embed, sync, numbers)[1] if cuda else cold  # the dry run passes once
    assert bool(torch.isfinite(h.float()).all())
    print("   block ratio   cold s   warm s  FLOP-bound s  mem-bound s  warm/bound")
    total_bound = 0.0
    for i, n in enumerate(numbers):
        fb, mb = roofline(cfg, n, tokens)
        total_bound += max(fb, mb)
        print(
            f"   {n:5d} {cfg.ratio(n):5d} {cold[i]:8.3f} {warm[i]:8.3f} {fb:13.4f} {mb:12.5f} {warm[i] / max(fb, mb):10.1f}x"
        )
    print(
        f"   total: cold {sum(cold):.2f} s, warm {sum(warm):.2f} s for {len(numbers)} blocks; roofline {total_bound:.2f} s "
        f"(float32 {PEAK_FP32 / 1e12:.0f} TFLOP/s, {PEAK_BW / 1e12:.1f} TB/s; bf16 tensor cores would lower the GEMM bound "
        f"{PEAK_BF16 / PEAK_FP32:.0f}x)"
    )
    if cuda:
        print(f"   peak device memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print("OK" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
