"""Block-0 streams at V4.1-Flash widths on this CPU: time and peak memory, next to the embedding proxy.

    python benchmarks/block0_streams.py [--prompts 8] [--tokens 128] [--threads 2] [--reps 1]

Weights are procedural (``weights.block0_synthetic.ProceduralBlock0``: the reference's names, dtypes
and shapes, V4.1-Flash widths: dim 5120, 64 heads of 512, 384 fp4 routed experts of 2304, top 6,
window 128); the token embedding is ``weights.procedural.ProceduralEmbedding`` (129,280 x 5120).
Prompts are random token ids (fixed seed), one batch of ``--prompts`` x ``--tokens``: a prefill
from position 0, as ``Pipeline(streams="block0")`` runs one batch.

Printed, in one run:

- set-up: drawing the dense block-0 tensors (fp8 GEMM weights with their e8m0 scales, ...);
- block-0 streams (``core.block0.block0_streams``) per pass: wall and CPU time, of which drawing the
  routed experts' random fp4 codes (procedural only: a real checkpoint reads each used expert's
  19 MB from disk instead; the fp4 dequantisation is counted in the block), and the experts used;
- the embedding proxy (``run.streams.embedding_streams``) on the same ids: median wall time;
- memory: resident set size (VmRSS, sampled every 5 ms) before the first pass and its peak during
  the passes, and the process's lifetime peak (``ru_maxrss``).

The machines here are shared: read the times as orders of magnitude (the CPU time is less
sensitive to other load than the wall time). Results: ``benchmarks/results/block0_streams.txt``.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import threading
import time
import zlib
from pathlib import Path
from types import SimpleNamespace
from typing import Self

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import engram_viz.weights.block0_synthetic as b0syn
from engram_viz.config import load_config
from engram_viz.core.block0 import block0_streams
from engram_viz.core.block0_config import V41_FLASH_BLOCK0
from engram_viz.run.streams import embedding_streams
from engram_viz.weights.procedural import ProceduralEmbedding

GIB = 1024**3


def rss_bytes() -> int:
    """The resident set size of this process now (``/proc/self/status`` VmRSS)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS line in /proc/self/status (Linux only)")


class PeakRSS:
    """Samples VmRSS every ``period`` seconds in a thread while the ``with`` block runs."""

    def __init__(self, period: float = 0.005):
        self.period, self.peak = period, 0
        self._stop = threading.Event()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            self._stop.wait(self.period)

    def __enter__(self) -> Self:
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


class DrawClock:
    """Wraps ``block0_synthetic.expert_weights`` (the random fp4 draw of one routed expert) to time it."""

    def __init__(self):
        self.seconds, self._fn = 0.0, b0syn.expert_weights

    def __call__(self, *args, **kwargs):
        t0 = time.perf_counter()
        try:
            return self._fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - t0


def generator(seed: int):
    return lambda name: torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: 2)")
    ap.add_argument("--reps", type=int, default=1, help="block-0 passes (default: 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg, econf = V41_FLASH_BLOCK0, load_config("v41-flash")
    embed = ProceduralEmbedding(econf.vocab_size, econf.dim, args.seed)
    proxy_ckpt = SimpleNamespace(config=econf, embed=embed, label=embed.label, synthetic=True)
    ids = torch.randint(0, cfg.vocab_size, (args.prompts, args.tokens), generator=torch.Generator().manual_seed(1))
    print(
        f"block-0 streams, V4.1-Flash widths (dim {cfg.dim}, {cfg.n_heads} heads x {cfg.head_dim}, "
        f"{cfg.n_routed_experts} fp4 experts of {cfg.moe_inter_dim}, top {cfg.n_activated_experts}), "
        f"B={args.prompts} x T={args.tokens}, {args.threads} torch threads, torch {torch.__version__}"
    )
    rss0 = rss_bytes()
    t0 = time.perf_counter()
    src = b0syn.ProceduralBlock0(cfg, generator(args.seed), embed.rows, "procedural V4.1-Flash block 0")
    print(f"set-up (dense block-0 tensors drawn): {time.perf_counter() - t0:.1f} s, RSS {rss_bytes() / GIB:.2f} GiB")

    clock = DrawClock()
    b0syn.expert_weights = clock
    rss_before = rss_bytes()
    with PeakRSS() as peak:
        for rep in range(args.reps):
            clock.seconds, src.experts_read = 0.0, 0
            t0, c0 = time.perf_counter(), time.process_time()
            x = block0_streams(src, ids)
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            print(
                f"block-0 pass {rep + 1}: {wall:.1f} s wall ({cpu:.1f} s CPU, all threads), of which "
                f"{clock.seconds:.1f} s wall drawing random fp4 "
                f"experts -> {wall - clock.seconds:.1f} s block 0 ({src.experts_read} routed experts used); "
                f"streams {list(x.shape)} {x.dtype}"
            )
    b0syn.expert_weights = clock._fn
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        embedding_streams(proxy_ckpt, ids)
        times.append(time.perf_counter() - t0)
    print(f"embedding proxy (embedding_streams, same ids): {statistics.median(times) * 1e3:.1f} ms median of 5")
    print(
        f"memory: RSS {rss0 / GIB:.2f} GiB at start, {rss_before / GIB:.2f} GiB after set-up, peak during the "
        f"block-0 passes {peak.peak / GIB:.2f} GiB (+{(peak.peak - rss_before) / GIB:.2f} GiB); process peak "
        f"(ru_maxrss) {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB:.2f} GiB"
    )


if __name__ == "__main__":
    main()
