"""The counting after tokenization, side by side with an older tree: a batch's token ids to the
sorted n-gram store, in process CPU seconds.

The corpus is tokenized once as ``count_corpus`` batches it (``iter_documents``, ``DocumentSpec()``
batches, ``encode_pieces``, cut at ``--tokens``) and each batch's ``(ids, seq_start)`` cached in
``--cache``. Then each tree (``PYTHONPATH=TREE``) runs in a fresh process pinned to one core
(``taskset -c CORE``): a ``StreamWindows`` and an ``NgramCounts`` under the default weights'
config, every batch counted (``counts.add_tokens(stream, ids, st)`` where the tree has it, else
``counts.add_windows(stream(ids, st))``), then ``counts.flush()``. The numba kernels are loaded
by a small warm-up count first, timed on its own. Rounds alternate the trees; best of ``--rounds``.
Both trees' counts are saved and compared array by array::

    .venv/bin/python benchmarks/counting_kernel.py --before /tmp/base --corpus /tmp/mixed.txt
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from machine import cpu_features

REPO = Path(__file__).resolve().parents[1]

TOKENIZE = r"""
import sys
import numpy as np
from engram_viz.analysis.corpus.counting import encode_pieces
from engram_viz.analysis.corpus.documents import DocumentSpec, iter_documents
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.weights.weights_rule import weights_config
corpus, cache, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec, tok = DocumentSpec(), get_tokenizer(load_config(weights_config()))
np.save(f"{cache}/token_map.npy", np.asarray(tok.token_map))
state = {"tokens": 0, "batches": 0}
def flush(texts, continues):
    ids, st = encode_pieces(tok, texts, continues, spec.bos)
    if not len(ids):
        return True
    done = state["tokens"] + len(ids) >= limit
    if done:
        ids, st = ids[: limit - state["tokens"]], st[: limit - state["tokens"]]
    np.savez(f"{cache}/batch{state['batches']:03d}.npz", ids=ids, st=st)
    state["tokens"] += len(ids)
    state["batches"] += 1
    return not done
texts, continues, size, first = [], [], 0, True
for text, cont in iter_documents(corpus, spec.text_field, spec.doc_mode, spec.max_doc_chars):
    texts.append(text)
    continues.append(cont and not first)
    first, size = False, size + len(text)
    if size >= spec.batch_chars:
        going = flush(texts, continues)
        texts, continues, size = [], [], 0
        if not going:
            break
else:
    flush(texts, continues)
"""

COUNT = r"""
import glob, json, sys, time
import numpy as np
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import load_config
from engram_viz.weights.weights_rule import weights_config
cache, out = sys.argv[1], sys.argv[2]
cfg = load_config(weights_config())
token_map = np.load(f"{cache}/token_map.npy")
batches = [(d["ids"], d["st"]) for d in map(np.load, sorted(glob.glob(f"{cache}/batch*.npz")))]
fused = hasattr(NgramCounts, "add_tokens")
def count(pieces):
    stream = StreamWindows(cfg, token_map)
    counts = NgramCounts(cfg, stream.pad_id)
    for ids, st in pieces:
        if fused:
            counts.add_tokens(stream, ids, st)
        else:
            counts.add_windows(stream(ids, st))
    counts.flush()
    return counts
ids, st = batches[0]
t0 = time.process_time()
count([(ids[: 1 << 19], st[: 1 << 19]), (ids[1 << 19 : 1 << 20], st[1 << 19 : 1 << 20])])
warm = time.process_time() - t0
t0 = time.process_time()
counts = count(batches)
took = time.process_time() - t0
counts.save(out)
print(json.dumps({"warm": warm, "count": took, "tokens": int(sum(len(i) for i, _ in batches)), "fused": fused}))
"""


def tokenize(corpus: Path, cache: Path, tokens: int) -> None:
    if sorted(cache.glob("batch*.npz")) and (cache / "token_map.npy").exists():
        return
    cache.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    subprocess.run([sys.executable, "-c", TOKENIZE, str(corpus), str(cache), str(tokens)], env=env, check=True)


def run_tree(tree: Path, cache: Path, out: Path, core: int) -> dict:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    cmd = ["taskset", "-c", str(core), sys.executable, "-c", COUNT, str(cache), str(out)]
    done = subprocess.run(cmd, env=env, cwd=out.parent, check=True, capture_output=True, text=True)  # not this folder
    return json.loads(done.stdout.strip().splitlines()[-1])


def same_counts(a: Path, b: Path) -> bool:
    with np.load(a) as x, np.load(b) as y:
        return sorted(x.files) == sorted(y.files) and all(np.array_equal(x[k], y[k]) for k in x.files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="the older package tree")
    parser.add_argument("--corpus", type=Path, default=Path("/tmp/mixed.txt"), help="corpus file to tokenize")
    parser.add_argument("--tokens", type=int, default=10_000_000, help="tokens counted")
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "engram-counting-kernel",
        help="folder of the cached batches (made once; delete it after changing --corpus or --tokens)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, trees alternating; best taken")
    parser.add_argument("--core", type=int, default=1, help="the core each run is pinned to")
    args = parser.parse_args()
    tokenize(args.corpus, args.cache, args.tokens)
    trees = {"after": REPO, "before": args.before}
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for name, tree in trees.items():
                runs[name].append(run_tree(tree, args.cache, Path(tmp) / f"{name}.npz", args.core))
        identical = same_counts(Path(tmp) / "after.npz", Path(tmp) / "before.npz")
    print(f"CPU: {cpu_features()}; pinned to core {args.core}; {runs['after'][0]['tokens']:,} tokens")
    best = {name: min(r["count"] for r in rs) for name, rs in runs.items()}
    for name, rs in runs.items():
        rounds = " ".join(f"{r['count']:.3f}" for r in rs)
        path = "add_tokens" if rs[0]["fused"] else "add_windows(stream(...))"
        print(f"{name:7s} best {best[name]:.3f} CPU-s (rounds {rounds}; kernels' load {rs[0]['warm']:.2f}) via {path}")
    print(f"after/before: {best['after'] / best['before']:.2f} ({best['before'] / best['after']:.2f}x faster)")
    print(f"counts identical: {identical}")
    if not identical:
        sys.exit(1)


if __name__ == "__main__":
    main()
