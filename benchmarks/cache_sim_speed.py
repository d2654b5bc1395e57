"""Simulation speed and memory at scale: a 10 M-token trace, then each policy over its reads.

    python benchmarks/cache_sim_speed.py [--tokens 10000000] [--sim-tokens 1000000]
                                         [--rows 16384] [--out benchmarks/results/cache_sim_speed.txt]

The corpus is the default corpus's files read again and again until ``--tokens`` tokens (so the
text repeats: hit rates of large caches are inflated, speeds and memory are not). Measured in this
one process, on one core, in order: the trace (``trace_corpus``: tokenize, hash, write the layer
files; per token, no prefill-step or per-order files), Belady's future pass over
layer 1's whole token trace (``write_future_trace``), and each policy over the first
``--sim-tokens`` tokens' reads of layer 1 (24 a token) at ``--rows`` rows, with peak RSS
(ru_maxrss) after each step. A measurement, not a test: the machine is shared (its load is printed).
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from pathlib import Path

from machine import cpu_features

from engram_viz.analysis.caches.corpus_trace import trace_corpus
from engram_viz.analysis.caches.future_access import write_future_trace
from engram_viz.analysis.caches.policies import OFFLINE, POLICIES, make_cache, trace_reader
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.config import load_config


def rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=10_000_000)
    ap.add_argument("--sim-tokens", type=int, default=1_000_000)
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--out", default="benchmarks/results/cache_sim_speed.txt")
    args = ap.parse_args()
    lines = [f"CPU: {cpu_features()}; load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"]

    def say(text: str) -> None:
        lines.append(text)
        print(text, flush=True)

    cfg = load_config("v41-flash")
    files = default_corpus_files() * 20
    t = time.perf_counter()
    trace = trace_corpus(files, cfg, max_tokens=args.tokens, orders=False, progress=False)
    dt = time.perf_counter() - t
    size_gb = sum(p.stat().st_size for p in trace.folder.glob("L*")) / 1e9
    say(
        f"trace: {trace.tokens:,} tokens in {dt:.1f} s ({trace.tokens / dt:,.0f} tokens/s), {size_gb:.2f} GB of "
        f"trace files; peak RSS {rss_mib():,.0f} MiB"
    )
    try:
        src = trace.path(1)
        n = trace.accesses(1)
        t = time.perf_counter()
        future = write_future_trace(src, Path(str(src) + ".future"))
        dt = time.perf_counter() - t
        say(
            f"Belady's future pass over layer 1: {n:,} reads in {dt:.1f} s ({n / dt:,.0f} /s); peak RSS {rss_mib():,.0f} MiB"
        )
        reads = min(n, args.sim_tokens * cfg.n_hash_cols)
        say(f"simulation of layer 1's first {reads:,} reads at {args.rows:,} rows, one core:")
        for policy in POLICIES:
            reader = trace_reader(str(future if policy in OFFLINE else src), policy in OFFLINE)
            cache = make_cache(policy, args.rows)
            t = time.perf_counter()
            miss, _ = cache.process_trace(reader, start_req=0, max_req=reads)
            dt = time.perf_counter() - t
            say(
                f"  {policy:<10} {reads / dt:>12,.0f} reads/s   hit rate {1 - miss:.4f}   peak RSS {rss_mib():,.0f} MiB"
            )
    finally:
        trace.cleanup()
    say(f"load average after: {os.getloadavg()[0]:.1f}")
    Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
