"""The Engram forward at V4.1-Flash widths on the CPU: bf16-operand vs float32 wkv GEMM, side by side.

    python benchmarks/wkv_forward.py [--tokens 32] [--reps 5] [--tol-tokens 256]

One Engram layer (14: dim 5120, 4 streams, wkv 6144 -> 25600, the synthetic procedural
384,016,682-row table) built once; ``engram.gemm`` switches between ``float32`` (the float32 GEMM
on the dequantised weight: the path before the bf16 one, and the reference arithmetic transcribed
literally) and ``bf16`` (exact bf16 copies, float32 accumulation). Reps are interleaved, so machine
noise hits both alike; printed: the median forward time, tokens/s and the speed-up, for ``fp8``
mode (the reference path; the default) at B=1, T=``--tokens``.

Then the tolerance of the bf16 path on ``--tol-tokens`` tokens: against the float32 path, and both
against float64 accumulation rounded once to bf16 (the exact sum: a third summation order),
beside the CPU-vs-CUDA bounds stated in docs/engram.md. Row ids and rows are compared for identity.
Machines here are shared: read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engram_viz.core import fp8
from engram_viz.core.engram import CPU_CUDA_DOT_ATOL, CPU_CUDA_GATE_ATOL, CPU_CUDA_GATE_P99, Engram
from engram_viz.weights.synthetic import synthetic_checkpoint

LAYER = 14


def capture(engram: Engram, x, ids, sites=("hash_ids", "rows", "key", "value", "dot", "gate")) -> dict:
    seen = {}
    points = engram.hook_points()
    handles = [
        points[f"engram.L{LAYER}.{s}"].add_hook(lambda t, n: seen.__setitem__(n.split(".")[-1], t)) for s in sites
    ]
    try:
        engram(x, ids)
    finally:
        for h in handles:
            h.remove()
    return seen


def inputs(config, num_rows: int, tokens: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(1, tokens, config.hc_mult, config.dim, generator=g) * 2).to(torch.bfloat16)
    ids = torch.randint(0, num_rows, (1, tokens, config.n_hash_cols), generator=g)
    return x, ids


def bf16_order(t: torch.Tensor) -> torch.Tensor:
    """bf16 values (held in float32) -> integers in value order, so a difference counts ulps."""
    bits = t.to(torch.bfloat16).view(torch.int16).to(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFF), bits)


def compare(a: dict, b: dict) -> dict:
    """Differences of b from a: key/value bit-equal fraction and within one bf16 ulp, dot and gate."""
    kv_a = torch.cat([a["key"].flatten(-2), a["value"]], -1)
    kv_b = torch.cat([b["key"].flatten(-2), b["value"]], -1)
    gate = (a["gate"] - b["gate"]).abs().flatten()
    return {
        "kv_equal": float((kv_a == kv_b).float().mean()),
        "kv_max_ulps": int((bf16_order(kv_a) - bf16_order(kv_b)).abs().max()),  # many only near 0
        "kv_within_ulp": bool(((kv_a - kv_b).abs() <= 2.0**-7 * kv_a.abs() + 1e-6).all()),
        "dot_max": float((a["dot"] - b["dot"]).abs().max()),
        "gate_max": float(gate.max()),
        "gate_p99": float(gate.quantile(0.99)),
        "rows_identical": bool(torch.equal(a["hash_ids"], b["hash_ids"]) and torch.equal(a["rows"], b["rows"])),
    }


class Float64Wkv(torch.nn.Module):
    """The fp8-mode wkv with float64 accumulation, rounded once to bf16: the exact sum."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = weight  # Engram.device reads it
        self.w64 = weight.detach().double()

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        return (fp8.fp8_activations(a).double() @ self.w64.T).to(torch.bfloat16)


def speed(engram: Engram, x, ids, reps: int) -> dict[str, float]:
    times = {"float32": [], "bf16": []}
    with torch.no_grad():
        for gemm in times:  # warm: the bf16 weight copy, the accumulation probe, the allocator
            engram.gemm = gemm
            engram(x, ids)
        for _ in range(reps):
            for gemm, ts in times.items():
                engram.gemm = gemm
                t = time.perf_counter()
                engram(x, ids)
                ts.append(time.perf_counter() - t)
    return {k: statistics.median(v) for k, v in times.items()}


def tolerance(engram: Engram, x, ids) -> dict[str, dict]:
    seen = {}
    with torch.no_grad():
        for gemm in ("float32", "bf16"):
            engram.gemm = gemm
            seen[gemm] = capture(engram, x, ids)
        plain = engram.wkv
        engram.wkv = Float64Wkv(plain.weight)
        try:
            seen["float64"] = capture(engram, x, ids)
        finally:
            engram.wkv = plain
    return {
        "bf16 vs float32": compare(seen["float32"], seen["bf16"]),
        "float32 vs float64-accumulated": compare(seen["float64"], seen["float32"]),
        "bf16 vs float64-accumulated": compare(seen["float64"], seen["bf16"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tol-tokens", type=int, default=256, help="tokens of the tolerance comparison (0: skip)")
    ap.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared, busy machine OpenMP spin-waiting distorts both sides)",
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    t = time.perf_counter()
    ckpt = synthetic_checkpoint("v41-flash")
    weights = ckpt.layer(LAYER)
    engram = Engram.from_weights(ckpt.config, weights, mode="fp8", device="cpu")
    print(f"weights: {ckpt.label}; layer {LAYER} built in {time.perf_counter() - t:.1f} s")
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.1f}; CPU capability {torch.backends.cpu.get_cpu_capability()}\n"
    )
    x, ids = inputs(ckpt.config, weights.table.num_rows, args.tokens, seed=0)
    med = speed(engram, x, ids, args.reps)
    print(f"forward, fp8 mode, B=1 T={args.tokens}, median of {args.reps} interleaved reps:")
    for gemm, s in med.items():
        print(
            f"  gemm={gemm:<8} {s * 1e3:9.1f} ms  {args.tokens / s:8.1f} tokens/s  {med['float32'] / s:5.2f}x float32"
        )

    if args.tol_tokens:
        x, ids = inputs(ckpt.config, weights.table.num_rows, args.tol_tokens, seed=1)
        print(f"\ntolerance on {args.tol_tokens} tokens (x {args.tol_tokens * 4} gates):")
        print(
            f"  {'':<32} {'kv bit-equal':>12} {'kv <=1ulp+1e-6':>15} {'max ulps':>8} {'dot max':>9} {'gate max':>9} {'gate p99':>9} rows/ids"
        )
        for name, r in tolerance(engram, x, ids).items():
            print(
                f"  {name:<32} {r['kv_equal']:>12.5%} {r['kv_within_ulp']!s:>15} {r['kv_max_ulps']:>8} {r['dot_max']:>9.2e} "
                f"{r['gate_max']:>9.2e} {r['gate_p99']:>9.2e} {'identical' if r['rows_identical'] else 'DIFFER'}"
            )
        print(
            f"  stated CPU vs CUDA bounds (docs/engram.md): kv within one bf16 ulp, dot {CPU_CUDA_DOT_ATOL:.0e}, "
            f"gate max {CPU_CUDA_GATE_ATOL:.0e}, gate p99 {CPU_CUDA_GATE_P99:.0e}"
        )


if __name__ == "__main__":
    main()
