"""Evidence for the tiny Engram LM (issues 7 and 11), written into ``data/tiny-engram/MODEL_CARD.md``.

Reads the run folders written by ``engram-viz train-tiny`` (``metrics.json`` in each):

    RUNS/engram-s{0,1,2}     the committed recipe, seeds 0-2 (seed 0 is the committed model)
    RUNS/noengram-s{0,1,2}   the same architecture and recipe with --no-engram
    RUNS/retrain-s0          the committed command run again (reproduction check)

and measures on the committed weights (``data/tiny-engram``, the exported fp8 model):

- held-out loss with Engram open vs every gate forced to 0 through the ``engram.L{n}.gate`` hooks,
  per seed, against the spread over seeds and against the no-Engram architecture;
- per seed, the gate-versus-memory analysis (``engram_viz.analysis.gates.gate_memory``) on held-out
  positions grouped by how often the seed's run read their n-gram (the compressed trigram ending
  there) in its training batches: often (>= 20), seldom (1-19), never (0), and on random-token control
  sequences (tokens drawn uniformly from the model's vocabulary); the Spearman correlation of gate
  and log(1 + count); per group the next-token loss the open gates save (gates forced to 0 minus
  open, both Engram layers together); and the three target figures for the bigram, trigram and
  4-gram ending at each position.

Usage: ``python benchmarks/tiny_model_eval.py --runs out/tiny-runs [--card data/tiny-engram/MODEL_CARD.md]``
(prints the section; ``--card`` also replaces the text between the card's eval markers).
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import pandas as pd
import torch

from engram_viz.analysis.gates.gate_memory import (
    GROUPS,
    RANDOM_CATEGORY,
    gate_count_curve,
    gate_memory_summary,
    memory_targets,
    training_counts,
    windows_memory_frame,
)
from engram_viz.tiny.data import build_corpus, heldout_windows
from engram_viz.tiny.files import load_tiny_model
from engram_viz.tiny.model import engram_config
from engram_viz.tiny.position_scores import probe_windows, random_windows
from engram_viz.tiny.train import TrainSettings
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD

BEGIN, END = "<!-- eval:begin -->", "<!-- eval:end -->"
N_HELD, N_RANDOM = 160, 64  # windows of the gate analysis per seed
ORDERS, ORDER = (2, 3, 4), 3  # n-gram orders tabled; the order of the main table (as the report)


def _metrics(folder: Path) -> dict | None:
    f = folder / "metrics.json"
    return json.loads(f.read_text()) if f.is_file() else None


def seed_gate_frames(folder: Path, corpus, n_held: int, n_random: int, seq_len: int) -> dict[int, pd.DataFrame]:
    """Held-out windows (evenly spread) and random-token windows (uniform over the model's known
    raw ids, seed 0) through one run's exported model: one ``analysis.gates.gate_memory`` frame per
    n-gram order, counted against what this run read in training."""
    model = load_tiny_model(folder)
    counts = training_counts(model.config, model.provenance, str(folder))
    held = heldout_windows(corpus.heldout, seq_len, n_held)
    rnd = random_windows(corpus.raw_ids, n_random, seq_len + 1, seed=0)
    probes = {"heldout": (held, probe_windows(model, held)), RANDOM_CATEGORY: (rnd, probe_windows(model, rnd))}
    return {
        order: pd.concat(
            [windows_memory_frame(model, w, counts, cat, order, probe=p) for cat, (w, p) in probes.items()],
            ignore_index=True,
        )
        for order in ORDERS
    }


def order_lines(frames: dict[int, dict[int, pd.DataFrame]]) -> list[str]:
    """Per seed, layer and n-gram order: the three target figures (the gate is one number per
    position for all orders; which order's count it follows best is a finding, not a choice)."""
    lines = ["| seed | layer | order | often (n) | often - random | often - never | Spearman | targets met |"]
    lines.append("|---|---|---|---|---|---|---|---|")
    for seed, by_order in frames.items():
        rows = []
        for order, frame in by_order.items():
            summary = gate_memory_summary(frame)
            _, rho = gate_count_curve(frame)
            n = summary[summary["group"].astype(str) == "often"].set_index("layer")["n"]
            for _, t in memory_targets(summary, rho).iterrows():
                rows.append((int(t.layer), order, t, int(n.get(t.layer, 0))))
        for layer, order, t, n in sorted(rows, key=lambda r: (r[0], r[1])):
            lines.append(
                f"| {seed} | {layer} | {order} | {n:,} | {t.often_minus_random:+.3f} | {t.often_minus_never:+.3f}"
                f" | {t.spearman:.3f} | {'**yes**' if t.met else 'no'} |"
            )
    return lines


def gate_lines(frames: dict[int, pd.DataFrame]) -> list[str]:
    """Per seed and layer: mean gate per memory group, loss saved, the three target figures."""
    lines = [
        (
            "| seed | layer | often (>= 20x) | seldom (1-19x) | never | random tokens | often - random | often - never "
            "| Spearman | random highest? | targets met |"
        ),
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    saved = ["| seed | often | seldom | never | random tokens |", "|---|---|---|---|---|"]
    for seed, frame in frames.items():
        summary = gate_memory_summary(frame)
        _, rho = gate_count_curve(frame)
        targets = memory_targets(summary, rho).set_index("layer")
        for layer, g in summary.groupby("layer"):
            m = dict(zip(g["group"].astype(str), g["mean_gate"]))
            n = dict(zip(g["group"].astype(str), g["n"]))
            t = targets.loc[layer]
            cells = [f"{m[k]:.3f} (n={n[k]:,})" for k in GROUPS]
            lines.append(
                f"| {seed} | {layer} | "
                + " | ".join(cells)
                + f" | {t.often_minus_random:+.3f} | {t.often_minus_never:+.3f}"
                f" | {t.spearman:.3f} | {'yes' if t.random_highest else 'no'} | {'**yes**' if t.met else 'no'} |"
            )
        first = summary[summary["layer"] == summary["layer"].min()]
        saved.append(f"| {seed} | " + " | ".join(f"{x:+.3f}" for x in first["loss_saved"]) + " |")
    return [
        *lines,
        "",
        "Next-token loss saved by the open gates (gates forced to 0 minus open, nats, mean per group):",
        "",
        *saved,
    ]


def _spread(xs: list[float]) -> tuple[float, float, float]:
    return statistics.mean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0), max(xs) - min(xs)


def _runs(eng: dict, noe: dict, re_run: dict | None) -> list[tuple[str, dict | None]]:
    return [
        *((f"engram-s{s}", m) for s, m in eng.items()),
        *((f"noengram-s{s}", m) for s, m in noe.items()),
        ("retrain-s0", re_run),
    ]


def build_section(runs: Path, model_dir: Path) -> str:
    eng = {s: _metrics(runs / f"engram-s{s}") for s in range(3)}
    noe = {s: _metrics(runs / f"noengram-s{s}") for s in range(3)}
    re_run = _metrics(runs / "retrain-s0")
    committed = json.loads((model_dir / "metrics.json").read_text())
    lines = ["### Held-out loss (nats/token, exported fp8 weights; float32 training weights in brackets)", ""]
    lines.append("| seed | Engram open | Engram gates forced to 0 (hooks) | same architecture trained without Engram |")
    lines.append("|---|---|---|---|")
    open_, shut, none = [], [], []
    for s in range(3):
        e, n = eng[s], noe[s]
        cells = [str(s)]
        if e:
            open_.append(e["heldout_fp8"])
            shut.append(e["heldout_fp8_gates_shut"])
            cells += [
                f"{e['heldout_fp8']:.4f} ({e['heldout_float']:.4f})",
                f"{e['heldout_fp8_gates_shut']:.4f} ({e['heldout_float_gates_shut']:.4f})",
            ]
        else:
            cells += ["not run", "not run"]
        if n:
            none.append(n["heldout_fp8"])
            cells.append(f"{n['heldout_fp8']:.4f} ({n['heldout_float']:.4f})")
        else:
            cells.append("not run")
        lines.append("| " + " | ".join(cells) + " |")
    summary = []
    for label, xs in (("Engram open", open_), ("gates forced to 0", shut), ("no Engram", none)):
        if xs:
            m, sd, rg = _spread(xs)
            summary.append(f"{label}: mean {m:.4f}, std {sd:.4f}, range (max - min) {rg:.4f} over {len(xs)} seeds")
    lines += ["", *[f"- {s}" for s in summary]]
    if open_ and shut:
        margins = [b - a for a, b in zip(open_, shut)]
        spread = max(_spread(open_)[2], _spread(shut)[2])
        verdict = "larger" if min(margins) > spread else "NOT larger"
        lines.append(
            f"- Gates forced shut cost {statistics.mean(margins):.4f} nats/token on average "
            f"(smallest over seeds {min(margins):.4f}); the largest seed range of those two columns is "
            f"{spread:.4f}: the margin is **{verdict}** than the seed spread."
        )
    if open_ and none:
        d = statistics.mean(none) - statistics.mean(open_)
        sp = max(_spread(open_)[2], _spread(none)[2])
        lines.append(
            f"- Trained without Engram the same architecture ends {d:+.4f} nats/token "
            f"{'above' if d > 0 else 'below'} the Engram model (seed range {sp:.4f}): Engram "
            + ("helps by more than the seed spread." if d > sp else "does not help by more than the seed spread.")
        )
    if re_run:
        a, b = committed["heldout_fp8"], re_run["heldout_fp8"]
        same = all(
            (runs / "retrain-s0" / f).read_bytes() == (model_dir / f).read_bytes() for f in (LM_SHARD, ENGRAM_SHARD)
        )
        lines.append(
            f"- Reproduction: the committed weights score {a:.4f}; retraining with the committed command "
            f"scored {b:.4f}, a relative difference of {abs(b - a) / a * 100:.3f}% (bound: 2%)"
            + ("; the retrained shards are byte-identical to the committed ones." if same else ".")
        )
    walls = {name: m["train_wall_s"] for name, m in _runs(eng, noe, re_run) if m}
    if walls:
        lines.append(
            "- Training wall time (1 thread each, two runs at a time on the shared 2-core machine while "
            "other jobs ran, so each got a varying fraction of a core): "
            + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items())
            + "."
        )

    settings = TrainSettings(**committed["settings"])
    torch.set_num_threads(settings.threads)
    config = engram_config(settings.engram_vocab_size)
    corpus = build_corpus(config, settings.vocab_rows)
    frames = {
        s: seed_gate_frames(runs / f"engram-s{s}", corpus, N_HELD, N_RANDOM, settings.seq_len)
        for s in range(3)
        if eng[s]
    }
    lines += [
        "",
        (
            f"### Gate versus memory, per seed (mean gate over the 4 streams; {N_HELD} held-out windows, "
            f"{N_RANDOM} random-token windows of {settings.seq_len} tokens; count: how often the seed's run "
            f"read the trigram ending at the position)"
        ),
        "",
    ]
    lines += gate_lines({s: f[ORDER] for s, f in frames.items()})
    lines += ["", "The three targets for every n-gram order of the position (2 = the bigram ending there, ...):", ""]
    lines += order_lines(frames)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default="out/tiny-runs")
    ap.add_argument("--model", default=str(DEFAULT_DIR))
    ap.add_argument("--card", default=None, help="MODEL_CARD.md whose eval section to replace")
    args = ap.parse_args()
    section = build_section(Path(args.runs), Path(args.model))
    print(section)
    if args.card:
        card = Path(args.card)
        text = card.read_text()
        if BEGIN not in text or END not in text:
            raise SystemExit(f"{card} has no {BEGIN} ... {END} markers")
        head, rest = text.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        tmp = card.with_suffix(".tmp")
        tmp.write_text(f"{head}{BEGIN}\n{section}\n{END}{tail}")
        tmp.replace(card)


if __name__ == "__main__":
    main()
