"""Corpus-scale row usage and hash collisions: stream text or JSONL files, write tidy tables.

``engram-viz corpus FILE... --out DIR`` (``run_corpus``) reads the files in chunks, tokenizes
them with the V4 tokenizer, cuts every position's n-gram window with the vectorised stream
hasher (``windows``, ``hashes``; bit-identical to ``NgramHasher``) and accumulates the distinct
n-grams (``NgramCounts``, counted by ``corpus_counts``), from which ``RowUsage`` and
``CollisionStats`` derive their tables. Memory stays bounded by the chunk size plus 16 bytes per distinct n-gram (and order).

**Documents** (``documents``): paragraphs, lines or whole files of plain text, or JSONL; each
document is one sequence (``corpus_counts``). **Default corpus** (``corpus_sources``): the King
James Bible and the Chinese Debian Reference, built from Debian packages.

**Output** (``DIR``, all or nothing: built beside it and swapped in whole when complete, under a
lock against a second run into it, by ``engram_viz._files.atomic_folder``): every table as
``NAME.parquet`` and ``NAME.csv``:
``row_usage_columns``, ``row_usage_hit_histogram``, ``row_usage_rank_frequency``,
``row_usage_hot_rows`` (schemas in ``usage``), ``collisions_columns``, ``collisions_heads_shared``,
``collisions_examples``, ``collisions_top_ngrams`` (schemas in ``collisions``), ``corpus_files``
(path, format, bytes, documents, tokens), and ``summary.json``. ``save_counts`` adds
``ngram_counts.npz`` (``NgramCounts.load``) so shards can be merged later.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engram_viz import settings
from engram_viz._files import atomic_folder, atomic_write_text, write_table
from engram_viz.analysis.corpus.counting import CorpusStats, checked_files, count_corpus
from engram_viz.analysis.corpus.dask_counting import checked_workers, count_corpus_dask, dask_client
from engram_viz.analysis.corpus.default_corpus import default_corpus_files, default_corpus_sources
from engram_viz.analysis.corpus.documents import CorpusError, DocumentSpec
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.ngram_text import NgramDecoder
from engram_viz.analysis.corpus.spill import parse_memory_limit
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.weights.weights_rule import weights_config


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class CorpusResult:
    stats: CorpusStats
    usage: RowUsage
    collisions: CollisionStats
    tables: dict[str, pd.DataFrame]
    summary: dict
    out_dir: Path


def _count(
    files: list[Path],
    cfg: EngramConfig,
    tok: Any,
    spec: DocumentSpec,
    out_dir: str | Path,
    max_tokens: int | None,
    workers: int | None,
    scheduler: str | None,
    processes: bool,
    limit: int | None,
    progress: bool,
) -> CorpusStats:
    """The counting step of ``run_corpus``: in this process, or on Dask. Spilled runs (and on Dask,
    the decompressed copies of gzipped files) go into hidden folders beside ``out_dir`` named like
    ``atomic_folder``'s build folder, so the next run into ``out_dir`` clears what a killed run left."""
    target = Path(os.path.realpath(out_dir))
    counts = NgramCounts(cfg, int(tok.token_map[cfg.engram_pad_id]), limit, target.parent, f".{target.name}.new-spill")
    if not (bool(scheduler) or (workers or 1) > 1):
        return count_corpus(files, cfg, tok, max_tokens, spec, progress=progress, counts=counts)
    files = checked_files(files)  # before a cluster starts
    with dask_client(workers, scheduler, processes) as client:
        return count_corpus_dask(
            client,
            files,
            cfg,
            tok,
            spec,
            progress=progress,
            memory_limit=limit,
            counts=counts,
            spool_dir=target.parent,
            spool_prefix=f".{target.name}.new-spool",
        )


