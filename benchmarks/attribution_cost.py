"""Attribution cost: ``explain()`` of every position of a 256-token prompt vs the plain forward, side by side.

    python benchmarks/attribution_cost.py [--tokens 256] [--reps 9] [--threads 1] [--device cpu]

On the embedded default (whatever it is: the tiny LM runs whole with its own streams), the same
prompt runs plain (``Pipeline.run``: the forward with the default capture) and attributed
(``analysis.explain.explain``: the same run with the rows, key, value and dot captured and each
layer's input streams read, then, per layer, the 24 row parts of ``wkv`` (one batched GEMM), the
dot and value shares of every position, and the decoded n-grams). The left-out gates and Shapley
values are computed when asked, for the positions asked (``LayerAttribution.left_out``): timed
here too, for one position (what ``engram-viz explain`` and the widget ask) and for all 256 (40
re-runs of the gate arithmetic per position and layer: 24 rows, 8 heads, 7 order coalitions and
the gate itself). Repetitions alternate so machine noise hits all alike; printed: median wall
times, the median of the per-repetition ratios to the plain forward (target for ``explain``:
under 2x), the ratio of the best times, and the same ratio in process CPU time (steadier on a
shared machine). The attribution's gates are asserted identical to the plain run's (the module's
own, captured) and the left-out gates' full coalition equal to them.
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

from engram_viz.analysis.explain.explanation import explain
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts


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
        a = ex.layers[layer]
        assert torch.equal(a.gate, plain_trace.gates[0, :, li]), f"layer {layer}: gates differ from the plain run"
        assert torch.equal(a.left_out([3]).coalitions[0, -1], a.gate[3])
        print(f"layer {layer}: gate(explain) == gate(plain) at all {a.gate.numel()} (position, stream)s")

    runs = {
        "plain forward": lambda: pipe.run([prompt]),
        "explain (shares)": lambda: explain(pipe, prompt),
        "+ left-out, 1 position": lambda: [
            a.left_out([args.tokens // 2]) for a in explain(pipe, prompt).layers.values()
        ],
        "+ left-out, all": lambda: [a.left_out() for a in explain(pipe, prompt).layers.values()],
    }
    wall: dict[str, list[float]] = {k: [] for k in runs}
    cpu: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.reps):
        for name, fn in runs.items():
            w0, c0 = time.perf_counter(), time.process_time()
            fn()
            wall[name].append(time.perf_counter() - w0)
            cpu[name].append(time.process_time() - c0)
    print(f"weights: {pipe.model_label}")
    print(f"{args.tokens} tokens, {len(pipe.layer_ids)} Engram layers, device {pipe.device}, {args.threads} thread(s)")
    base = "plain forward"
    for name in runs:
        pairs = statistics.median(a / p for a, p in zip(wall[name], wall[base]))
        best = min(wall[name]) / min(wall[base])
        cpu_ratio = statistics.median(a / p for a, p in zip(cpu[name], cpu[base]))
        print(
            f"{name:24s} median {statistics.median(wall[name]) * 1e3:7.1f} ms   ratio: median of pairs {pairs:.2f}x,"
            f" best times {best:.2f}x, cpu time {cpu_ratio:.2f}x"
        )
    t0 = time.perf_counter()
    ex.rows_frame()
    print(
        f"(rows_frame of every position and stream, left-out gates included, once: {(time.perf_counter() - t0) * 1e3:.1f} ms)"
    )


if __name__ == "__main__":
    main()
