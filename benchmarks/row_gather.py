"""Lazy (memory-mapped and pread) vs in-memory gather of the same table rows, side by side in one run.

    python benchmarks/row_gather.py [--rows 2000000] [--tokens 4096] [--reps 5] [--warm-prompts 16] [--no-full-size]

Writes a table file (``--rows`` x 256 e4m3 + e8m0 scales, random valid bytes) to a temporary
folder, then gathers the rows of ``--tokens``-token prompts (tokens x 24 ids) of two kinds:

- ``real text``: the row ids of one Engram layer for consecutive prompts of the default corpus
  (tokenizer + hash of v41-flash; Zipf-like: frequent n-grams come back), folded into the table's
  rows (id mod rows) for the table file, as they are for the full-size table;
- ``uniform``: uniformly random ids.

Every rep gathers a NEW prompt (the same ids for every variant, rows asserted identical), after
``--warm-prompts`` earlier prompts went through each lazy table. Backings: (a) an ``InMemoryTable``
holding the whole file; (b) ``LazyTable`` as the library opens it (``LazyRows``: coalesced
reads from the compiled loop, threaded), without and with a ``RowCache`` of ``CACHE_MB`` (warm only), and
with its reads issued from Python (``os.preadv`` from ``map``, its path without numba; warm only); (c) a
``LazyTable`` over ``mmap_rows.MappedRows``, the memory-mapped experiment (mapped pages under its
``MAP_BUDGET_BYTES`` budget, the pages of every map dropped when it is spent). Lazy backings run
warm (file in the page cache) and cold (every map's pages dropped, then the file's pages with
posix_fadvise, before each gather). Reps are interleaved so machine noise hits every variant alike;
the figure is the median and the ratio to in-memory. Resident memory: what each backing holds, the
peak growth during one gather (VmHWM). Last, both kinds from a full-size sparse table (384,016,682
rows, 101 GB logical, no disk), which no in-memory backing can hold: its time is set beside the
in-memory gather of the same number of ids of that kind from the table file (a proxy, labelled
so), and its resident growth is the peak over all reps above the resident memory before the first
(mapped pages stay mapped between gathers until the budget is spent). Machines here are shared:
read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mmap_rows import BUDGET, MAP_BUDGET_BYTES, MappedRows

from engram_viz.weights import rows
from engram_viz.weights.safetensors import create_sparse_safetensors, read_safetensors_header, read_tensor
from engram_viz.weights.tables import InMemoryTable, LazyTable

HEAD_DIM, V41_ROWS = 256, 384_016_682
W, S = "layers.14.engram.embed.weight", "layers.14.engram.embed.scale"
CACHE_MB = 64  # the hot-row cache measured (LazyTable's default is no cache)


def open_table(path: Path, engine: str) -> LazyTable:
    """A ``LazyTable`` over the file: ``pread`` (the library's), ``pread cache`` (with a ``CACHE_MB`` hot-row
    cache), ``pread pyloop`` (the library's, read through ``python_loop``) or ``mmap`` (``mmap_rows.MappedRows``,
    the experiment)."""
    if engine == "mmap":
        tensors = read_safetensors_header(path).tensors
        return LazyTable(MappedRows(tensors[W]), MappedRows(tensors[S]))
    return LazyTable.open(path, W, S, cache_mb=CACHE_MB if engine == "pread cache" else 0)


def python_loop(fn):
    """``fn`` run with ``LazyRows`` issuing its reads from Python (``os.preadv`` from ``map``, its path without
    numba) instead of the compiled read loop."""

    def run():
        keep, rows.COMPILED_MIN_ROWS = rows.COMPILED_MIN_ROWS, 2**62
        try:
            return fn()
        finally:
            rows.COMPILED_MIN_ROWS = keep

    return run


def rss() -> int:
    return psutil.Process().memory_info().rss


def reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def peak() -> int | None:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


def write_table(path: Path, rows: int) -> None:
    """A real (non-sparse) table file: random e4m3 bytes (bit 3 clear: never NaN), scales 2**-7..2**7."""
    header = create_sparse_safetensors(path, {W: ("F8_E4M3", (rows, HEAD_DIM)), S: ("F8_E8M0", (rows, HEAD_DIM // 32))})
    rng = np.random.default_rng(0)
    fd = os.open(path, os.O_WRONLY)
    try:
        step = 65536
        for a in range(0, rows, step):
            n = min(step, rows - a)
            os.pwrite(
                fd,
                (rng.integers(0, 256, (n, HEAD_DIM), dtype=np.uint8) & 0xF7).tobytes(),
                header.tensors[W].start + a * HEAD_DIM,
            )
            os.pwrite(
                fd,
                rng.integers(120, 135, (n, HEAD_DIM // 32), dtype=np.uint8).tobytes(),
                header.tensors[S].start + a * 8,
            )
        os.fsync(fd)
    finally:
        os.close(fd)


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn, before=None) -> tuple[float, int | None]:
    if before:
        before()
    base = rss()
    have_peak = reset_peak()
    t = time.perf_counter()
    out = fn()
    dt = time.perf_counter() - t
    grow = (peak() - base) if have_peak else (rss() - base)
    del out
    return dt, grow


def real_text_ids(n_prompts: int, tokens: int) -> np.ndarray:
    """Row ids of the first Engram layer for ``n_prompts`` consecutive ``tokens``-token prompts of
    the default corpus -> ``[n_prompts, tokens, 24]`` (ids of the full-size table)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from corpus_throughput import tokenize_default_corpus

    from engram_viz.analysis.corpus.row_ids import rows_from_windows
    from engram_viz.analysis.corpus.windows import StreamWindows
    from engram_viz.config import load_config
    from engram_viz.core.layout import EngramLayout
    from engram_viz.core.tokenizer import get_tokenizer

    cfg = load_config("v41-flash")
    tok = get_tokenizer(cfg)
    ids, starts, _ = tokenize_default_corpus(cfg)
    n = n_prompts * tokens
    rows = rows_from_windows(EngramLayout(cfg), StreamWindows(cfg, tok.token_map)(ids[:n], starts[:n]))
    return rows[:, 0, :].reshape(n_prompts, tokens, -1)


