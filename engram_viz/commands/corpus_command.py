"""``engram-viz corpus``: row usage and hash collisions over text files (imports neither torch nor matplotlib)."""

from __future__ import annotations

import argparse

from engram_viz.analysis.corpus.documents import DocumentSpec
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
