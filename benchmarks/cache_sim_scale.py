"""Row-cache growth on Dask: the trace and the simulations of one cache at 10 M, 30 M and 100 M tokens.

    python benchmarks/cache_sim_scale.py [--tokens 10000000 30000000 100000000] [--workers 2]
                                         [--layer 1] [--scope n2] [--policies LRU,Belady]
                                         [--rows 16384] [--config v41-flash] [--json OUT.json]

Corpora: ``corpus_scale``'s ``text`` corpus (the default corpus's documents repeated, each
repetition in a fresh shuffled order, as JSONL), written once per size into a temporary folder.

Each row runs in a fresh child process with a local cluster of ``--workers`` single-threaded
worker processes, in two phases:

1. **trace** (``dask_trace.trace_corpus_dask``): the workers read, tokenize and hash spans of whole
   documents; the client appends each span's rows to the trace file in order (at most ``2 x
   workers`` spans in flight). Per token only, and only ``--layer``'s ``--scope`` is written
   (``n2``: the 8 bigram columns, 8 reads a token; ``all``: 24).
2. **simulate** (``simulate.simulate_trace(client=...)``): Belady's future pass over the spilled
   trace is one task (12 B an access written to a second file), then every (policy, size) is one
   task reading its file through libCacheSim's C reader in segments.

The subset (one layer, one scope, two policies at one size; each further size adds its two jobs)
keeps the 100 M-token row within
about 15 minutes on two shared cores; the memory of each step does not depend on it.

Reported per row: wall and CPU seconds of each phase (CPU: the client process, which holds the
scheduler on a local cluster, plus every worker); bytes on disk (the trace file, the future file);
the peak RSS of the client/scheduler and of each worker in each phase (VmHWM, reset between
phases through ``/proc/self/clear_refs``; it counts the file pages a process has mapped and
read); and row accesses per CPU second: the trace's (accesses written / CPU of all processes in
the trace phase) and the simulation's (accesses simulated / CPU the workers spent in the phase,
the future pass included). A measurement, not a test: the machine is shared.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from corpus_scale import write_corpus

from engram_viz.analysis.caches.cache_sizes import row_bytes
from engram_viz.analysis.caches.dask_trace import trace_corpus_dask
from engram_viz.analysis.caches.simulate import simulate_trace
from engram_viz.analysis.corpus.dask_counting import dask_client
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer


def usage() -> dict:
    """This process's CPU seconds and peak RSS (MiB) since the last :func:`reset_peak`."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "peak_mib": ru.ru_maxrss / 1024}


def reset_peak() -> None:
    """Restart this process's peak RSS from its present RSS (Linux: ``clear_refs`` 5)."""
    Path("/proc/self/clear_refs").write_text("5")


def phase(client, fn):
    """``fn()`` with the wall, the CPU and the peak RSS of the client and of each worker."""
    reset_peak()
    client.run(reset_peak)
    before = {"client": usage(), **client.run(usage)}
    t = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t
    after = {"client": usage(), **client.run(usage)}
    cpu = {k: after[k]["cpu_s"] - before[k]["cpu_s"] for k in after}
    workers = sorted(k for k in after if k != "client")
    return out, {
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(cpu.values()), 1),
        "worker_cpu_s": round(sum(cpu[k] for k in workers), 1),
        "client_peak_mib": round(after["client"]["peak_mib"]),
        "worker_peak_mib": [round(after[k]["peak_mib"]) for k in workers],
    }


