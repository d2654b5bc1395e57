"""The corpus job's analysis step alone, side by side against another package tree, in process CPU seconds.

The analysis is what ``apps/corpus_job.run_corpus`` does between counting and writing:
``RowUsage`` and ``CollisionStats`` over the counts, ``analyse_together``, the ``NgramDecoder``
and both ``to_frame`` calls. The counts are read from a saved ``NgramCounts`` (``--counts``,
with the raw-id counts the decoder needs in ``--raw``), so counting is left out. Each tree runs
in a fresh subprocess (``PYTHONPATH=<tree>``), pinned to one core: the counts are loaded, the
tokenizer built with its decoding backend and numba imported with the counting's kernel (what
the job has loaded when its analysis starts), then the analysis runs ``--repeat`` + 1 times; the
first run (which loads the analysis's compiled kernels from the machine's cache and touches its
memory first, as the job's one run does) is reported apart, the best of the others is the figure. Every table of both trees is compared (``DataFrame.equals`` and the CSV bytes).

Counts of the mixed corpus's first 10 M tokens, once (any tree counts the same)::

    PYTHONPATH=/tmp/base python -c "import numpy as np; from engram_viz.analysis.corpus.counting import \\
      count_corpus; s = count_corpus(['/tmp/mixed.txt'], max_tokens=10_000_000, progress=False); \\
      s.counts.save('/tmp/30d/counts10m.npz'); np.save('/tmp/30d/raw10m.npy', s.raw_counts)"
    python benchmarks/corpus_analysis.py --before /tmp/base
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_features

REPO = Path(__file__).resolve().parents[1]
DRIVER = r"""
import json, pickle, sys, time
import numpy as np
from engram_viz.analysis.corpus import key_sort
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.ngram_text import NgramDecoder
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.weights.weights_rule import weights_config

counts_path, raw_path, repeat, out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
cfg = load_config(weights_config())
counts = NgramCounts.load(counts_path, cfg)
raw = np.load(raw_path)
tok = get_tokenizer(cfg)
tok.pieces([100])  # the decoding backend, and numba with the counting's kernel: what the job has loaded by now
key_sort._kernel()
times, tables = [], None
for _ in range(repeat + 1):
    t0 = time.process_time()
    usage = RowUsage(cfg, counts)
    collisions = CollisionStats(cfg, counts)
    analyse_together(usage, collisions, top=20)
    decoder = NgramDecoder(tok, counts.pad_id, raw)
    tables = {f"row_usage_{k}": v for k, v in usage.to_frame(top=20, tokenizer=decoder).items()}
    tables.update({f"collisions_{k}": v for k, v in collisions.to_frame(tokenizer=decoder).items()})
    times.append(time.process_time() - t0)
with open(out, "wb") as f:
    pickle.dump(tables, f)
print("TIMES " + json.dumps(times))
"""


def run(tree: Path, counts: Path, raw: Path, repeat: int, out: Path) -> list[float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = ["taskset", "-c", "0", sys.executable, "-c", DRIVER, str(counts), str(raw), str(repeat), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True, cwd=tree)
    return json.loads(proc.stdout.split("TIMES ", 1)[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the package tree to compare with")
    parser.add_argument("--counts", type=Path, default=Path("/tmp/30d/counts10m.npz"), help="saved NgramCounts")
    parser.add_argument("--raw", type=Path, default=Path("/tmp/30d/raw10m.npy"), help="raw-id counts (np.save)")
    parser.add_argument("--repeat", type=int, default=3, help="timed runs after the first (best is reported)")
    args = parser.parse_args()
    print(f"CPU: {cpu_features()}; pinned to core 0")
    print(f"counts: {args.counts}")
    trees = {"after": REPO, "before": args.before}
    best, tables = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, tree in trees.items():
            out = Path(tmp) / f"{label}.pkl"
            times = run(tree, args.counts, args.raw, args.repeat, out)
            best[label] = min(times[1:])
            with out.open("rb") as f:
                tables[label] = pickle.load(f)
            print(
                f"{label:<7} first (as in the job) {times[0]:.3f} s, then {' '.join(f'{t:.3f}' for t in times[1:])}"
                f" -> best {best[label]:.3f} CPU-s"
            )
    print(f"ratio before/after: {best['before'] / best['after']:.2f}x")
    a, b = tables["after"], tables["before"]
    same_frames = sorted(a) == sorted(b) and all(a[k].equals(b[k]) for k in a)
    same_csv = sorted(a) == sorted(b) and all(a[k].to_csv(index=False) == b[k].to_csv(index=False) for k in a)
    print(f"tables: {len(a)}; DataFrame.equals: {same_frames}; CSV bytes equal: {same_csv}")


if __name__ == "__main__":
    main()
