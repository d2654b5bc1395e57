"""Corpus growth: time and peak memory per worker of the corpus counting on Dask at 1 M, 10 M and
100 M tokens, with 1 and 2 workers, for real text and for a worst case, under one memory limit.

    python benchmarks/corpus_scale.py [--tokens 1000000 10000000 100000000] [--workers 1 2]
                                      [--corpus text random] [--gzip] [--limit 512MB]
                                      [--config v41-flash] [--json OUT.json]

Corpora, written once per size as JSONL (one document a line) into a temporary folder:

- ``text``: the default corpus's documents (``iter_documents`` of ``default_corpus_files``),
  repeated, each repetition in a fresh shuffled order, until the size is reached (the distinct
  n-grams stay those of the default corpus: the store stops growing).
- ``random``: documents of 1,024 uniformly random raw ids (3..127,999) written out as the text of
  their tokens; tokenized again, almost every n-gram is distinct (the worst case for the store).

``--gzip``: each corpus is counted gzipped (``.jsonl.gz``), which the client decompresses into a
spool copy the workers read (``corpus_engine``).

Each row runs in a fresh child process: a local cluster of ``--workers`` single-threaded worker
processes counts the file (``count_corpus_dask``: batches tokenized and counted on the workers,
each partition's keys kept within its worker's share of ``--limit``, the rest spilled to disk;
the partitions merged on the client, into an accumulator under the same limit), then every
order's distinct n-grams are read once (the external merge of the client's spilled runs). Time:
``count`` (tokenize, windows, counts, partitions to the client) and ``merge``; memory: peak RSS
of the client and of each worker (ru_maxrss, which counts the pages of memory-mapped spill runs
read back). The machine is shared and noisy: compare rows of one run. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import gzip
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from engram_viz.analysis.corpus.dask_counting import count_corpus_dask, dask_client
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import iter_documents
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.spill import parse_memory_limit
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer

RANDOM_DOC = 1024  # raw ids per document of the random corpus
WRITE_DOCS = 2000  # random documents generated and written per step (fewer for the last)
TEXT_STEP = 100  # text documents written per step (the size is reached within one step)


def _peak_mib() -> float:
    """Peak RSS of this process (the client, or a worker under ``client.run``) in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _write_docs(fh, tok, docs: list[str]) -> int:
    """Append documents as JSONL lines; their tokens with a BOS each (as the corpus job counts)."""
    fh.writelines(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs)
    return int(tok.encode_batch(docs)[1].sum()) + len(docs)


def write_corpus(path: Path, kind: str, tokens: int, tok) -> int:
    """The ``kind`` corpus of at least ``tokens`` tokens as JSONL at ``path``; its token count."""
    rng = np.random.default_rng(0)
    written = 0
    with path.open("w", encoding="utf-8") as fh:
        if kind == "text":
            docs = [t for f in default_corpus_files() for t, _ in iter_documents(f)]
            while written < tokens:
                order = rng.permutation(len(docs))
                for a in range(0, len(order), TEXT_STEP):
                    written += _write_docs(fh, tok, [docs[i] for i in order[a : a + TEXT_STEP]])
                    if written >= tokens:
                        break
        else:
            pieces = np.array(tok.pieces(range(tok.config.vocab_size)), dtype=object)
            while written < tokens:
                n_docs = min(WRITE_DOCS, -(-(tokens - written) // (RANDOM_DOC + 1)))
                ids = rng.integers(3, 128_000, (n_docs, RANDOM_DOC))
                written += _write_docs(fh, tok, ["".join(row) for row in pieces[ids]])
    return written


def child(config: str, path: Path, workers: int, limit: str) -> dict:
    """One row: count ``path`` on a fresh local cluster of ``workers``, read every order once."""
    cfg = load_config(config)
    tok = get_tokenizer(cfg)
    budget = parse_memory_limit(limit)
    with tempfile.TemporaryDirectory(prefix="corpus-scale-") as spill:
        counts = NgramCounts(cfg, int(tok.token_map[cfg.engram_pad_id]), budget, spill)
        with dask_client(workers) as client:
            t0 = time.perf_counter()
            stats = count_corpus_dask(client, [path], cfg, tok, progress=False, memory_limit=budget, counts=counts)
            t1 = time.perf_counter()
            worker_peaks = sorted(client.run(_peak_mib).values())
        t2 = time.perf_counter()  # the cluster closed (not timed)
        distinct = {n: counts.n_distinct(n) for n in cfg.ngram_orders}
        t3 = time.perf_counter()
        counts.close()
    return {
        "workers": workers,
        "tokens": stats.tokens,
        "documents": stats.documents,
        "memory_limit": limit,
        "count_s": round(t1 - t0, 1),
        "merge_s": round(t3 - t2, 1),
        "tok_per_s": round(stats.tokens / (t1 - t0 + t3 - t2)),
        "client_spills": counts.n_spills,
        "distinct_ngrams": distinct,
        "client_peak_rss_mib": round(_peak_mib()),
        "worker_peak_rss_mib": [round(m) for m in worker_peaks],
    }


def _row(r: dict) -> str:
    workers = " ".join(f"{m:,}" for m in r["worker_peak_rss_mib"])
    distinct = "/".join(f"{v / 1e6:.1f}" for v in r["distinct_ngrams"].values())
    return (
        f"{r['corpus']:>7} {r['tokens']:>12,} {r['workers']:>7} {r['count_s']:>8} {r['merge_s']:>8} "
        f"{r['tok_per_s']:>10,} {r['client_peak_rss_mib']:>10,} {workers:>16}   {distinct}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="v41-flash")
    p.add_argument("--tokens", type=int, nargs="+", default=[1_000_000, 10_000_000, 100_000_000])
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument("--corpus", nargs="+", default=["text", "random"], choices=["text", "random"])
    p.add_argument("--gzip", action="store_true", help="count the corpora gzipped (.jsonl.gz, level 1)")
    p.add_argument("--limit", default="512MB", help="the memory limit of the client and of each worker")
    p.add_argument("--json", default=None, help="also write the results here (after every row)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args.config, Path(args.child), args.workers[0], args.limit)))
        return
    tok = get_tokenizer(args.config)
    results = []
    print(f"config {args.config}; limit {args.limit} (client and each worker); fresh process and cluster per row")
    print(
        f"{'corpus':>7} {'tokens':>12} {'workers':>7} {'count s':>8} {'merge s':>8} {'tok/s':>10} "
        f"{'client MiB':>10} {'worker MiB':>16}   distinct 2/3/4-grams (M)"
    )
    with tempfile.TemporaryDirectory(prefix="corpus-scale-data-") as data:
        for kind in args.corpus:
            for tokens in args.tokens:
                path = Path(data) / f"{kind}-{tokens}.jsonl"
                write_corpus(path, kind, tokens, tok)
                if args.gzip:
                    with path.open("rb") as src, gzip.open(path.with_suffix(".jsonl.gz"), "wb", compresslevel=1) as dst:
                        shutil.copyfileobj(src, dst, 1 << 22)
                    path.unlink()
                    path = path.with_suffix(".jsonl.gz")
                for workers in args.workers:
                    cmd = [sys.executable, __file__, "--child", str(path), "--workers", str(workers)]
                    cmd += ["--config", args.config, "--limit", args.limit]
                    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
                    r = {"corpus": kind + (".gz" if args.gzip else ""), **json.loads(out.splitlines()[-1])}
                    results.append(r)
                    print(_row(r), flush=True)
                    if args.json:  # after every row: a long run killed part-way keeps what finished
                        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
                        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")
                path.unlink()


if __name__ == "__main__":
    main()