def child(args: argparse.Namespace, path: Path) -> dict:
    """One row: trace ``path`` on a fresh local cluster, then simulate its one trace file."""
    cfg = load_config(args.config)
    tok = get_tokenizer(cfg)
    with tempfile.TemporaryDirectory(prefix="cache-scale-trace-") as folder, dask_client(args.workers) as client:
        trace, traced = phase(
            client,
            lambda: trace_corpus_dask(
                client, [path], cfg, tok, Path(folder), orders=False, progress=False, layers=[args.layer],
                scopes=[args.scope],
            ),
        )  # fmt: skip
        (hits, _), simulated = phase(
            client,
            lambda: simulate_trace(trace, args.policies, args.rows, row_bytes(cfg), windows=1, client=client),
        )
        src = trace.path(args.layer, args.scope)
        accesses = trace.accesses(args.layer, args.scope)
        future = src.with_suffix(".future")
        sim_accesses = int(hits["accesses"].sum())
        return {
            "tokens": trace.tokens,
            "accesses": accesses,
            "trace_bytes": src.stat().st_size,
            "future_bytes": future.stat().st_size if future.exists() else 0,
            "trace": traced,
            "simulate": simulated,
            "trace_accesses_per_cpu_s": round(accesses / max(traced["cpu_s"], 1e-9)),
            "simulated_accesses": sim_accesses,
            "sim_accesses_per_cpu_s": round(sim_accesses / max(simulated["worker_cpu_s"], 1e-9)),
            "hit_rates": {f"{r.policy}@{r.cache_rows}": round(r.hit_rate, 4) for r in hits.itertuples()},
        }


def _row(r: dict) -> str:
    t, s = r["trace"], r["simulate"]
    peaks = lambda p: f"{p['client_peak_mib']:,} / {' '.join(f'{m:,}' for m in p['worker_peak_mib'])}"
    return (
        f"{r['tokens']:>12,} {r['accesses'] / 1e6:>8,.0f} {r['trace_bytes'] / 1e9:>6.2f} {r['future_bytes'] / 1e9:>6.2f}  "
        f"{t['wall_s']:>6} {t['cpu_s']:>6} {r['trace_accesses_per_cpu_s'] / 1e6:>5.2f} {peaks(t):>18}  "
        f"{s['wall_s']:>6} {s['worker_cpu_s']:>6} {r['sim_accesses_per_cpu_s'] / 1e6:>5.2f} {peaks(s):>18}"
    )


HEADER = (
    f"{'tokens':>12} {'reads M':>8} {'trace':>6} {'future':>6}  {'wall':>6} {'CPU':>6} {'M/cs':>5} {'client / workers':>18}  "
    f"{'wall':>6} {'CPU':>6} {'M/cs':>5} {'client / workers':>18}\n"
    f"{'':>12} {'':>8} {'GB':>6} {'GB':>6}  {'trace phase (s, MiB)':^39}  {'simulate phase (s, MiB)':^39}"
)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="v41-flash")
    p.add_argument("--tokens", type=int, nargs="+", default=[10_000_000, 30_000_000, 100_000_000])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--layer", type=int, default=1)
    p.add_argument("--scope", default="n2")
    p.add_argument("--policies", default="LRU,Belady")
    p.add_argument("--rows", type=int, nargs="+", default=[16_384])
    p.add_argument("--json", default=None, help="also write the results here (after every row)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args, Path(args.child))))
        return
    tok = get_tokenizer(args.config)
    print(
        f"config {args.config}; layer {args.layer}, scope {args.scope}, per token; {args.policies} at "
        f"{', '.join(f'{r:,}' for r in args.rows)} rows; {args.workers} workers; fresh process and cluster per row"
    )
    print(HEADER, flush=True)
    results = []
    with tempfile.TemporaryDirectory(prefix="cache-scale-data-") as data:
        for tokens in args.tokens:
            path = Path(data) / f"text-{tokens}.jsonl"
            write_corpus(path, "text", tokens, tok)
            cmd = [sys.executable, __file__, "--child", str(path), "--workers", str(args.workers)]
            cmd += ["--config", args.config, "--layer", str(args.layer), "--scope", args.scope]
            cmd += ["--policies", args.policies, "--rows", *map(str, args.rows)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            r = json.loads(out.splitlines()[-1])
            results.append(r)
            print(_row(r), f"  load {os.getloadavg()[0]:.1f}", flush=True)
            if args.json:  # after every row: a long run killed part-way keeps what finished
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
            path.unlink()
    for r in results:
        print(f"{r['tokens']:>12,} hit rates: {r['hit_rates']}")


if __name__ == "__main__":
    main()
