"""``engram-viz corpus`` and ``cache-sim``: row usage, hash collisions and row caches over text files."""

from __future__ import annotations

import argparse

from engram_viz.analysis.corpus.documents import DocumentSpec
from engram_viz.apps.cache_sim_job import SimOptions, run_cache_sim
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.commands.arguments import config_of
from engram_viz.core.tokenizer import get_tokenizer


def corpus(args: argparse.Namespace) -> None:
    config = config_of(args)
    result = run_corpus(
        args.files or None,
        args.out,
        config=config,
        tokenizer=get_tokenizer(config, args.tokenizer),
        max_tokens=args.max_tokens,
        spec=DocumentSpec(text_field=args.text_field, doc_mode=args.doc_mode, bos=not args.no_bos),
        top=args.top,
        save_counts=args.save_counts,
        progress=not args.quiet,
        workers=args.workers,
        scheduler=args.scheduler,
        memory_limit=args.memory_limit,
    )
    s = result.summary
    print(
        f"config {s['config']}: {s['tokens']:,} tokens in {s['documents']:,} documents "
        f"({s['tokens_per_s']:,} tokens/s counting, {s['analysis_s']:.1f} s analysis, peak {s['peak_rss_mb']:,.0f} MiB)"
    )
    print("distinct n-grams: " + ", ".join(f"{n}-grams {k:,}" for n, k in s["distinct_ngrams"].items()))
    print(f"wrote {len(s['tables'])} tables (parquet + csv) and summary.json to {result.out_dir}")


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
