"""Rows per second gathered from GGUF tables (Q8_0, Q4_K) against the safetensors fp8 table, side by side.

    python benchmarks/gguf_row_gather.py [--rows 1000000] [--tokens 2048] [--reps 5]

Writes three tables of ``--rows`` x 256 into a temporary folder: the safetensors fp8 table (e4m3
rows + e8m0 scales, random valid bytes; ``LazyTable``), and GGUF files at Q8_0 (272 bytes a row) and
Q4_K (144 bytes a row: one super-block), written by gguf's writer from random bytes with finite
fp16 scales (``GGUFTable``). Each rep gathers a new uniform-random prompt of ``--tokens`` x 24 ids
from every table in turn, warm (the files were read once before, so they sit in the page cache):
from machine import cpu_features
``table(ids)`` -> bf16 rows, i.e. read + dequantise (fp8: the reference lookup; GGUF: gguf's numpy
dequantiser). Reps are interleaved; the figure is the median, and the ratio to the fp8 table.
Machines here are shared: read ratios, not absolute times.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from machine import cpu_features

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engram_viz.weights.gguf_table import GGUFTable
from engram_viz.weights.safetensors import create_sparse_safetensors
from engram_viz.weights.tables import LazyTable

NAME = "blk.14.engram_embd.weight"
W, S = "layers.14.engram.embed.weight", "layers.14.engram.embed.scale"
SCALE_OFFSETS = {GGMLQuantizationType.Q8_0: (34, (0,)), GGMLQuantizationType.Q4_K: (144, (0, 2))}  # fp16 d fields


def write_gguf(path: Path, qtype: GGMLQuantizationType, rows: int, rng: np.random.Generator) -> GGUFTable:
    block, fields = SCALE_OFFSETS[qtype]
    raw = rng.integers(
        0, 256, size=(rows, 256 // (32 if qtype == GGMLQuantizationType.Q8_0 else 256) * block), dtype=np.uint8
    )
    view = raw.reshape(rows, -1, block)
    for at in fields:  # finite fp16 scales (0x2C00 = 0.0625)
        view[:, :, at], view[:, :, at + 1] = 0x00, 0x2C
    writer = GGUFWriter(None, "deepseek41")
    writer.add_tensor(NAME, raw, raw_dtype=qtype)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return GGUFTable.open(path, NAME)


def write_fp8(path: Path, rows: int, rng: np.random.Generator) -> LazyTable:
    create_sparse_safetensors(path, {W: ("F8_E4M3", (rows, 256)), S: ("F8_E8M0", (rows, 8))})
    table = LazyTable.open(path, W, S)
    w = rng.integers(0, 0x7F, size=(rows, 256), dtype=np.uint8)  # finite e4m3 bytes
    s = np.full((rows, 8), 120, dtype=np.uint8)
    with open(path, "r+b") as f:
        f.seek(table.weight.parts[0].start)
        f.write(w.tobytes())
        f.seek(table.scale.parts[0].start)
        f.write(s.tobytes())
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        tables = {
            "safetensors fp8 (LazyTable)": write_fp8(Path(tmp) / "t.safetensors", args.rows, rng),
            "GGUF Q8_0 (GGUFTable)": write_gguf(Path(tmp) / "q8.gguf", GGMLQuantizationType.Q8_0, args.rows, rng),
            "GGUF Q4_K (GGUFTable)": write_gguf(Path(tmp) / "q4k.gguf", GGMLQuantizationType.Q4_K, args.rows, rng),
        }
        for t in tables.values():  # warm: every file through the page cache once, the read engine compiled
            t(torch.arange(args.rows).reshape(-1, 1000)[:: max(1, args.rows // 100_000)])
        times: dict[str, list[float]] = {k: [] for k in tables}
        for rep in range(args.reps):
            ids = torch.randint(0, args.rows, (1, args.tokens, 24), generator=torch.Generator().manual_seed(rep))
            for name, t in tables.items():
                start = time.perf_counter()
                t(ids)
                times[name].append(time.perf_counter() - start)
    n = args.tokens * 24
    base = statistics.median(times["safetensors fp8 (LazyTable)"])
    print(f"{args.rows:,} rows x 256, {n:,} ids a gather (uniform), warm page cache, median of {args.reps}")
    print(f"CPU features: {cpu_features()}; torch {torch.__version__}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:<30} {med * 1e3:8.1f} ms  {n / med / 1e6:6.2f} M rows/s  x{med / base:5.2f} of fp8 time")


if __name__ == "__main__":
    main()
