"""``engram-viz cache-sim``: row caches simulated over the row reads of text files."""

from __future__ import annotations

import argparse

from engram_viz.apps.cache_sim_job import SimOptions, run_cache_sim
from engram_viz.commands.arguments import config_of


def cache_sim(args: argparse.Namespace) -> None:
    options = SimOptions(
        args.policy,
        args.sizes,
        args.chunk,
        not args.no_orders,
        io_tokens=args.io_tokens,
        decode_tokens_per_s=args.decode_rate,
        prefill_tokens_per_s=args.prefill_rate,
    )
    result = run_cache_sim(
        args.files or None,
        args.out,
        config=config_of(args),
        options=options,
        max_tokens=args.max_tokens,
        workers=args.workers,
        scheduler=args.scheduler,
        progress=not args.quiet,
        keep_trace=args.keep_trace,
    )
    s = result.summary
    print(
        f"config {s['config']}: {s['tokens']:,} tokens traced in {s['trace_s']:.1f} s; {s['simulated_accesses']:,} "
        f"row accesses simulated in {s['simulate_s']:.1f} s (peak {s['peak_rss_mb']:,.0f} MiB)"
    )
    print(f"wrote {len(s['tables'])} tables (parquet + csv), hit_rate_vs_size and summary.json to {result.out_dir}")
