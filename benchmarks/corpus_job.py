"""``engram-viz corpus`` as a user runs it, whole process, in process CPU seconds.

Each run is a fresh ``python -m engram_viz.cli corpus FILE --out DIR`` pinned to one core (the
machines here are shared: CPU time stays close to the work done where wall time does not). A
small driver wraps the job's own steps to split the process's CPU time into start-up (interpreter,
imports, config, tokenizer: everything before counting starts), counting (read, tokenize,
windows, counts; of which "fastok." is building the fastokens tokenizer, once per process), analysis
(every row-usage and collision table, decoded) and writing (tables and summary.json, the folder
swapped in). Corpora: the default corpus, and a mixed corpus cut at
``--tokens`` (the default corpus, fortunes-zh and song/tang poems where installed, and Python
source as code-like text, concatenated in that order). ``--before TREE`` runs a second package
tree (e.g. ``git archive <commit> engram_viz data | tar -x -C TREE``) on the same corpora, side by
side; the tables of both runs are compared byte for byte::

    .venv/bin/python benchmarks/corpus_job.py --before /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from machine import cpu_features

from engram_viz.analysis.corpus.default_corpus import default_corpus_files

REPO = Path(__file__).resolve().parents[1]
DRIVER = r"""
import json, sys, time
import engram_viz.apps.corpus_job as job
marks = {}
def wrap(name, fn, mark_in, mark_out=None):
    def inner(*a, **k):
        marks.setdefault(mark_in, time.process_time())
        out = fn(*a, **k)
        if mark_out:
            marks[mark_out] = time.process_time()
        return out
    setattr(job, name, inner)
wrap("count_corpus", job.count_corpus, "count_in", "count_out")
wrap("write_table", job.write_table, "write_in")
import engram_viz.core.tokenizer as tokenizer_module
build = tokenizer_module.fast_batch_backend
def timed_build(*a, **k):
    t0 = time.process_time()
    out = build(*a, **k)
    marks["tok_build"] = marks.get("tok_build", 0.0) + time.process_time() - t0
    return out
tokenizer_module.fast_batch_backend = timed_build
from engram_viz.cli import main
code = main(sys.argv[1:])
marks["end"] = time.process_time()
print("MARKS " + json.dumps(marks))
sys.exit(code)
"""


def mixed_corpus(path: Path) -> Path:
    """The mixed corpus file: the default corpus, Chinese fortunes and poems, Python source."""
    parts = list(default_corpus_files())
    parts += sorted(Path("/usr/share/games/fortunes").glob("*.u8"))
    parts += sorted(Path(os.__file__).parent.rglob("*.py"))
    with path.open("w", encoding="utf-8") as out:
        for p in parts:
            out.write(p.read_text(encoding="utf-8", errors="replace") + "\n\n")
    return path


def run(tree: Path, files: list[str], out: Path, tokens: int | None, config: str | None = None, core: int = 0) -> dict:
    argv = ["corpus", *files, "--out", str(out), "--quiet" if tree == REPO else "--no-progress"]
    argv += ["--max-tokens", str(tokens)] if tokens else []
    argv += ["--config", config] if config else []
    env = {**os.environ, "PYTHONPATH": str(tree)}
    proc = subprocess.run(
        ["taskset", "-c", str(core), sys.executable, "-c", DRIVER, *argv],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=tree,
    )
    marks = json.loads(proc.stdout.split("MARKS ", 1)[1])
    summary = json.loads((out / "summary.json").read_text())
    return {
        "tokens": summary["tokens"],
        "startup": marks["count_in"],
        "counting": marks["count_out"] - marks["count_in"],
        "tok_build": marks.get("tok_build", 0.0),
        "analysis": marks["write_in"] - marks["count_out"],
        "writing": marks["end"] - marks["write_in"],
        "total": marks["end"],
        "peak_rss_mb": summary.get("peak_rss_mb", float("nan")),
        "analysis_s": summary.get("analysis_s", float("nan")),  # the job's own figure: wall time
    }


def tables(out: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in out.glob("*.csv") if p.name != "corpus_files.csv"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, default=None, help="a package tree to run side by side")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="tokens of the mixed corpus")
    args = parser.parse_args()
    trees = {"after": REPO} | ({"before": args.before} if args.before else {})
    print(f"CPU: {cpu_features()}; pinned to core 0")
    with tempfile.TemporaryDirectory() as tmp:
        one_line = Path(tmp) / "one_line.txt"
        one_line.write_text("In the beginning God created the heaven and the earth.\n")
        corpora = {
            "one line": ([str(one_line)], None),
            "default corpus": ([], None),
            f"mixed, {args.tokens:,} tokens": ([str(mixed_corpus(Path(tmp) / "mixed.txt"))], args.tokens),
        }
        print(
            f"{'corpus':<26}{'tree':<8}{'tokens':>12}{'start-up':>10}{'counting':>10}{'(fastok.)':>10}{'analysis':>10}"
            f"{'writing':>9}{'total':>8}  tokens/CPU-s"
        )
        for name, (files, tokens) in corpora.items():
            outs = {}
            for label, tree in trees.items():
                outs[label] = Path(tmp) / f"{label}-{len(outs)}-{abs(hash(name))}"
                r = run(tree, files, outs[label], tokens)
                print(
                    f"{name:<26}{label:<8}{r['tokens']:>12,}{r['startup']:>10.2f}{r['counting']:>10.2f}{r['tok_build']:>10.2f}"
                    f"{r['analysis']:>10.2f}{r['writing']:>9.2f}{r['total']:>8.2f}  {r['tokens'] / r['total']:>12,.0f}"
                )
            if len(outs) == 2:
                print(f"{'':<26}tables identical: {tables(outs['after']) == tables(outs['before'])}")


if __name__ == "__main__":
    main()