def raw_bytes(pair) -> tuple[torch.Tensor, torch.Tensor]:
    return tuple(t.view(torch.uint8) for t in pair)


def cold(path: Path) -> None:
    """Nothing of the file resident: every map's pages dropped (mapped pages are not evicted), then the file's."""
    BUDGET.reset()
    drop_cache(path)


def warm_file(path: Path) -> None:
    """The whole file into the page cache (after a cold variant dropped it)."""
    with open(path, "rb", buffering=0) as fh:
        while fh.read(64 * 2**20):
            pass


VARIANTS = (  # (backing, op, table, cold before?); a table's engine is its name's first word(s)
    ("in-memory", "gather_fp8", "mem", False),
    ("lazy mmap warm", "gather_fp8", "mmap warm", False),
    ("lazy pread warm", "gather_fp8", "pread warm", False),
    ("lazy pread warm, cache", "gather_fp8", "pread cache warm", False),
    ("lazy pread warm, py loop", "gather_fp8", "pread pyloop warm", False),
    ("in-memory", "lookup bf16", "mem", False),
    ("lazy mmap warm", "lookup bf16", "mmap bf16", False),
    ("lazy pread warm", "lookup bf16", "pread bf16", False),
    ("lazy mmap cold", "gather_fp8", "mmap cold", True),
    ("lazy pread cold", "gather_fp8", "pread cold", True),
)


def run_kind(kind: str, prompts: torch.Tensor, args, path: Path, mem, rows_note: str) -> dict:
    """Interleaved reps over new prompts: every variant gathers prompt ``warm + rep``; medians printed.
    Each variant has its own lazy table; warm variants run with the whole file in the page cache,
    cold ones after dropping it."""
    tables = {"mem": mem}
    for _, _, name, _ in VARIANTS:
        if name != "mem":
            tables[name] = open_table(path, name.rsplit(" ", 1)[0])
    for name, table in tables.items():
        for p in prompts[: args.warm_prompts]:
            table.gather_fp8(p)
    cache = tables["pread cache warm"].cache
    cache.hits = cache.lookups = 0
    times = {v[:2]: [] for v in VARIANTS}
    grows = {v[:2]: [] for v in VARIANTS}
    resets = 0
    for rep in range(args.reps):
        p = prompts[args.warm_prompts + rep]
        warm_file(path)
        for backing, op, name, is_cold in VARIANTS:
            table = tables[name]
            fn = (lambda t=table, p=p: t.gather_fp8(p)) if op == "gather_fp8" else (lambda t=table, p=p: t(p))
            fn = python_loop(fn) if "pyloop" in name else fn
            before = BUDGET.resets
            dt, grow = timed(fn, (lambda: cold(path)) if is_cold else None)
            if name == "mmap warm":
                resets += BUDGET.resets - before
            times[(backing, op)].append(dt)
            grows[(backing, op)].append(grow)
        warm_file(path)
        want = raw_bytes(mem.gather_fp8(p))
        counts = cache.hits, cache.lookups  # the check's own cache hits not counted
        for name, table in tables.items():
            got = raw_bytes(table.gather_fp8(p))
            assert all(torch.equal(a, b) for a, b in zip(got, want)), f"{kind}: {name} rows differ"
        cache.hits, cache.lookups = counts
    ref = {op: statistics.median(times[("in-memory", op)]) for op in ("gather_fp8", "lookup bf16")}
    n_ids = prompts[0].numel()
    uniq = statistics.mean(len(torch.unique(prompts[args.warm_prompts + r])) for r in range(args.reps))
    print(
        f"## {kind} ids ({rows_note}): {n_ids:,} ids a prompt ({uniq:,.0f} unique on average), "
        f"a new prompt each rep after {args.warm_prompts} warm-up prompts; the mapped-page budget "
        f"({MAP_BUDGET_BYTES / 2**20:.0f} MB) was spent {resets / args.reps:.1f} times per warm mmap gather; "
        f"the {CACHE_MB} MB hot-row cache hit {cache.hit_rate:.1%} of the unique rows of its timed gathers"
    )
    print(f"{'backing':<24} {'op':<12} {'median ms':>10} {'x in-memory':>12} {'M ids/s':>8} {'peak RSS growth':>16}")
    for (backing, op), ts in times.items():
        med = statistics.median(ts)
        print(
            f"{backing:<24} {op:<12} {med * 1e3:>10.1f} {med / ref[op]:>11.2f}x {n_ids / med / 1e6:>8.2f} "
            f"{max(grows[(backing, op)]) / 2**20:>13.0f} MB"
        )
    print()
    return ref


