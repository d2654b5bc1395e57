"""Hit rate against cache size: every (layer, scope, mode, policy, size) of a trace through libCacheSim.

Each simulation is one :class:`SimJob`: a fresh cache of ``rows`` rows under one policy reads one
trace file in C (``policies.trace_reader``) in ``windows`` consecutive windows of requests, the
cache carried from one window to the next, so one pass gives the hit rate and its warm-up curve
(the hit rate of each window, and cumulative). Belady reads the trace's future file
(``future_access.write_future_trace``, written once per trace file beside it and shared by its
sizes). Jobs are independent: :func:`simulate_trace` runs them here, or, given a Dask ``client``,
one task each, after one task per future file that Belady's jobs wait for (the workers must see
the trace folder).

Memory: the simulator's C reader maps the whole trace file, and every page it has read stays
in the process (as file-backed RSS) until the reader goes; a job therefore reads its trace in
segments of at most ``SEGMENT`` requests, a fresh reader each (skipping to a request is
arithmetic), so it holds one segment's pages (128 MiB of rows, 384 MiB of Belady's records)
plus the cache, whatever the trace's length.

Tables (tidy, one row per observation):

- ``hit_rates``: layer, scope, mode, policy, cache_rows, cache_bytes, table_rows, tokens,
  accesses, hits, hit_rate, byte_hit_rate, misses_per_token, distinct_rows (the trace's working
  set), best_hit_rate (``1 - distinct_rows / accesses``: only first accesses miss, an infinite cache).
- ``warmup``: the same keys, window, first_access, accesses, hits, hit_rate, cumulative_hit_rate.

Hits are exact counts: the simulator returns each window's miss ratio as ``misses / requests``
(a double), and ``round`` recovers the integer below 2**52 requests.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from engram_viz.analysis.caches.future_access import write_future_trace
from engram_viz.analysis.caches.policies import OFFLINE, check_size, make_cache, parse_policies, trace_reader
from engram_viz.analysis.caches.row_trace import RowTrace
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import CacheSimError

WINDOWS = 20  # warm-up windows per simulation
SEGMENT = 1 << 25  # requests read through one reader (see the module docstring)
KEYS = ["layer", "scope", "mode", "policy", "cache_rows"]


@dataclass(frozen=True)
class SimJob:
    """One simulation: ``path`` (a trace file; Belady: its future file), what it is, the cache."""

    path: str
    layer: int
    scope: str
    mode: str
    policy: str
    cache_rows: int
    windows: int = WINDOWS


def run_job(job: SimJob, *after: Any) -> list[dict]:
    """One simulation -> its warm-up rows (window, first_access, accesses, hits), in order
    (``after``: what the job waits for on Dask, unused)."""
    offline = job.policy in OFFLINE
    reader = trace_reader(job.path, offline)
    n = reader.get_num_of_req()
    cache = make_cache(job.policy, job.cache_rows)
    width = max(1, math.ceil(n / max(1, job.windows)))
    out = []
    for w, start in enumerate(range(0, n, width)):
        size = min(width, n - start)
        hits = 0
        for a in range(start, start + size, SEGMENT):
            del reader  # unmaps the pages read so far (a reader's close() frees twice: not used)
            reader = trace_reader(job.path, offline)
            step = min(SEGMENT, start + size - a)
            miss_ratio, _ = cache.process_trace(reader, start_req=a, max_req=step)
            hits += round((1 - miss_ratio) * step)
        out.append({"window": w, "first_access": start, "accesses": size, "hits": hits})
    return out


def future_file(src: Path) -> Path:
    """Where the future file of the trace file ``src`` goes (beside it)."""
    return src.with_suffix(".future")


def write_future(src: str | Path) -> Path:
    """The future file of the trace file ``src``, written unless it is newer than ``src``."""
    src = Path(src)
    out = future_file(src)
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        tmp = out.with_suffix(".future-tmp")
        write_future_trace(src, tmp)
        tmp.replace(out)
    return out


def future_path(trace: RowTrace, layer: int, scope: str, mode: str) -> Path:
    """The future file of one trace file (written on first use)."""
    return write_future(trace.path(layer, scope, mode))


def plan(
    trace: RowTrace,
    policies: Iterable[str] | str | None,
    sizes: Iterable[int],
    layers: Iterable[int] | None = None,
    scopes: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    windows: int = WINDOWS,
) -> list[SimJob]:
    """Every job of the product (policies x sizes x layers x scopes x modes; None: all the trace has).
    Belady's jobs name their future file, written by :func:`simulate_trace` before they run."""
    names = parse_policies(policies if policies is None or isinstance(policies, str) else list(policies))
    sizes = sorted(set(sizes))
    if not sizes or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in sizes):
        raise CacheSimError(f"cache sizes must be positive row counts, got {sizes!r}")
    if isinstance(windows, bool) or not isinstance(windows, int) or windows < 1:
        raise CacheSimError(f"warm-up windows must be a positive integer, got {windows!r}")
    for name in names:
        check_size(name, sizes[0])
    jobs = []
    for layer in trace.layer_ids if layers is None else layers:
        for scope in trace.scopes if scopes is None else scopes:
            for mode in trace.modes if modes is None else modes:
                src = trace.path(layer, scope, mode)  # checks the combination
                for policy in names:
                    path = future_file(src) if policy in OFFLINE else src
                    jobs += [SimJob(str(path), layer, scope, mode, policy, s, windows) for s in sizes]
    return jobs


