"""Hit rate against cache size: every (layer, scope, mode, policy, size) of a trace through libCacheSim.

Each simulation is one :class:`SimJob`: a fresh cache of ``rows`` rows under one policy reads one
trace file in C (``policies.trace_reader``) in ``windows`` consecutive windows of requests, the
cache carried from one window to the next, so one pass gives the hit rate and its warm-up curve
(the hit rate of each window, and cumulative). Belady reads the trace's future file
(``future_access.write_future_trace``, written once per trace file beside it and shared by its
sizes). Jobs are independent: :func:`simulate_trace` runs them here, or, given a Dask ``client``,
one task each (the workers must see the trace folder).

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


def run_job(job: SimJob) -> list[dict]:
    """One simulation -> its warm-up rows (window, first_access, accesses, hits), in order."""
    reader = trace_reader(job.path, job.policy in OFFLINE)
    n = reader.get_num_of_req()
    cache = make_cache(job.policy, job.cache_rows)
    width = max(1, math.ceil(n / max(1, job.windows)))
    out = []
    for w, start in enumerate(range(0, n, width)):
        size = min(width, n - start)
        miss_ratio, _ = cache.process_trace(reader, start_req=start, max_req=size)
        out.append({"window": w, "first_access": start, "accesses": size, "hits": round((1 - miss_ratio) * size)})
    return out


def future_path(trace: RowTrace, layer: int, scope: str, mode: str) -> Path:
    """The future file of one trace file (written on first use)."""
    src = trace.path(layer, scope, mode)
    out = src.with_suffix(".future")
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        tmp = out.with_suffix(".future-tmp")
        write_future_trace(src, tmp)
        tmp.replace(out)
    return out


def plan(
    trace: RowTrace,
    policies: Iterable[str] | str | None,
    sizes: Iterable[int],
    layers: Iterable[int] | None = None,
    scopes: Iterable[str] | None = None,
    modes: Iterable[str] | None = None,
    windows: int = WINDOWS,
) -> list[SimJob]:
    """Every job of the product (policies x sizes x layers x scopes x modes; None: all the trace has)."""
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
                    path = future_path(trace, layer, scope, mode) if policy in OFFLINE else src
                    jobs += [SimJob(str(path), layer, scope, mode, policy, s, windows) for s in sizes]
    return jobs


def _tables(trace: RowTrace, jobs: list[SimJob], results: list[list[dict]], row_size: int):
    table_rows = dict(zip(trace.layer_ids, EngramLayout(trace.config).rows_per_layer.tolist()))
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
    if client is None:
        results = [run_job(job) for job in jobs]
    else:
        results = client.gather(client.map(run_job, jobs, pure=False))
    return _tables(trace, jobs, results, row_size)
