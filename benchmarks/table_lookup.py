"""The table lookup (row ids -> dequantised bf16 rows) against the reference's arithmetic, side by side in one run.

    python benchmarks/table_lookup.py [--rows 2000000] [--tokens 4096] [--reps 7] [--ids real|uniform]

One in-memory table (``--rows`` x 256 e4m3, random valid bytes, e8m0 scales 2**-7..2**7) and the row
ids of ``--tokens``-token prompts (x 24 ids a token): ``real`` (the default corpus hashed for
V4.1-Flash's first Engram layer, folded into the table's rows: frequent n-grams repeat) or
``uniform``. Three ways, each rep on a new prompt, interleaved:

- ``reference``: ``ParallelEngramEmbedding.forward`` of the reference (world size 1) as
  ``tests/reference_model.py`` transcribes it: ``F.embedding`` of weight and scale, float32
  multiply per 32 features, bf16;
- ``library, arithmetic``: ``InMemoryTable.__call__`` with the dequantisation done by the same
  float32 arithmetic (``fp8._rows_by_arithmetic``, the path before the lookup table and still the
  path off the CPU);
- ``library``: ``InMemoryTable.__call__`` as it runs on a CPU (``fp8._rows_by_table``: each value
  read from the 65,536-entry table of every (scale byte, weight byte) pair).

All three outputs are asserted bit-identical on every prompt. Printed: median ms, M ids/s and the
speed-up over the reference. Machines here are shared: read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engram_viz.core import fp8
from engram_viz.weights.tables import InMemoryTable

HEAD_DIM, BLOCK = 256, 32


def reference_table(weight: torch.Tensor, scale: torch.Tensor):
    """The reference's ``ParallelEngramEmbedding`` (world size 1) as ``tests/reference_model.py``
    transcribes it line for line, holding ``weight`` and ``scale``."""
    sys.path.insert(0, str(ROOT / "tests"))
    from reference_model import ParallelEngramEmbedding

    table = ParallelEngramEmbedding(weight.shape[0], weight.shape[1])
    table.weight.data, table.scale.data = weight, scale
    return table


def library_arithmetic(table: InMemoryTable, ids: torch.Tensor) -> torch.Tensor:
    """``table(ids)`` with dequantisation by float32 arithmetic instead of the lookup table."""
    by_table = fp8._rows_by_table
    fp8._rows_by_table = fp8._rows_by_arithmetic
    try:
        return table(ids)
    finally:
        fp8._rows_by_table = by_table


def prompt_ids(kind: str, n: int, tokens: int, rows: int) -> torch.Tensor:
    """``[n, 1, tokens, 24]`` row ids of the table."""
    if kind == "real":
        from row_gather import real_text_ids

        return torch.as_tensor(real_text_ids(n, tokens) % rows).unsqueeze(1)
    return torch.randint(0, rows, (n, 1, tokens, 24), generator=torch.Generator().manual_seed(0))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--ids", choices=("real", "uniform"), default="real")
    args = ap.parse_args()
    g = torch.Generator().manual_seed(1)
    weight = (torch.randint(0, 256, (args.rows, HEAD_DIM), dtype=torch.uint8, generator=g) & 0xF7).view(
        torch.float8_e4m3fn
    )  # bit 3 clear: never NaN
    scale = torch.randint(120, 135, (args.rows, HEAD_DIM // BLOCK), dtype=torch.uint8, generator=g).view(
        torch.float8_e8m0fnu
    )
    table = InMemoryTable(weight, scale)
    prompts = prompt_ids(args.ids, args.reps + 1, args.tokens, args.rows)
    ways = {
        "reference (transcribed)": reference_table(weight, scale),
        "library, arithmetic": lambda ids: library_arithmetic(table, ids),
        "library": table,
    }
    times: dict[str, list[float]] = {name: [] for name in ways}
    for rep, ids in enumerate(prompts):
        outs = {}
        order = list(ways.items())
        for name, fn in order if rep % 2 else order[::-1]:
            t = time.perf_counter()
            outs[name] = fn(ids)
            if rep:  # the first prompt warms up
                times[name].append(time.perf_counter() - t)
        ref = outs["reference (transcribed)"].view(torch.int16)
        for name, out in outs.items():
            assert torch.equal(out.view(torch.int16), ref), f"{name} differs from the reference on prompt {rep}"
    n_ids = prompts[0].numel()
    unique = statistics.mean(len(np.unique(p.numpy())) for p in prompts[1:])
    print(
        f"table {args.rows:,} x {HEAD_DIM} e4m3 + scales in memory; {args.ids} ids: {n_ids:,} a prompt ({unique:,.0f} "
        f"unique on average), {args.reps} prompts; outputs bit-identical on every prompt; {os.cpu_count()} CPUs, load "
        f"{os.getloadavg()[0]:.1f}; torch {torch.__version__} ({torch.get_num_threads()} intra-op threads)"
    )
    ref = statistics.median(times["reference (transcribed)"])
    print(f"{'way':<26} {'median ms':>10} {'M ids/s':>8} {'x reference speed':>18}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<26} {med * 1e3:10.1f} {n_ids / med / 1e6:8.2f} {ref / med:17.2f}x")


if __name__ == "__main__":
    main()
