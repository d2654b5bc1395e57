"""``engram-viz cache-sim``: hit rate against cache size for every policy, and the disk the misses need.

``run_cache_sim(files, out_dir, ...)`` traces the corpus (``analysis.caches.corpus_trace``, or on
Dask ``dask_trace``), simulates every (layer, scope, mode, policy, size) with libCacheSim
(``simulate``), measures the page I/O of the misses over the last ``io_tokens`` tokens
(``page_io``) and writes, whole or not at all (``_files.atomic_folder``), the tables as
``NAME.parquet`` + ``NAME.csv``: ``cache_hit_rates``, ``cache_warmup``, ``cache_page_io``,
``cache_order_hits``, ``cache_disk`` (IOPS and MB/s at the target rates), ``cache_files``; the
figure ``hit_rate_vs_size.png|.svg``; and ``summary.json``. The trace goes to a hidden folder
beside ``out_dir`` and is removed at the end (``keep_trace``: kept, as ``out_dir/trace``).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engram_viz import settings
from engram_viz._files import atomic_folder, atomic_write_text, write_table
from engram_viz.analysis.caches.cache_sizes import (
    SHIPPED_SIZES,
    default_sizes,
    parse_size,
    parse_sizes,
    row_bytes,
    working_set_sizes,
)
from engram_viz.analysis.caches.corpus_trace import trace_corpus, trace_rows_frame
from engram_viz.analysis.caches.dask_trace import trace_corpus_dask
from engram_viz.analysis.caches.page_io import disk_table, page_io
from engram_viz.analysis.caches.policies import parse_policies
from engram_viz.analysis.caches.row_trace import RowTrace
from engram_viz.analysis.caches.simulate import WINDOWS, simulate_trace
from engram_viz.analysis.corpus.counting import checked_files
from engram_viz.analysis.corpus.dask_counting import checked_workers, dask_client
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import DocumentSpec
from engram_viz.apps.corpus_job import peak_rss_mb
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CacheSimError
from engram_viz.viz.cache_plots import hit_rate_vs_size
from engram_viz.viz.export import export_all
from engram_viz.weights.weights_rule import weights_config

IO_POLICIES = ("LRU", "Belady")  # the miss streams measured for page I/O by default (per-request: slow)


@dataclass
class CacheSimResult:
    trace: RowTrace
    tables: dict[str, pd.DataFrame]
    summary: dict
    out_dir: Path


@dataclass(frozen=True)
class SimOptions:
    """What ``run_cache_sim`` simulates: policies (None: all), sizes (rows, or sizes as
    ``cache_sizes.parse_size`` reads them; None: ``default_sizes``), prefill ``chunk`` tokens
    (None: per token only), ``orders`` (a cache per n-gram order too), warm-up ``windows``, the page
    I/O window (``io_tokens``, ``io_policies``) and the target rates (tokens a second)."""

    policies: str | list[str] | None = None
    sizes: str | list | None = None
    chunk: int | None = 4096
    orders: bool = True
    windows: int = WINDOWS
    io_tokens: int = 5_000
    io_policies: tuple[str, ...] = IO_POLICIES
    decode_tokens_per_s: float = 1_000.0
    prefill_tokens_per_s: float = 20_000.0


def _trace(files, cfg, tok, spec, opts, max_tokens, folder, client, progress) -> RowTrace:
    if client is None:
        return trace_corpus(files, cfg, tok, max_tokens, spec, opts.chunk, opts.orders, folder, progress)
    trace = trace_corpus_dask(client, checked_files(files), cfg, tok, folder, spec, opts.chunk, opts.orders, progress)
    if not trace.tokens:
        raise CacheSimError("the corpus gave no tokens: nothing to simulate (an empty corpus?)")
    return trace


def simulate_corpus(
    trace: RowTrace, opts: SimOptions, client: Any = None
) -> tuple[dict[str, pd.DataFrame], list[int], dict[str, int]]:
    """Every table of the job from a trace: ``(tables, sizes in rows, marks: shipped size -> bytes)``."""
    cfg = trace.config
    size = row_bytes(cfg)
    table_rows = int(EngramLayout(cfg).rows_per_layer.min())
    policies = parse_policies(opts.policies)
    if opts.sizes is None:
        sizes = default_sizes(table_rows, size, trace.distinct_rows(trace.layer_ids[0]))
    else:
        sizes = parse_sizes(opts.sizes, size, table_rows)
    hit_rates, warmup = simulate_trace(trace, policies, sizes, size, windows=opts.windows, client=client)
    io_policies = [p for p in parse_policies(list(opts.io_policies)) if p in policies] or policies[:1]
    pages, order_hits = page_io(trace, io_policies, sizes, opts.io_tokens)
    disk = disk_table(pages, opts.decode_tokens_per_s, opts.prefill_tokens_per_s)
    marks = {label: parse_size(s, size, table_rows) * size for label, s in SHIPPED_SIZES.items()}
    tables = {
        "cache_hit_rates": hit_rates,
        "cache_warmup": warmup,
        "cache_page_io": pages,
        "cache_order_hits": order_hits,
        "cache_disk": disk,
        "cache_files": pd.DataFrame(trace.files, columns=["path", "format", "bytes", "documents", "tokens"]),
    }
    return tables, sizes, marks


def run_cache_sim(
    files: Iterable[str | Path] | None,
    out_dir: str | Path,
    config: EngramConfig | str | None = None,
    tokenizer: Any = None,
    options: SimOptions | None = None,
    max_tokens: int | None = None,
    spec: DocumentSpec | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    processes: bool = True,
    progress: bool = True,
    keep_trace: bool = False,
) -> CacheSimResult:
    """The ``engram-viz cache-sim`` job (see the module docstring): ``files`` (None: the default
    corpus) under ``config`` (None: the default weights'), simulated as ``options`` says
    (default ``SimOptions()``); ``workers`` > 1 or ``scheduler``: trace and simulate on Dask."""
    opts = options or SimOptions()
    cfg = load_config(weights_config() if config is None else config)
    if workers is not None:
        checked_workers(workers)
    parse_policies(opts.policies)  # refused before any work
    if opts.sizes is not None:
        parse_sizes(opts.sizes, row_bytes(cfg), int(EngramLayout(cfg).rows_per_layer.min()))
    distributed = bool(scheduler) or (workers or 1) > 1
    if distributed and max_tokens is not None:
        raise CacheSimError("max_tokens needs one process (the cap follows file order); drop --workers/--scheduler")
    target = Path(os.path.realpath(out_dir))
    work = target.parent / f".{target.name}.new-trace.tmp"  # a killed run's is cleared by the next (atomic_folder)
    t0 = time.perf_counter()
    with atomic_folder(out_dir, marker="summary.json", pause=settings.pause_at) as build:
        tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
        default = files is None
        paths = default_corpus_files() if default else [Path(f) for f in files]
        try:
            if distributed:
                with dask_client(workers, scheduler, processes) as client:
                    trace = _trace(paths, cfg, tok, spec, opts, None, work, client, progress)
                    t_trace = time.perf_counter() - t0
                    tables, sizes, marks = simulate_corpus(trace, opts, client)
            else:
                trace = _trace(paths, cfg, tok, spec, opts, max_tokens, work, None, progress)
                t_trace = time.perf_counter() - t0
                tables, sizes, marks = simulate_corpus(trace, opts)
            for name, df in tables.items():
                write_table(df, build, name)
            export_all(hit_rate_vs_size(tables["cache_hit_rates"], marks=marks), build / "hit_rate_vs_size")
            summary = _summary(trace, tables, sizes, opts, t_trace, time.perf_counter() - t0)
            atomic_write_text(build / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
            if keep_trace:
                shutil.move(str(work), build / "trace")
                trace.folder = target / "trace"
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return CacheSimResult(trace, tables, summary, Path(out_dir))


def _summary(trace: RowTrace, tables: dict, sizes: list[int], opts: SimOptions, t_trace: float, t_all: float) -> dict:
    accesses = int(tables["cache_warmup"]["accesses"].sum())
    sim_s = max(t_all - t_trace, 1e-9)
    return {
        "config": trace.config.name,
        "source": trace.source,
        "tokens": trace.tokens,
        "row_bytes": row_bytes(trace.config),
        "chunk": trace.chunk,
        "scopes": list(trace.scopes),
        "policies": list(dict.fromkeys(tables["cache_hit_rates"]["policy"])),
        "sizes_rows": sizes,
        "windows": opts.windows,
        "io_tokens": opts.io_tokens,
        "decode_tokens_per_s": opts.decode_tokens_per_s,
        "prefill_tokens_per_s": opts.prefill_tokens_per_s,
        "trace_s": round(t_trace, 3),
        "simulate_s": round(sim_s, 3),
        "simulated_accesses": accesses,
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "tables": sorted(tables),
    }


def rows_frame_hit_rates(
    rows: pd.DataFrame, config: EngramConfig, policies: str | list[str] | None = None
) -> pd.DataFrame:
    """The ``hit_rates`` table of a Trace's rows frame (a prompt set, per token, one cache per
    layer), at :func:`working_set_sizes` of its distinct rows; the trace is removed after."""
    trace = trace_rows_frame(rows, config, orders=False, source="the prompt set")
    try:
        sizes = working_set_sizes(max(trace.distinct_rows(layer) for layer in trace.layer_ids))
        hit_rates, _ = simulate_trace(trace, policies, sizes, row_bytes(trace.config), windows=1)
    finally:
        trace.cleanup()
    return hit_rates
