"""Capture overhead: the Engram forward with hooks capturing vs the plain forward, side by side.

    python benchmarks/capture_overhead.py [--reps 15] [--skip-v41] [--device cpu|cuda]

Per case the same inputs run plain (no hook attached: every HookPoint returns its input) and
hooked (``HookRegistry.run_with_cache`` with the names shown: hooks registered, tensors copied to
the CPU, hooks removed). Repetitions alternate plain / hooked so machine noise hits both alike;
the figures are the median times, the median of the per-pair ratios hooked / plain (target:
under 1.10x for the default capture - row ids, token mask and gates) and the ratio of the best
times (least sensitive to other load on the machine). Cases:

- ``tiny``: the tiny preset (dim 64), B=4, T=64, both Engram layers;
- ``v41``: V4.1-Flash dimensions (dim 5120, 4 streams, head_dim 256, the procedural synthetic
  table with the real row counts), B=1, T=32 (``--v41-tokens``), both Engram layers;
- ``attach``: the reference-structured test model (``tests/reference_model.py``, tiny dims) with
  ``attach`` - the instrumented forward (hooked) vs the model's own forward (plain).

The tiny table is read into memory first (the file-backed synthetic table's disk reads would only
add noise); torch runs on ``--threads`` CPU threads (default 1). Machines here are shared: read
the ratios, not the absolute times.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engram_viz.core.engram import Engram
from engram_viz.run.capture import DEFAULT_NAMES, HookRegistry
from engram_viz.weights.synthetic import synthetic_checkpoint


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def side_by_side(plain, hooked, reps: int, device: torch.device) -> tuple[float, float, float, float]:
    """Median seconds of ``plain()`` and ``hooked()`` over interleaved reps, the median of the
    per-pair ratios and the ratio of the best (minimum) times - the least noisy estimate on a
    shared machine."""
    plain(), hooked()  # warm-up
    tp, th, ratios = [], [], []
    for i in range(reps):
        pair = []
        order = (plain, hooked) if i % 2 == 0 else (hooked, plain)
        for fn in order:
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            pair.append(time.perf_counter() - t0)
        a, b = (pair[0], pair[1]) if i % 2 == 0 else (pair[1], pair[0])
        tp.append(a)
        th.append(b)
        ratios.append(b / a)
    return statistics.median(tp), statistics.median(th), statistics.median(ratios), min(th) / min(tp)


def engram_case(config_name: str, batch: int, seq: int, device: torch.device, reps: int, name_sets: dict) -> list:
    ckpt = synthetic_checkpoint(config_name, 0)
    cfg = ckpt.config
    engrams = {}
    for n in cfg.engram_layer_ids:
        w = ckpt.layer(n)
        if hasattr(w.table, "materialize"):  # small file-backed tables: keep disk reads out of the timing
            w = dataclasses.replace(w, table=w.table.materialize())
        engrams[n] = Engram.from_weights(cfg, w, mode="fp8", device=device)
    registry = HookRegistry()
    for e in engrams.values():
        registry.update(HookRegistry(e.hook_points()))
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, seq, cfg.hc_mult, cfg.dim, generator=g).to(torch.bfloat16).to(device)
    mask = torch.ones(batch, seq, dtype=torch.bool, device=device)
    ids = {
        n: torch.randint(0, cfg.engram_num_embeddings[i], (batch, seq, cfg.n_hash_cols), generator=g)
        for i, n in enumerate(cfg.engram_layer_ids)
    }

    @torch.no_grad()
    def forward():
        return [e(x, ids[n], mask) for n, e in engrams.items()]

    rows = []
    for label, names in name_sets.items():
        resolved = registry.resolve(names)

        def hooked(names=names):
            return registry.run_with_cache(forward, names, device="cpu")

        tp, th, ratio, best = side_by_side(forward, hooked, reps, device)
        rows.append((f"{config_name} B={batch} T={seq}", label, len(resolved), tp, th, ratio, best))
        assert registry.active() == {}
    return rows


def attach_case(reps: int) -> list:
    sys.path.insert(0, str(ROOT / "tests"))
    from reference_model import build, example_batch

    from engram_viz.run.attach import attach

    model = build("tiny")
    ids, types = example_batch("tiny")
    ids, types = ids.repeat(2, 1), types.repeat(2, 1)

    def plain():
        return model(ids, token_types=types)

    rows = []
    with attach(model, "tiny") as att:
        for label, names in {"default": DEFAULT_NAMES, "gate only": ["engram.*.gate"]}.items():

            def hooked(names=names):
                return att.run_with_cache(ids, token_types=types, names=names)

            tp, th, ratio, best = side_by_side(plain, hooked, reps, torch.device("cpu"))
            n = len(att.registry.resolve(names))
            rows.append((f"attach ref-model B=4 T={ids.shape[1]}", label, n, tp, th, ratio, best))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--skip-v41", action="store_true", help="skip the V4.1-Flash-size case")
    ap.add_argument("--v41-tokens", type=int, default=32, help="T of the V4.1-Flash-size case (default 32)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (default 1: steadier on a shared machine)"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    torch.manual_seed(0)
    names = {
        "default (hash_ids, token_mask, gate)": DEFAULT_NAMES,
        "gate only": ["engram.*.gate"],
        "all but key/out": [
            "engram.*.hash_ids",
            "engram.*.token_mask",
            "engram.*.rows",
            "engram.*.value",
            "engram.*.dot",
            "engram.*.gate",
        ],
        "everything (incl. key, out)": ["engram.*"],
    }
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"torch {torch.__version__}, device {device}, threads {torch.get_num_threads()}, reps {args.reps}, "
        f"{os.cpu_count()} CPUs, load average {load}"
    )
    rows = engram_case("tiny", 4, 64, device, args.reps, names)
    if not args.skip_v41:
        v41_names = {k: v for k, v in names.items() if not k.startswith("all but")}
        rows += engram_case("v41-flash", 1, args.v41_tokens, device, max(5, args.reps // 3), v41_names)
    if device.type == "cpu":
        rows += attach_case(args.reps)
    head = (
        f"{'case':<28} {'capture':<38} {'hooks':>5} {'plain ms':>9} {'hooked ms':>10} {'median ratio':>12} "
        f"{'best ratio':>10}"
    )
    print(head)
    print("-" * len(head))
    for case, label, n, tp, th, ratio, best in rows:
        print(f"{case:<28} {label:<38} {n:>5} {tp * 1e3:>9.2f} {th * 1e3:>10.2f} {ratio:>11.3f}x {best:>9.3f}x")
    default = [r[5] for r in rows if r[1].startswith("default")]
    print(f"\ndefault capture: worst median ratio {max(default):.3f}x (target < 1.10x)")


if __name__ == "__main__":
    main()
