"""Lazy vs in-memory gather of the same table rows, side by side in one run.

    python benchmarks/row_gather.py [--rows 2000000] [--tokens 4096] [--reps 5]

Writes a table file (``--rows`` x 256 e4m3 + e8m0 scales, random valid bytes) to a temporary
folder, then gathers the rows of a ``--tokens``-token prompt (tokens x 24 ids, uniform like the
hash) from (a) an ``InMemoryTable`` holding the whole file and (b) a ``LazyTable`` reading it with
pread: warm (file in the page cache) and cold (pages dropped with posix_fadvise before each
gather, so reads go to the disk), with 1 and 4 reader threads. Reps are interleaved so machine
noise hits every variant alike; the printed figure is the median and the ratio to in-memory.
Resident memory: what each backing holds, and the peak growth during one gather (VmHWM).
Last, the same gather from a full-size sparse table (384,016,682 rows, 101 GB logical, no disk),
which no in-memory backing can hold. Machines here are shared: read ratios, not absolute times.
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

from engram_viz.weights.safetensors import create_sparse_safetensors, read_tensor
from engram_viz.weights.tables import InMemoryTable, LazyTable

HEAD_DIM, V41_ROWS = 256, 384_016_682
W, S = "layers.14.engram.embed.weight", "layers.14.engram.embed.scale"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000, help="rows of the table file (default 2,000,000 = 528 MB)")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: on a shared, busy machine OpenMP spin-waiting distorts both sides)",
    )
    args = ap.parse_args()

    torch.set_num_threads(args.torch_threads)
    with tempfile.TemporaryDirectory(prefix="row_gather-") as tmp:
        path = Path(tmp) / "table.safetensors"
        t = time.perf_counter()
        write_table(path, args.rows)
        size = path.stat().st_size
        print(
            f"table file: {args.rows:,} x {HEAD_DIM} e4m3 + scales = {size / 1e6:,.0f} MB (written in {time.perf_counter() - t:.1f} s)"
        )

        base = rss()
        lazy = LazyTable.open(path, W, S)
        lazy_held = rss() - base
        base = rss()
        header = lazy.weight.parts[0], lazy.scale.parts[0]
        mem = InMemoryTable(read_tensor(header[0]), read_tensor(header[1]))
        mem_held = rss() - base
        lazy1 = LazyTable.open(path, W, S)
        lazy1.weight.workers = lazy1.scale.workers = 1

        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, args.rows, (args.tokens, 24), generator=g)
        n_unique = len(torch.unique(ids))
        print(
            f"gather: {args.tokens} tokens x 24 = {ids.numel():,} ids ({n_unique:,} unique), median of {args.reps} "
            f"interleaved reps; {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}; torch {torch.__version__} "
            f"({torch.get_num_threads()} intra-op threads)\n"
        )
        variants = {
            ("in-memory", "gather_fp8"): (lambda: mem.gather_fp8(ids), None),
            ("lazy warm", "gather_fp8"): (lambda: lazy.gather_fp8(ids), None),
            ("lazy cold, 4 threads", "gather_fp8"): (lambda: lazy.gather_fp8(ids), lambda: drop_cache(path)),
            ("lazy cold, 1 thread", "gather_fp8"): (lambda: lazy1.gather_fp8(ids), lambda: drop_cache(path)),
            ("in-memory", "lookup bf16"): (lambda: mem(ids), None),
            ("lazy warm", "lookup bf16"): (lambda: lazy(ids), None),
        }
        lazy.gather_fp8(ids)  # warm the page cache, thread pool and allocator once
        mem.gather_fp8(ids)
        times = {k: [] for k in variants}
        grows = {k: [] for k in variants}
        for _ in range(args.reps):
            for k, (fn, before) in variants.items():
                dt, grow = timed(fn, before)
                times[k].append(dt)
                grows[k].append(grow)

        ref = {op: statistics.median(times[("in-memory", op)]) for op in ("gather_fp8", "lookup bf16")}
        print(
            f"{'backing':<22} {'op':<12} {'median ms':>10} {'x in-memory':>12} {'M rows/s':>9} {'peak RSS growth':>16}"
        )
        for (backing, op), ts in times.items():
            med = statistics.median(ts)
            print(
                f"{backing:<22} {op:<12} {med * 1e3:>10.1f} {med / ref[op]:>11.2f}x {ids.numel() / med / 1e6:>9.2f} "
                f"{max(grows[(backing, op)]) / 2**20:>13.0f} MB"
            )
        print(
            f"\nresident memory held by the table: in-memory {mem_held / 2**20:,.0f} MB, lazy {lazy_held / 2**20:,.1f} MB"
        )
        variants.clear()
        mem = None

        full = Path(tmp) / "full.safetensors"
        create_sparse_safetensors(full, {W: ("F8_E4M3", (V41_ROWS, HEAD_DIM)), S: ("F8_E8M0", (V41_ROWS, 8))})
        big = LazyTable.open(full, W, S)
        ids_big = torch.randint(0, V41_ROWS, (args.tokens, 24), generator=g)
        big.gather_fp8(ids_big[:8])
        res = [timed(lambda: big.gather_fp8(ids_big)) for _ in range(args.reps)]
        res_call = [timed(lambda: big(ids_big)) for _ in range(args.reps)]
        print(
            f"\nfull-size sparse table ({V41_ROWS:,} x {HEAD_DIM}, {full.stat().st_size / 1e9:.1f} GB logical, "
            f"{full.stat().st_blocks * 512 / 1e6:.1f} MB on disk; an in-memory table would need "
            f"{V41_ROWS * HEAD_DIM * 33 / 32 / 1e9:.1f} GB):"
        )
        for op, r in (("gather_fp8", res), ("lookup bf16", res_call)):
            print(
                f"  lazy {op:<12} median {statistics.median(x[0] for x in r) * 1e3:.1f} ms, "
                f"peak RSS growth {max(x[1] for x in r) / 2**20:.0f} MB"
            )


if __name__ == "__main__":
    main()
