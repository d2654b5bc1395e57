"""Corpus throughput: hashing + accumulation vs the reference hash transcribed literally in torch,
measured side by side in one run; peak memory for a 10M-token corpus.

    python benchmarks/corpus_throughput.py [--config v41-flash] [--ref-tokens 1048576]
                                           [--memory-tokens 10000000] [--json OUT.json]

1. Tokenize the default corpus (``corpus.default_corpus_files``) into one 1D stream of raw ids,
   documents starting with BOS as sequence starts: the corpus path's batch tokenizer
   (``EngramTokenizer.encode_batch``, fastokens when installed) and the ``tokenizers`` reference
   side by side, ids checked identical (tokenizer throughput reported apart).
2. ``reference``: the reference's ``NgramHashState`` forward transcribed literally in torch
   (``benchmarks/reference_hash.py``), over the first ``--ref-tokens`` positions cut into
   sequences of 4096, 16 sequences a call (torch on one thread).
3. ``vectorised hash``: ``StreamWindows`` + ``rows_from_windows`` (the numba kernel when installed) over the same sequences and
   chunks, checked bit-identical to (2).
4. ``hash + accumulate``: windows + row ids + ``NgramCounts.add_windows`` (1M-token chunks) over
   the same positions, and ``+ analysis``: also every RowUsage / CollisionStats table.
   (2)-(4) run interleaved, best of 3 rounds each, so load drifting between them does not skew
   the ratios. Then ``count_corpus`` end to end (read, batched tokenization, windows, counts)
   with a fresh tokenizer, built before the clock starts: ``cold`` (no word's ids cached yet) and
   ``warm`` (the same corpus again), and (4) once over the whole corpus. Per core: run it under
   ``taskset -c 0``.
5. Peak memory (ru_maxrss of a fresh child process) for ``--memory-tokens`` tokens run through
   (4) and the analysis, twice: the real corpus repeated (distinct n-grams stay those of the
   corpus) and a worst case of uniformly random ids (almost every n-gram distinct).

Machines here are shared and noisy: compare the ratios of one run, not absolute numbers
across runs. This is a benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from reference_hash import ReferenceHash

from engram_viz.analysis.corpus.counting import count_corpus
from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import iter_documents
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.row_ids import rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.analysis.row_stats.collisions import CollisionStats, analyse_together
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.config import load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import BOS_ID, EngramTokenizer, get_tokenizer

CHUNK = 1_000_000
ROUNDS = 3


SEQ = 4096  # the side-by-side positions are cut into sequences of this length (the reference's [B, L])
REF_BATCH = 16  # sequences per reference call


def reference_rows(ids: np.ndarray, token_map: np.ndarray, layout: EngramLayout) -> list[np.ndarray]:
    """The literal torch transcription (``reference_hash.ReferenceHash``) over ``ids`` cut into
    sequences of ``SEQ``, ``REF_BATCH`` sequences a call: row ids per call."""
    ref = ReferenceHash(layout, token_map, REF_BATCH, SEQ)
    seqs = torch.from_numpy(ids.reshape(-1, SEQ))
    return [ref(seqs[a : a + REF_BATCH], 0).numpy() for a in range(0, len(seqs), REF_BATCH)]


def our_rows(cfg, ids: np.ndarray, token_map: np.ndarray, layout: EngramLayout) -> list[np.ndarray]:
    """``StreamWindows`` + ``rows_from_windows`` over the same sequences, the same chunks."""
    stream, starts, step = StreamWindows(cfg, token_map), np.zeros(len(ids), bool), REF_BATCH * SEQ
    starts[::SEQ] = True
    return [
        rows_from_windows(layout, stream(ids[a : a + step], starts[a : a + step])) for a in range(0, len(ids), step)
    ]


def tokenize_default_corpus(cfg) -> tuple[np.ndarray, np.ndarray, dict]:
    """Raw ids and sequence starts of the default corpus, BOS per document; tok/s of the corpus
    path's batch tokenizer (``EngramTokenizer.encode_batch``: fastokens when installed) and of the
    ``tokenizers`` reference batch, and whether their ids agree. fastokens caches the ids of the
    words it has seen, so its first call on a fresh tokenizer (``cold``) is reported apart from
    the best of ROUNDS repeats (``warm``, every word seen); building it (once per process) apart too."""
    texts = [t for f in default_corpus_files() for t, cont in iter_documents(f) if not cont]
    tok = EngramTokenizer(cfg)  # fresh: nothing cached
    t0 = time.perf_counter()
    backend = tok.batch_backend  # built on first use: a one-time cost per process, reported apart
    load_s = time.perf_counter() - t0
    times = {"cold": [], "warm": [], "tokenizers": []}
    for r in range(ROUNDS + 1):
        t0 = time.perf_counter()
        flat, lengths = tok.encode_batch(texts)
        times["cold" if r == 0 else "warm"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        enc = tok.backend.encode_batch_fast(texts, add_special_tokens=False)
        times["tokenizers"].append(time.perf_counter() - t0)
    ref = np.fromiter((i for e in enc for i in e.ids), dtype=np.int64)
    n = len(ref)
    tokenizer = {
        "backend": "fastokens" if backend is not None else "tokenizers",
        "backend_load_s": round(load_s, 2),
        "identical": bool(np.array_equal(flat, ref) and lengths.tolist() == [len(e.ids) for e in enc]),
        **{f"{k}_tok_per_s": round(n / min(v)) for k, v in times.items()},
    }
    docs = np.split(ref, np.cumsum(lengths)[:-1])
    docs = [np.concatenate([[BOS_ID], d]) for d in docs]
    starts = np.zeros(sum(map(len, docs)), dtype=bool)
    starts[np.cumsum([0] + [len(d) for d in docs[:-1]])] = True
    return np.concatenate(docs), starts, tokenizer


def hash_and_accumulate(cfg, token_map, ids: np.ndarray, starts: np.ndarray, counts: NgramCounts) -> None:
    """Windows, row ids and counting over a stream in 1M-token chunks (bounded memory)."""
    layout = EngramLayout(cfg)
    stream = StreamWindows(cfg, token_map)
    for a in range(0, len(ids), CHUNK):
        windows = stream(ids[a : a + CHUNK], starts[a : a + CHUNK])
        rows_from_windows(layout, windows)  # the row ids themselves (computed, then dropped)
        counts.add_windows(windows)


def analysis(cfg, counts: NgramCounts) -> None:
    """Every table of the corpus job (one pass over the columns), without decoding text."""
    usage, collisions = RowUsage(cfg, counts), CollisionStats(cfg, counts)
    analyse_together(usage, collisions)
    usage.to_frame(tokenizer=False)
    collisions.to_frame(tokenizer=False)


def memory_child(args: argparse.Namespace) -> None:
    cfg = load_config(args.config)
    tok = get_tokenizer(cfg)
    base = np.load(args.stream)
    ids, starts = base["ids"], base["starts"]
    if args.mode == "random":
        rng = np.random.default_rng(0)
        ids = rng.integers(3, 128000, args.memory_tokens)
        starts = np.zeros(args.memory_tokens, dtype=bool)
        starts[::4096] = True
    else:
        reps = -(-args.memory_tokens // len(ids))
        ids, starts = np.tile(ids, reps)[: args.memory_tokens], np.tile(starts, reps)[: args.memory_tokens]
    del base
    t0 = time.perf_counter()
    counts = NgramCounts(cfg)
    hash_and_accumulate(cfg, tok.token_map, ids, starts, counts)
    t1 = time.perf_counter()
    analysis(cfg, counts)
    t2 = time.perf_counter()
    print(
        json.dumps(
            {
                "mode": args.mode,
                "tokens": len(ids),
                "distinct_ngrams": {n: counts.n_distinct(n) for n in cfg.ngram_orders},
                "hash_accumulate_s": round(t1 - t0, 2),
                "analysis_s": round(t2 - t1, 2),
                "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            }
        )
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="v41-flash")
    p.add_argument("--ref-tokens", type=int, default=1 << 20)
    p.add_argument("--memory-tokens", type=int, default=10_000_000)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="repeat", help=argparse.SUPPRESS)
    p.add_argument("--stream", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        memory_child(args)
        return

    torch.set_num_threads(1)  # per core, like ours
    cfg = load_config(args.config)
    layout = EngramLayout(cfg)
    tok = get_tokenizer(cfg)
    ids, starts, tokenizer = tokenize_default_corpus(cfg)
    n = len(ids)
    results = {"config": cfg.name, "corpus_tokens": n, "tokenizer": tokenizer}
    print(f"config {cfg.name}; default corpus: {n:,} tokens (with a BOS per document); one batch:")
    print(
        f"  encode_batch ({tokenizer['backend']}), first call: {tokenizer['cold_tok_per_s']:>12,} tok/s"
        f"\n  encode_batch, repeated (best of {ROUNDS}):   {tokenizer['warm_tok_per_s']:>12,} tok/s"
        f"\n  tokenizers (reference, best of {ROUNDS + 1}):    {tokenizer['tokenizers_tok_per_s']:>12,} tok/s"
        f"   ids identical: {tokenizer['identical']}\n  (building the {tokenizer['backend']} tokenizer, once per process: "
        f"{tokenizer['backend_load_s']} s, not counted above)"
    )
    if not tokenizer["identical"]:
        raise SystemExit("encode_batch ids differ from the tokenizers reference")

    # Side by side on the same positions, interleaved (best of ROUNDS each), so machine load
    # drifting between measurements does not skew the ratios.
    m = min(args.ref_tokens, n) // SEQ * SEQ
    sub_ids, sub_starts = ids[:m], np.zeros(m, bool)
    sub_starts[::SEQ] = True  # the reference's sequences: rows of SEQ tokens
    best = {"reference": np.inf, "hash": np.inf, "hash_accumulate": np.inf, "end_to_end": np.inf}
    identical = True
    for _ in range(ROUNDS):
        t0 = time.perf_counter()
        ref = reference_rows(sub_ids, tok.token_map, layout)
        best["reference"] = min(best["reference"], time.perf_counter() - t0)
        t0 = time.perf_counter()
        ours = our_rows(cfg, sub_ids, tok.token_map, layout)
        best["hash"] = min(best["hash"], time.perf_counter() - t0)
        identical &= all(np.array_equal(a.reshape(b.shape), b) for a, b in zip(ref, ours))
        del ref, ours
        sub_counts = NgramCounts(cfg)
        t0 = time.perf_counter()
        hash_and_accumulate(cfg, tok.token_map, sub_ids, sub_starts, sub_counts)
        t1 = time.perf_counter()
        analysis(cfg, sub_counts)
        best["hash_accumulate"] = min(best["hash_accumulate"], t1 - t0)
        best["end_to_end"] = min(best["end_to_end"], time.perf_counter() - t0)
    ratio = {k: best["reference"] / v for k, v in best.items() if k != "reference"}
    results.update(
        reference_tokens=m,
        rounds=ROUNDS,
        bit_identical=identical,
        **{f"{k}_tok_per_s": round(m / v) for k, v in best.items()},
        **{f"{k}_vs_reference": round(v, 1) for k, v in ratio.items()},
    )
    print(f"\n[same {m:,} positions, best of {ROUNDS} interleaved rounds]")
    print(f"  reference hash (NgramHashState in torch):        {m / best['reference']:>10,.0f} tok/s")
    print(
        f"  vectorised hash (rows_from_windows, numba):     {m / best['hash']:>10,.0f} tok/s "
        f"{ratio['hash']:5.1f}x   row ids bit-identical: {identical}"
    )
    print(
        f"  hash + accumulate (windows, rows, counts):       {m / best['hash_accumulate']:>10,.0f} tok/s "
        f"{ratio['hash_accumulate']:5.1f}x"
    )
    print(
        f"  + analysis (all RowUsage/CollisionStats tables): {m / best['end_to_end']:>10,.0f} tok/s "
        f"{ratio['end_to_end']:5.1f}x"
    )
    if not identical:
        raise SystemExit("row ids differ from the reference transcription")

    fresh = EngramTokenizer(cfg)  # its word cache starts empty, as in a new corpus job
    fresh.batch_backend  # noqa: B018 - built before the clock starts (a one-time cost, reported above)
    for run in ("cold", "warm"):  # the same corpus again: every word's ids cached
        t0 = time.perf_counter()
        job = count_corpus(default_corpus_files(), cfg, fresh, progress=False)  # the corpus job's counting
        e2e_s = time.perf_counter() - t0
        results[f"count_corpus_{run}_tok_per_s"] = round(job.tokens / e2e_s)
        if run == "cold":
            print("\n[count_corpus on the default corpus: read, tokenize (batched), windows, count; one process]")
        print(f"  {run}: {job.tokens:,} tokens in {e2e_s:.2f} s: {job.tokens / e2e_s:,.0f} tok/s end to end")

    counts = NgramCounts(cfg)
    t0 = time.perf_counter()
    hash_and_accumulate(cfg, tok.token_map, ids, starts, counts)
    acc_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    analysis(cfg, counts)
    ana_s = time.perf_counter() - t0
    results.update(
        corpus_hash_accumulate_tok_per_s=round(n / acc_s),
        corpus_analysis_s=round(ana_s, 2),
        distinct_ngrams={n_: counts.n_distinct(n_) for n_ in cfg.ngram_orders},
    )
    print(f"\n[whole corpus, {n:,} tokens]")
    print(f"  hash + accumulate: {n / acc_s:,.0f} tok/s; analysis {ana_s:.1f} s")
    print("  distinct n-grams: " + ", ".join(f"{k}-grams {v:,}" for k, v in results["distinct_ngrams"].items()))

    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp) / "stream.npz"
        np.savez(stream, ids=ids, starts=starts)
        results["memory"] = []
        print(f"\n[peak memory, {args.memory_tokens:,} tokens, fresh process: hash + accumulate + analysis]")
        for mode in ("repeat", "random"):
            cmd = [
                sys.executable,
                __file__,
                "--memory-child",
                "--mode",
                mode,
                "--stream",
                str(stream),
                "--config",
                cfg.name,
                "--memory-tokens",
                str(args.memory_tokens),
            ]
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
            r = json.loads(out)
            results["memory"].append(r)
            label = "default corpus repeated" if mode == "repeat" else "random ids (worst case)"
            print(
                f"  {label:<26} peak {r['peak_rss_mib']:>8,.0f} MiB; hash+accumulate {r['hash_accumulate_s']} s "
                f"({r['tokens'] / r['hash_accumulate_s']:,.0f} tok/s), analysis {r['analysis_s']} s; distinct "
                + ", ".join(f"{k}-grams {v:,}" for k, v in r["distinct_ngrams"].items())
            )
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
