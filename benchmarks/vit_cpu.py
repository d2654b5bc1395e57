"""The vision encoder (ViT + aligner) at V4.1-Flash widths on this CPU: time and peak memory per picture.

    python benchmarks/vit_cpu.py [--sizes 640x480 1920x1080] [--threads 2]

Weights are procedural (``weights.vision_synthetic.ProceduralVision``: the reference's names, dtypes
and shapes at V4.1-Flash widths: 32 blocks of width 1024, 16 heads, MLP 2816, patch 14, downsample 3,
aligner to 5120; drawn once, about 0.97 GB in bf16). Each size is a gradient picture made here,
pre-processed as the reference does (``run.pictures.load_picture``), then encoded once
(``core.image_merge.encode_image``, bf16 as the reference runs it): one run per size, since the
machines here are shared (2 cores) and one run of the larger picture takes minutes.

Printed, in one run: the CPU's features (AVX2 / AVX512-BF16 / AMX-BF16: oneDNN's bf16 GEMMs are
fast only with the latter two), the set-up (drawing the weights), then per size the grid, the wall
and CPU time of pre-processing and of the encoder, and the resident set size (VmRSS sampled every
5 ms) before and at its peak during the encoder. Results: ``benchmarks/results/vit_cpu.txt``.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
import zlib
from pathlib import Path

import torch
from machine import cpu_features
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from block0_streams import GIB, PeakRSS, rss_bytes  # the one RSS sampler of the benchmarks

from engram_viz.core.image_merge import encode_image
from engram_viz.core.schema import vision_tensors
from engram_viz.core.vision_config import V41_FLASH_VISION
from engram_viz.run.pictures import load_picture
from engram_viz.weights.vision_synthetic import ProceduralVision


def picture(width: int, height: int) -> bytes:
    x = torch.linspace(0, 255, width).view(1, -1, 1).expand(height, width, 1)
    y = torch.linspace(0, 255, height).view(-1, 1, 1).expand(height, width, 1)
    rgb = torch.cat([x, y, (x + y) / 2], -1).round().to(torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return buf.getvalue()


def cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


class BlockClock:
    """Prints the wall and CPU time as each ViT block starts (when its first weight is asked for), so a
    long run shows its pace; a ``with`` block around one encoder call."""

    def __init__(self, src: ProceduralVision, t0: float, c0: float):
        self.src, self.t0, self.c0, self.tensor = src, t0, c0, src.tensor

    def _tensor(self, name: str) -> torch.Tensor:
        if name.endswith(".norm1.weight"):
            print(
                f"  {name.split('.')[2]:>2}: {time.perf_counter() - self.t0:7.1f} s wall, "
                f"{cpu_seconds() - self.c0:7.1f} s CPU",
                flush=True,
            )
        return self.tensor(name)

    def __enter__(self) -> None:
        self.src.tensor = self._tensor

    def __exit__(self, *exc) -> None:
        self.src.tensor = self.tensor


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", nargs="+", default=["640x480", "1920x1080"])
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = V41_FLASH_VISION
    print(
        f"ViT + aligner, V4.1-Flash widths ({cfg.vision_n_layers} blocks x {cfg.vision_dim}, {cfg.vision_n_heads} heads, "
        f"MLP {cfg.vision_inter_dim}, -> {cfg.dim}), bf16, {args.threads} torch threads, torch {torch.__version__}"
    )
    print(f"CPU: {cpu_features()}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}")
    start_rss = rss_bytes()
    t0, c0 = time.perf_counter(), cpu_seconds()
    src = ProceduralVision(cfg, lambda name: torch.Generator().manual_seed(zlib.crc32(name.encode())), "procedural")
    for name in vision_tensors(cfg):  # draw every tensor now, so the passes below time the encoder only
        src.tensor(name)
    print(
        f"set-up (weights drawn): {time.perf_counter() - t0:.1f} s wall, {cpu_seconds() - c0:.1f} s CPU, "
        f"RSS {start_rss / GIB:.2f} -> {rss_bytes() / GIB:.2f} GiB"
    )
    for size in args.sizes:
        w, h = (int(v) for v in size.split("x"))
        data = picture(w, h)
        t0, c0 = time.perf_counter(), cpu_seconds()
        pic = load_picture(data, "v41-flash")
        prep = (time.perf_counter() - t0, cpu_seconds() - c0)
        plan = pic.plan
        before = rss_bytes()
        t0, c0 = time.perf_counter(), cpu_seconds()
        with PeakRSS() as peak, BlockClock(src, t0, c0):
            out = encode_image(src, pic.patches, plan.vit_h, plan.vit_w)
        wall, cpu = time.perf_counter() - t0, cpu_seconds() - c0
        print(
            f"{w}x{h}: canvas {plan.canvas_w}x{plan.canvas_h}, {plan.vit_h}x{plan.vit_w} = {plan.vit_h * plan.vit_w} "
            f"patches -> {plan.w}x{plan.h} = {out.shape[0]} image tokens [{out.shape[0]}, {out.shape[1]}] {out.dtype}; "
            f"pre-processing {prep[0]:.2f} s wall ({prep[1]:.2f} s CPU); encoder {wall:.1f} s wall ({cpu:.1f} s CPU); "
            f"RSS {before / GIB:.2f} GiB before, peak {peak.peak / GIB:.2f} GiB (+{(peak.peak - before) / GIB:.2f})"
        )


if __name__ == "__main__":
    main()