def _tables(trace: RowTrace, jobs: list[SimJob], results: list[list[dict]], row_size: int):
    table_rows = dict(zip(trace.config.engram_layer_ids, EngramLayout(trace.config).rows_per_layer.tolist()))
    distinct = {}
    hit_rows, warm_rows = [], []
    for job, windows in zip(jobs, results, strict=True):
        key = {k: v for k, v in asdict(job).items() if k in KEYS}
        src = (job.layer, job.scope, job.mode)
        if src not in distinct:
            distinct[src] = trace.distinct_rows(*src)
        accesses = sum(w["accesses"] for w in windows)
        hits = sum(w["hits"] for w in windows)
        cumulative = 0
        for w in windows:
            cumulative += w["hits"]
            done = w["first_access"] + w["accesses"]
            warm_rows.append(
                {**key, **w, "hit_rate": w["hits"] / w["accesses"], "cumulative_hit_rate": cumulative / done}
            )
        hit_rows.append(
            {
                **key,
                "cache_bytes": job.cache_rows * row_size,
                "table_rows": table_rows[job.layer],
                "tokens": trace.tokens,
                "accesses": accesses,
                "hits": hits,
                "hit_rate": hits / max(accesses, 1),
                "byte_hit_rate": hits * row_size / max(accesses * row_size, 1),  # one row size: equal to hit_rate
                "misses_per_token": (accesses - hits) / max(trace.tokens, 1),
                "distinct_rows": distinct[src],
                "best_hit_rate": 1 - distinct[src] / max(accesses, 1),
            }
        )
    return pd.DataFrame(hit_rows), pd.DataFrame(warm_rows)


def simulate_trace(
    trace: RowTrace,
    policies: Iterable[str] | str | None,
    sizes: Iterable[int],
    row_size: int,
    layers: Iterable[int] | None = None,
    scopes: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    windows: int = WINDOWS,
    client: Any = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(hit_rates, warmup)`` tables (see the module docstring) of every job of :func:`plan`;
    ``row_size``: bytes a cached row (``cache_sizes.row_bytes``); ``client``: a Dask client to run
    the jobs on (one task each), else here, one after another."""
    jobs = plan(trace, policies, sizes, layers, scopes, modes, windows)
    sources = {trace.path(j.layer, j.scope, j.mode) for j in jobs if j.policy in OFFLINE}  # of the future files
    if client is None:
        for src in sources:
            write_future(src)
        results = [run_job(job) for job in jobs]
    else:
        written = {future_file(src): client.submit(write_future, src, pure=False) for src in sources}
        results = client.gather(
            [
                client.submit(run_job, job, *[f for p, f in written.items() if str(p) == job.path], pure=False)
                for job in jobs
            ]
        )
    return _tables(trace, jobs, results, row_size)
