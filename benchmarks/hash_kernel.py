"""The row-id hash of 1M positions in one call, side by side with the literal reference.

The reference (``reference_hash.ReferenceHash``, the reference's torch forward transcribed step
for step) hashes ``[1, N]`` raw ids in one call. Ours: ``StreamWindows`` (the look-back windows)
then ``rows_from_windows`` (the compiled kernel with numba), once into a fresh output (``N x 48``
int32: 192 MiB at 1M positions) and once into a reused ``out=``
buffer (what a caller hashing chunk after chunk does). The row ids are int32 (``row_dtype``) and a
fresh output is mapped with its pages populated (``fresh_rows``). The three outputs are asserted
identical in the same run. Times are process CPU seconds (page faults included), best of ROUNDS
interleaved rounds, and the first round on its own (each call's first in the process; its ratio
against the reference's best, the conservative side); run pinned to one core::

    taskset -c 0 .venv/bin/python benchmarks/hash_kernel.py
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from machine import cpu_features
from reference_hash import ReferenceHash

from engram_viz.analysis.corpus.row_id_kernel import compiled_rows
from engram_viz.analysis.corpus.row_ids import row_dtype, rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import EngramTokenizer

ROUNDS = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=1 << 20, help="positions hashed in the one call")
    n = parser.parse_args().positions
    cfg = load_config("v41-flash")
    layout, token_map = EngramLayout(cfg), EngramTokenizer(cfg).token_map
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, n)
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    reference = ReferenceHash(layout, token_map, 1, n)
    stream = StreamWindows(cfg, token_map)
    kernel_loaded = compiled_rows(layout) is not None  # compiled once per process, not timed
    reused = np.empty((n, len(layout.layer_ids), layout.n_hash_cols), dtype=row_dtype(layout))
    runs = {
        "reference (literal torch, one call)": lambda: reference(torch.from_numpy(ids)[None], 0).numpy()[0],
        "ours, fresh output": lambda: rows_from_windows(layout, stream(ids, starts)),
        "ours, reused out= buffer": lambda: rows_from_windows(layout, stream(ids, starts), out=reused),
    }
    best = dict.fromkeys(runs, float("inf"))
    first: dict[str, float] = {}  # each call's first round: the process's first fresh output of that size
    outputs = {}
    for _ in range(ROUNDS):
        for name, run in runs.items():
            t0 = time.process_time()
            outputs[name] = run()
            best[name] = min(best[name], time.process_time() - t0)
            first.setdefault(name, time.process_time() - t0)
            if name.startswith("reference"):
                outputs[name] = outputs[name].copy()
    want = outputs["reference (literal torch, one call)"]
    identical = all(np.array_equal(want, got) for got in outputs.values())
    assert identical, "row ids differ from the reference"
    base = best["reference (literal torch, one call)"]
    print(f"CPU: {cpu_features()}; numba kernel: {kernel_loaded}; {n:,} positions in one call, v41-flash layout")
    print(f"  {'':<38} {'best of ' + str(ROUNDS):>26}   {'first round':>24}")
    for name, s in best.items():
        f = first[name]
        print(f"  {name:<38} {s:7.3f} s CPU {n / s:>11,.0f} pos/s {base / s:5.1f}x   {f:7.3f} s CPU {base / f:5.1f}x")
    print(f"  row ids bit-identical to the reference: {identical}")


if __name__ == "__main__":
    main()
