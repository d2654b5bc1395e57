"""Attribution cost: ``explain()`` of every position of a 256-token prompt vs the plain forward, side by side.

    python benchmarks/attribution_cost.py [--tokens 256] [--reps 9] [--threads 1] [--device cpu]

On the embedded default (whatever it is: the tiny LM runs whole with its own streams), the same
prompt runs plain (``Pipeline.run``: the forward with the default capture) and attributed
(``analysis.explain.explain``: the same run with the rows and each layer's input streams
captured, then, per layer, the 24 row parts of ``wkv``, the dot and value shares, 24 + 8 + 8
re-runs of the gate arithmetic through ``engram_steps`` - rows, heads and order coalitions - and
the Shapley values, plus the decoded n-grams). Repetitions alternate so machine noise hits both
alike; printed: median times, the median of the per-pair ratios (target: under 2x) and the ratio
of the best times. The attribution's gates are asserted equal to the plain run's (variant 0 is
the module's forward; the bound allows for float32 reduction order only).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engram_viz.analysis.explain import explain
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts

TEXT_GATE_ATOL = 1e-6


def prompt_of(pipe: Pipeline, n_tokens: int) -> dict:
    """The default prompts' text joined and cut to ``n_tokens`` raw ids (BOS first)."""
    text = " ".join(p.text for p in load_prompts() if p.text and "<image" not in p.text)
    ids = pipe.tokenizer.encode(text, bos=True)
    while len(ids) < n_tokens:
        ids = ids + ids[1:]
    return {"id": "bench", "category": "bench", "input_ids": ids[:n_tokens]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    pipe = Pipeline(device=args.device)
    prompt = prompt_of(pipe, args.tokens)

    plain_trace = pipe.run([prompt])
    ex = explain(pipe, prompt)
    for li, layer in enumerate(pipe.layer_ids):
        diff = (ex.layers[layer].gate - plain_trace.gates[0, :, li]).abs().max().item()
        assert diff <= TEXT_GATE_ATOL, f"layer {layer}: attribution gate differs from the plain forward by {diff}"
        print(f"layer {layer}: max |gate(explain) - gate(plain)| = {diff:.1e}")

    plain_t, attr_t = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        pipe.run([prompt])
        t1 = time.perf_counter()
        explain(pipe, prompt)
        t2 = time.perf_counter()
        plain_t.append(t1 - t0)
        attr_t.append(t2 - t1)
    ratios = [a / p for a, p in zip(attr_t, plain_t)]
    t0 = time.perf_counter()
    ex.rows_frame()
    frames = time.perf_counter() - t0
    print(f"weights: {pipe.model_label}")
    print(f"{args.tokens} tokens, {len(pipe.layer_ids)} Engram layers, device {pipe.device}, {args.threads} thread(s)")
    print(f"plain forward    median {statistics.median(plain_t) * 1e3:8.1f} ms")
    print(f"attribution      median {statistics.median(attr_t) * 1e3:8.1f} ms")
    print(
        f"ratio            median of pairs {statistics.median(ratios):.2f}x, best times {min(attr_t) / min(plain_t):.2f}x"
    )
    print(f"(rows_frame of every position and stream, once: {frames * 1e3:.1f} ms, not in the ratio)")


if __name__ == "__main__":
    main()
