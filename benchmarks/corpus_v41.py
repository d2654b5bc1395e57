"""``engram-viz corpus FILE --config v41-flash`` (V4.1-Flash's 16 M-bucket columns) per package tree, whole process.

The analysis under V4.1's layout: 48 columns with primes near 16,000,000, most n-grams alone in
their bucket (``analysis/corpus/bucket_sort.py``). Each run is a fresh process pinned to one core
(``--core``), its CPU time split as ``corpus_job.py`` splits it (start-up, counting, analysis,
writing), with the job's own analysis wall time and peak RSS (summary.json's ``analysis_s`` and
``peak_rss_mb``) and a byte-for-byte comparison of every CSV table against the first tree's.
Trees: this checkout, and ``--tree NAME=PATH`` package trees (e.g. ``git archive <commit>
engram_viz data | tar -x -C PATH``)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/corpus_v41.py --tree base=/tmp/base --tree main=/tmp/main
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from corpus_job import REPO, run, tables
from machine import cpu_features


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--file", type=Path, default=Path("/tmp/mixed.txt"), help="the corpus file")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="--max-tokens of the job")
    parser.add_argument("--config", default="v41-flash")
    parser.add_argument("--core", type=int, default=1, help="the core every run is pinned to")
    parser.add_argument("--tree", action="append", default=[], help="NAME=PATH of another package tree")
    args = parser.parse_args()
    trees = {"this": REPO} | {name: Path(path) for name, path in (t.split("=", 1) for t in args.tree)}
    print(f"CPU: {cpu_features()}; pinned to core {args.core}")
    print(f"corpus {args.file} cut at {args.tokens:,} tokens, --config {args.config}; process CPU seconds")
    print(
        f"{'tree':<8}{'tokens':>12}{'start-up':>10}{'counting':>10}{'analysis':>10}{'writing':>9}{'total':>8}"
        f"{'(wall)':>8}{'peak RSS MB':>13}  tables as this tree's"
    )
    with tempfile.TemporaryDirectory() as tmp:
        first = None
        for name, tree in trees.items():
            out = Path(tmp) / name
            r = run(tree, [str(args.file)], out, args.tokens, args.config, args.core)
            same = "-" if first is None else str(tables(out) == tables(first))
            first = first or out
            print(
                f"{name:<8}{r['tokens']:>12,}{r['startup']:>10.2f}{r['counting']:>10.2f}{r['analysis']:>10.2f}"
                f"{r['writing']:>9.2f}{r['total']:>8.2f}{r['analysis_s']:>8.2f}{r['peak_rss_mb']:>13,.0f}  {same}"
            )


if __name__ == "__main__":
    main()
