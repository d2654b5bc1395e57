"""Evidence for the tiny Engram LM (issue 7), written into ``data/tiny-engram/MODEL_CARD.md``.

Reads the run folders written by ``engram-viz train-tiny`` (``metrics.json`` in each):

    RUNS/engram-s{0,1,2}     the committed recipe, seeds 0-2 (seed 0 is the committed model)
    RUNS/noengram-s{0,1,2}   the same architecture and recipe with --no-engram
    RUNS/retrain-s0          the committed command run again (reproduction check)

and measures on the committed weights (``data/tiny-engram``, the exported fp8 model):

- held-out loss with Engram open vs every gate forced to 0 through the ``engram.L{n}.gate`` hooks,
  per seed, against the spread over seeds and against the no-Engram architecture;
- gate statistics on held-out positions grouped by how often their n-gram (the compressed
  trigram ending there) occurs in the training stream: often (>= 50), rare (1-4), unseen (0),
  and on random-token control sequences (tokens drawn uniformly from the model's vocabulary);
  per group also the next-token loss the open gates save there (gates forced to 0 minus open,
  both Engram layers together).

Usage: ``python benchmarks/tiny_model_eval.py --runs out/tiny-runs [--card data/tiny-engram/MODEL_CARD.md]``
(prints the section; ``--card`` also replaces the text between the card's eval markers).
"""

from __future__ import annotations

import argparse
import json
import statistics
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import torch

from engram_viz.tiny.data import build_corpus, heldout_windows
from engram_viz.tiny.files import load_tiny_model
from engram_viz.tiny.model import gates_forced
from engram_viz.tiny.train import TrainSettings
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD

BEGIN, END = "<!-- eval:begin -->", "<!-- eval:end -->"
OFTEN, RARE = 50, (1, 4)


def _metrics(folder: Path) -> dict | None:
    f = folder / "metrics.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _ngram_keys(c: np.ndarray, n: int) -> np.ndarray:
    """int64 key of the compressed n-gram ending at each position (first n-1 positions: -1)."""
    v = 99092
    key = np.zeros(len(c), dtype=np.int64)
    for s in range(n):
        key[n - 1 :] = key[n - 1 :] * v + c[n - 1 - s : len(c) - s]
    key[: n - 1] = -1
    return key


@torch.no_grad()
def gate_table(model, corpus, seq_len: int, n: int = 3, seed: int = 0) -> list[dict]:
    """Mean gate (over streams) per layer and n-gram frequency group on held-out windows, plus
    random-token controls of the same size."""
    tm = model.token_map
    train_keys = _ngram_keys(tm[corpus.train.numpy()], n)
    uniq, counts = np.unique(train_keys[train_keys >= 0], return_counts=True)
    windows = heldout_windows(corpus.heldout, seq_len)[:, :-1]
    g = torch.Generator().manual_seed(seed)
    vocab = model.raw_ids[1:]
    controls = vocab[torch.randint(0, len(vocab), windows.shape, generator=g)]
    groups: dict[str, dict[int, list[np.ndarray]]] = {}
    layers = [int(k) for k in model.engrams]
    full = heldout_windows(corpus.heldout, seq_len)
    target = model.index_ids(full[:, 1:])
    nll = {}
    for shut in (False, True):
        parts = []
        with gates_forced(model, 0.0) if shut else nullcontext():
            for i in range(0, len(full), 64):
                logp = model(full[i : i + 64, :-1]).log_softmax(-1)
                parts.append(-logp.gather(-1, target[i : i + 64, :, None])[..., 0])
        nll[shut] = torch.cat(parts).numpy()
    gain = nll[True] - nll[False]  # [N, T]: nats the open gates save at each held-out position
    for name, data in (("held-out", windows), ("random tokens", controls)):
        gates: dict[int, list[torch.Tensor]] = {k: [] for k in layers}
        handles = [
            e.hook_gate.add_hook(lambda t, _n, k=int(k), store=gates: store[k].append(t.mean(-1).cpu()))
            for k, e in model.engrams.items()
        ]
        try:
            for i in range(0, len(data), 64):
                model(data[i : i + 64])
        finally:
            for h in handles:
                h.remove()
        gl = {k: torch.cat(v).numpy() for k, v in gates.items()}  # [N, T]
        if name == "random tokens":
            sel = np.zeros(gl[layers[0]].shape, dtype=bool)
            sel[:, n - 1 :] = True
            groups["random-token control"] = {k: [gl[k][sel]] for k in layers}
            continue
        keys = np.stack([_ngram_keys(tm[w.numpy()], n) for w in data])
        pos = np.searchsorted(uniq, keys)
        pos = np.clip(pos, 0, len(uniq) - 1)
        cnt = np.where((uniq[pos] == keys) & (keys >= 0), counts[pos], 0)
        valid = keys >= 0
        masks = {
            f"held-out, {n}-gram seen >= {OFTEN}x in training": valid & (cnt >= OFTEN),
            f"held-out, {n}-gram seen {RARE[0]}-{RARE[1]}x": valid & (cnt >= RARE[0]) & (cnt <= RARE[1]),
            f"held-out, {n}-gram never seen": valid & (cnt == 0),
        }
        for label, m in masks.items():
            groups[label] = {k: [gl[k][m]] for k in layers}
            groups[label]["gain"] = [gain[m]]
    rows = []
    for label, per_layer in groups.items():
        for k in layers:
            x = np.concatenate(per_layer[k])
            g = per_layer.get("gain")
            rows.append(
                {
                    "group": label,
                    "layer": k,
                    "gain": float(np.concatenate(g).mean()) if g else None,
                    "positions": int(x.size),
                    "mean": float(x.mean()),
                    "median": float(np.median(x)),
                    "p10": float(np.quantile(x, 0.1)),
                    "p90": float(np.quantile(x, 0.9)),
                }
            )
    return rows


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
            "- Training wall time (1 thread each, shared 2-core machine, other jobs running): "
            + ", ".join(f"{k} {v:.0f} s" for k, v in walls.items())
            + ". engram-s0 ran alone; the other six ran at the same time, so each got a fraction of a core."
        )

    settings = TrainSettings(**committed["settings"])
    corpus = build_corpus()
    model = load_tiny_model(model_dir)
    torch.set_num_threads(settings.threads)
    rows = gate_table(model, corpus, settings.seq_len)
    lines += ["", "### Gates of the committed model (mean over the 4 streams, per position)", ""]
    lines.append("| positions | layer | n | mean gate | median | p10 | p90 | loss saved by open gates (nats, mean) |")
    lines.append("|---|---|---|---|---|---|---|---|")
    for r in rows:
        gain = "-" if r["gain"] is None else f"{r['gain']:+.3f}"
        lines.append(
            f"| {r['group']} | {r['layer']} | {r['positions']:,} | {r['mean']:.3f} | {r['median']:.3f} | "
            f"{r['p10']:.3f} | {r['p90']:.3f} | {gain} |"
        )
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
