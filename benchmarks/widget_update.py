"""Prompt-comparison widget: how long one update takes for a 256-token prompt pair, CPU.

    python benchmarks/widget_update.py [--reps 9] [--tokens 256] [--checkpoint PATH]

One ``PromptComparison`` on one Pipeline (the embedded default unless ``--checkpoint``), then,
repeated and interleaved so that machine noise hits every case alike:

- ``pair cold``: both prompts new (neither cached): tokenize, one batched forward, tidy frames,
  token views, alignment and difference view - what the widget does when both boxes change;
- ``one prompt edited``: prompt B changes one word (A cached) - what typing in one box costs;
- ``layer / stream / view switch``: nothing reruns, every panel is redrawn;
- ``pipeline only``: ``Pipeline.run`` of the same pair, the floor the widget builds on, with the
  process's torch threads and with one thread (what the widget uses for a small model on the CPU).

Prints median and best times and the ratio widget / pipeline. Target: a pair-cold update under
300 ms on this machine's CPU. Machines here are shared and noisy (other jobs run beside this);
best-of times are the least disturbed.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch

from engram_viz.apps.widget import PromptComparison
from engram_viz.run.pipeline import Pipeline

WORDS = [
    "the",
    "early",
    "bird",
    "caught",
    "the",
    "worm",
    "while",
    "Alexander",
    "the",
    "Great",
    "rode",
    "across",
    "the",
    "Milky",
    "Way",
    "and",
    "Sir",
    "Isaac",
    "Newton",
    "wrote",
    "the",
    "Principia",
    "Mathematica",
    "in",
    "a",
    "quiet",
    "room",
    "by",
    "the",
    "river",
]


def text_of(pipe, n_tokens: int, seed: int) -> str:
    """A text of exactly-ish ``n_tokens`` tokens (BOS included), different for every seed."""
    words, k = [], seed
    while True:
        words.append(WORDS[k % len(WORDS)] + (str(seed) if k % 17 == 0 else ""))
        k += 7
        text = " ".join(words)
        if len(pipe.build([text])[0].input_ids) >= n_tokens:
            return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument(
        "--checkpoint", default=None, help="checkpoint folder (default: $ENGRAM_VIZ_CHECKPOINT or the embedded default)"
    )
    args = ap.parse_args()

    t0 = time.perf_counter()
    pipe = Pipeline(args.checkpoint)  # None: $ENGRAM_VIZ_CHECKPOINT, else the embedded default
    print(f"model: {pipe.model_label}")
    print(
        f"device {pipe.device}, torch threads {torch.get_num_threads()}, cores {os.cpu_count()}; "
        f"pipeline loaded in {time.perf_counter() - t0:.1f} s"
    )
    texts = [
        (text_of(pipe, args.tokens, 2 * i + 1), text_of(pipe, args.tokens, 2 * i + 2)) for i in range(args.reps + 1)
    ]
    n_a = len(pipe.build([texts[0][0]])[0].input_ids)
    cmp = PromptComparison(texts[0], pipeline=pipe)  # warm-up (first run, imports)
    times: dict[str, list[float]] = {
        k: []
        for k in (
            "pair cold",
            "one prompt edited",
            "layer/stream/view switch",
            "pipeline only",
            "pipeline only, 1 thread",
        )
    }
    for i in range(1, args.reps + 1):
        a, b = texts[i]
        t = time.perf_counter()
        cmp.set_prompts(a, b)
        times["pair cold"].append(time.perf_counter() - t)
        assert cmp.messages == {"A": None, "B": None}, cmp.messages

        t = time.perf_counter()
        cmp.set_prompts(a, b.replace("the", "a", 1) + f" edit{i}")
        times["one prompt edited"].append(time.perf_counter() - t)

        t = time.perf_counter()
        cmp.layer = pipe.layer_ids[i % len(pipe.layer_ids)]
        cmp.stream = i % pipe.config.hc_mult
        cmp.view = "all gates" if i % 2 else "tokens"
        times["layer/stream/view switch"].append((time.perf_counter() - t) / 3)

        t = time.perf_counter()
        pipe.run([{"id": "a", "text": a + " x"}, {"id": "b", "text": b + " x"}])
        times["pipeline only"].append(time.perf_counter() - t)

        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        t = time.perf_counter()
        pipe.run([{"id": "a", "text": a + " y"}, {"id": "b", "text": b + " y"}])
        times["pipeline only, 1 thread"].append(time.perf_counter() - t)
        torch.set_num_threads(threads)

    print(f"\n{args.reps} reps, prompt pair of {n_a} tokens each (BOS included)\n")
    print(f"{'case':28s} {'median ms':>10s} {'best ms':>10s}")
    for k, v in times.items():
        print(f"{k:28s} {1000 * statistics.median(v):10.1f} {1000 * min(v):10.1f}")
    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    floor = "pipeline only, 1 thread" if cmp.torch_threads == 1 else "pipeline only"
    print(
        f"\nwidget pair-cold / {floor}: {med['pair cold'] / med[floor]:.2f}x median, "
        f"{best['pair cold'] / best[floor]:.2f}x best (widget forward threads: {cmp.torch_threads or 'as set'})"
    )
    verdict = "under" if best["pair cold"] < 0.3 else "OVER"
    print(
        f"target: pair-cold update < 300 ms -> best {1000 * best['pair cold']:.0f} ms, "
        f"median {1000 * med['pair cold']:.0f} ms: {verdict} target (best)"
    )
    print(f"load average now: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
