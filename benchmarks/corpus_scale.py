"""Corpus growth: time and peak memory of counting 1 M / 10 M / 100 M tokens of uniformly random
ids (the worst case: almost every n-gram distinct), without and with a memory limit.

    python benchmarks/corpus_scale.py [--tokens 1000000 10000000] [--limit 256MB] [--limited-only]
                                      [--config v41-flash] [--json OUT.json]

Each measurement runs in a fresh child process (peak RSS = its ru_maxrss): ids drawn in 1 M-token
chunks, cut into windows (``StreamWindows``, a sequence start every 4096 tokens) and counted
(``NgramCounts.add_windows``), then every order read once (``n_distinct``: with a limit, the
external merge of the spilled runs). The analysis tables are not included: they hold each
order's distinct n-grams in memory whatever the limit. Without a limit the store grows with the
corpus; with one it stays near the limit and the rest goes to disk (the spill folder's size is
reported). Machines here are shared and noisy: compare rows of one run. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from engram_viz.analysis.counts import NgramCounts
from engram_viz.analysis.windows import StreamWindows
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer

CHUNK = 1_000_000
SEQ = 4096


def _folder_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def child(config: str, tokens: int, limit: str | None) -> dict:
    cfg = load_config(config)
    tok = get_tokenizer(cfg)
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="corpus-scale-") as spill:
        stream = StreamWindows(cfg, tok.token_map)
        counts = NgramCounts(cfg, stream.pad_id, limit, spill)
        spill_peak = 0
        t0 = time.perf_counter()
        for a in range(0, tokens, CHUNK):
            n = min(CHUNK, tokens - a)
            ids = rng.integers(3, 128000, n)
            starts = (np.arange(a, a + n) % SEQ) == 0
            counts.add_windows(stream(ids, starts))
            spill_peak = max(spill_peak, _folder_bytes(Path(spill)))
        t1 = time.perf_counter()
        distinct = {n: counts.n_distinct(n) for n in cfg.ngram_orders}
        t2 = time.perf_counter()
        spill_peak = max(spill_peak, _folder_bytes(Path(spill)))
        counts.close()
    return {
        "tokens": tokens,
        "memory_limit": limit,
        "count_s": round(t1 - t0, 2),
        "merge_s": round(t2 - t1, 2),
        "tok_per_s": round(tokens / (t2 - t0)),
        "spills": counts.n_spills,
        "spill_peak_mib": round(spill_peak / 2**20, 1),
        "distinct_ngrams": distinct,
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="v41-flash")
    p.add_argument("--tokens", type=int, nargs="+", default=[1_000_000, 10_000_000])
    p.add_argument("--limit", default="256MB", help="the memory limit of the limited runs")
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument(
        "--limited-only", action="store_true", help="skip the runs without a limit (at 100 M they need ~20 GB)"
    )
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--child-limit", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.config, args.tokens[0], args.child_limit)))
        return
    results = []
    print(f"config {args.config}; random ids; fresh process per row; limit {args.limit}")
    print(f"{'tokens':>12} {'limit':>8} {'count s':>8} {'merge s':>8} {'tok/s':>10} {'spills':>6} "
          f"{'disk MiB':>9} {'peak RSS MiB':>13}")  # fmt: skip
    for tokens in args.tokens:
        for limit in (args.limit,) if args.limited_only else (None, args.limit):
            cmd = [sys.executable, __file__, "--child", "--config", args.config, "--tokens", str(tokens)]
            cmd += [] if limit is None else ["--child-limit", limit]
            r = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.splitlines()[-1])
            results.append(r)
            print(
                f"{tokens:>12,} {limit or 'none':>8} {r['count_s']:>8} {r['merge_s']:>8} {r['tok_per_s']:>10,} "
                f"{r['spills']:>6} {r['spill_peak_mib']:>9,.0f} {r['peak_rss_mib']:>13,.0f}",
                flush=True,
            )
            if args.json:  # after every row: a long run killed part-way keeps what finished
                Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