def full_size(tmp: str, kind: str, prompts: torch.Tensor, args, mem_ref: float) -> None:
    """Both engines (pread also with its reads from Python) on the full-size sparse table, new prompts after the warm-up ones; each engine's
    peak resident growth over all its reps, from before its first timed gather."""
    full = Path(tmp) / "full.safetensors"
    if not full.exists():
        create_sparse_safetensors(full, {W: ("F8_E4M3", (V41_ROWS, HEAD_DIM)), S: ("F8_E8M0", (V41_ROWS, 8))})
    pager = open_table(full, "pread")
    for engine in ("mmap", "pread", "pread pyloop"):
        table = open_table(full, engine)
        gather = (lambda p, t=table: python_loop(lambda: t.gather_fp8(p))()) if "pyloop" in engine else table.gather_fp8
        for p in prompts[: args.warm_prompts]:
            gather(p)
        BUDGET.reset()
        times = []
        base = rss()
        have_peak = reset_peak()
        for rep in range(args.reps):
            p = prompts[args.warm_prompts + rep]
            pager.gather_fp8(p)  # the prompt's pages into the page cache (holes are read as zero pages once)
            t = time.perf_counter()
            gather(p)
            times.append(time.perf_counter() - t)
        grow = (peak() if have_peak else rss()) - base
        med = statistics.median(times)
        print(
            f"  {kind:<9} lazy {engine:<12} gather_fp8 median {med * 1e3:6.1f} ms = {med / mem_ref:5.2f}x the in-memory "
            f"gather of as many {kind} ids from the table file (proxy); peak RSS growth over the {args.reps} reps "
            f"{grow / 2**20:.0f} MB"
        )
        del table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the table file (default 2,000,000 = 528 MB)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm-prompts", type=int, default=16, help="prompts through each lazy table before timing")
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared, busy machine OpenMP spin-waiting distorts both sides)",
    )
    ap.add_argument("--no-full-size", action="store_true", help="skip the full-size sparse table (slow: ~15+ min)")
    args = ap.parse_args()
    torch.set_num_threads(args.torch_threads)
    n_prompts = args.warm_prompts + args.reps
    real = torch.from_numpy(real_text_ids(n_prompts, args.tokens))
    g = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="row_gather-") as tmp:
        path = Path(tmp) / "table.safetensors"
        t = time.perf_counter()
        write_table(path, args.rows)
        size = path.stat().st_size
        print(
            f"table file: {args.rows:,} x {HEAD_DIM} e4m3 + scales = {size / 1e6:,.0f} MB (written in "
            f"{time.perf_counter() - t:.1f} s); {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; "
            f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads)\n"
        )
        base = rss()
        lazy = LazyTable.open(path, W, S)
        lazy_held = rss() - base
        base = rss()
        header = lazy.weight.parts[0], lazy.scale.parts[0]
        mem = InMemoryTable(read_tensor(header[0]), read_tensor(header[1]))
        mem_held = rss() - base
        kinds = {
            "real text": (real % args.rows, real, "folded: id mod rows"),
            "uniform": (
                torch.randint(0, args.rows, (n_prompts, args.tokens, 24), generator=g),
                torch.randint(0, V41_ROWS, (n_prompts, args.tokens, 24), generator=g),
                "uniform over the rows",
            ),
        }
        refs = {}
        for kind, (small, _, note) in kinds.items():
            refs[kind] = run_kind(kind, small, args, path, mem, note)
        print(
            f"resident memory held by the table: in-memory {mem_held / 2**20:,.0f} MB, lazy {lazy_held / 2**20:,.1f} MB "
            f"(+ up to {MAP_BUDGET_BYTES / 2**20:.0f} MB of mapped pages, for every mapped table together)"
        )
        del mem, lazy
        BUDGET.reset()
        if args.no_full_size:
            return
        print(
            f"\nfull-size sparse table ({V41_ROWS:,} x {HEAD_DIM}, {V41_ROWS * HEAD_DIM * 33 / 32 / 1e9:.1f} GB logical, "
            "no disk; an in-memory table would need that much; pages brought in by pread before each timed gather):"
        )
        for kind, (_, big, _) in kinds.items():
            full_size(tmp, kind, big, args, refs[kind]["gather_fp8"])


if __name__ == "__main__":
    main()
