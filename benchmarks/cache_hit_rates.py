"""Hit rate against cache size on the whole default corpus at the V4.1-Flash layout, every policy.

    python benchmarks/cache_hit_rates.py [--layers 1] [--chunk 4096] [--modes token] [--chars 0 0]
                                         [--out benchmarks/results/cache_hit_rates]

Traces the default corpus (the KJV and the Chinese Debian Reference, every document with BOS;
``trace_corpus``; ``--chars K Z``: only the first K and Z characters of each, whole paragraphs), then simulates LRU, LFU, ARC, S3-FIFO, SIEVE, W-TinyLFU and Belady at 1 MiB to
the trace's distinct rows by factors of 4 and at the 16,384 rows a port ships (``default_sizes``),
one cache per layer for all 24 columns. Writes ``OUT.csv`` (the ``hit_rates`` table), ``OUT.png``
(the figure) and ``OUT.txt`` (the table as text, with the time each policy took and the CPU). A
measurement, not a test: the machine is shared.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd
from machine import cpu_features

from engram_viz.analysis.caches.cache_sizes import SHIPPED_SIZES, default_sizes, parse_size, row_bytes
from engram_viz.analysis.caches.corpus_trace import trace_corpus, trace_texts
from engram_viz.analysis.caches.simulate import simulate_trace
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import first_documents
from engram_viz.apps.corpus_job import peak_rss_mb
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.viz.cache_plots import hit_rate_vs_size
from engram_viz.viz.export import export_all


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, nargs="+", default=[1])
    ap.add_argument("--modes", nargs="+", default=["token"])
    ap.add_argument("--chunk", type=int, default=4096)
    ap.add_argument("--chars", type=int, nargs=2, default=[0, 0], help="first characters of each file (0: all)")
    ap.add_argument("--out", default="benchmarks/results/cache_hit_rates")
    args = ap.parse_args()
    cfg = load_config("v41-flash")
    size, table = row_bytes(cfg), int(EngramLayout(cfg).rows_per_layer.min())
    t0 = time.perf_counter()
    files = default_corpus_files()
    if args.chars[0]:
        docs = [d for f, chars in zip(files, args.chars, strict=True) for d in first_documents(f, chars)]
        trace = trace_texts(docs, cfg, chunk=args.chunk, orders=False, source="default corpus sample")
    else:
        trace = trace_corpus(files, cfg, chunk=args.chunk, orders=False, progress=False)
    t_trace = time.perf_counter() - t0
    try:
        sizes = default_sizes(table, size, trace.distinct_rows(args.layers[0]))
        lines, frames = [], []
        for policy in ["LRU", "LFU", "ARC", "S3-FIFO", "SIEVE", "W-TinyLFU", "Belady"]:
            t = time.perf_counter()
            hit, _ = simulate_trace(trace, [policy], sizes, size, layers=args.layers, modes=args.modes, windows=1)
            dt = time.perf_counter() - t
            frames.append(hit)
            lines.append(
                f"  {policy:<10} {hit['accesses'].sum():>13,} accesses in {dt:7.1f} s: {hit['accesses'].sum() / dt:>12,.0f} /s"
            )
            print(lines[-1], flush=True)
    finally:
        trace.cleanup()
    hit = pd.concat(frames, ignore_index=True)
    out = Path(args.out)
    hit.to_csv(out.with_suffix(".csv"), index=False)
    marks = {k: parse_size(v, size, table) * size for k, v in SHIPPED_SIZES.items()}
    export_all(hit_rate_vs_size(hit, layer=args.layers, marks=marks), out, formats=["png"])
    pivot = hit.pivot_table(
        index=["layer", "mode", "cache_rows", "cache_bytes"], columns="policy", values="hit_rate", sort=False
    )
    text = [
        f"{trace.source or 'default corpus'} at the v41-flash layout: {trace.tokens:,} tokens traced in {t_trace:.1f} s; {row_bytes(cfg)} B a row",
        (
            f"distinct rows (layer {args.layers[0]}, token): {int(hit['distinct_rows'].iloc[0]):,}; "
            f"infinite cache (only first reads miss): {hit['best_hit_rate'].iloc[0]:.4f}"
        ),
        f"CPU features: {cpu_features()}; one process, one core; peak RSS {peak_rss_mb():,.0f} MiB",
        "simulation speed (row accesses a second, all sizes of the policy together):",
        *lines,
        "",
        "hit rate (a cache per layer, all 24 columns; cache_bytes = rows x 264 B):",
        pivot.round(4).to_string(),
    ]
    out.with_suffix(".txt").write_text("\n".join(text) + "\n", encoding="utf-8")
    print("\n".join(text))


if __name__ == "__main__":
    main()