def run_corpus(
    files: Iterable[str | Path] | None,
    out_dir: str | Path,
    config: EngramConfig | str | None = None,
    tokenizer=None,
    max_tokens: int | None = None,
    spec: DocumentSpec | None = None,
    top: int = 20,
    save_counts: bool = False,
    progress: bool = True,
    workers: int | None = None,
    scheduler: str | None = None,
    processes: bool = True,
    memory_limit: int | str | None = None,
) -> CorpusResult:
    """The ``engram-viz corpus`` job: count ``files`` (None: ``default_corpus_files()``) under
    ``config`` (None: the default weights', as ``count_corpus``), derive
    the row-usage and collision tables (documents as ``spec`` says, default ``DocumentSpec()``), write them and ``summary.json`` to ``out_dir`` (whole, or
    not at all). ``workers`` > 1 or ``scheduler``: count on Dask (``corpus_engine``; a local
    cluster of ``workers``, or the cluster at ``scheduler``), with the same tables.
    ``memory_limit`` (bytes or a size like ``"2GB"``): the n-gram store's budget in this process
    and on each worker; past it sorted runs spill to disk (``spill``): here into a hidden folder
    beside ``out_dir`` named like the build folder, so a killed run's runs are cleared by the next."""
    cfg = load_config(weights_config() if config is None else config)
    if workers is not None:
        checked_workers(workers)
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise CorpusError(f"top (hot rows per layer) must be a non-negative integer, got {top!r}")
    distributed = bool(scheduler) or (workers or 1) > 1
    if distributed and max_tokens is not None:
        raise CorpusError("max_tokens needs one process (the cap follows file order); drop --workers/--scheduler")
    limit = parse_memory_limit(memory_limit)
    with atomic_folder(out_dir, marker="summary.json", pause=settings.pause_at) as build:
        tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
        default = files is None
        files = default_corpus_files() if default else [Path(f) for f in files]
        spec = spec or DocumentSpec()
        stats = _count(files, cfg, tok, spec, out_dir, max_tokens, workers, scheduler, processes, limit, progress)
        settings.pause_at("corpus:counted")
        t0 = time.perf_counter()
        usage = RowUsage(cfg, stats.counts)
        collisions = CollisionStats(cfg, stats.counts)  # shares the counts: nothing more is added
        analyse_together(usage, collisions, top=top)  # one pass over the columns for both
        decoder = NgramDecoder(tok, stats.counts.pad_id, stats.raw_counts)  # show each id as its commonest form
        tables = {f"row_usage_{k}": v for k, v in usage.to_frame(top=top, tokenizer=decoder).items()}
        tables.update({f"collisions_{k}": v for k, v in collisions.to_frame(tokenizer=decoder).items()})
        tables["corpus_files"] = pd.DataFrame(stats.files, columns=["path", "format", "bytes", "documents", "tokens"])
        analysis_s = time.perf_counter() - t0
        for name, df in tables.items():
            write_table(df, build, name)
        if save_counts:
            stats.counts.save(build / "ngram_counts.npz")
        settings.pause_at("corpus:tables")
        summary = {
            "config": cfg.name,
            "files": stats.files,
            "default_corpus": default_corpus_sources() if default else None,
            "doc_mode": spec.doc_mode,
            "text_field": spec.text_field,
            "bos": spec.bos,
            "max_tokens": max_tokens,
            "truncated": stats.truncated,
            "tokens": stats.tokens,
            "documents": stats.documents,
            "distinct_ngrams": {str(n): stats.counts.n_distinct(n) for n in cfg.ngram_orders},
            "count_s": round(stats.elapsed_s, 3),
            "analysis_s": round(analysis_s, 3),
            "tokens_per_s": round(stats.tokens / max(stats.elapsed_s, 1e-9)),
            "peak_rss_mb": round(peak_rss_mb(), 1),
            "memory_limit": limit,
            "spills": stats.counts.n_spills,
            "row_usage": usage.summary(),
            "collisions": collisions.summary(),
            "tables": sorted(tables),
        }
        atomic_write_text(build / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return CorpusResult(stats, usage, collisions, tables, summary, Path(out_dir))
