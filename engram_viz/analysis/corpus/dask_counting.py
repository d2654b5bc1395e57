"""Counting a corpus on Dask (``dask.distributed``, the optional ``corpus`` extra).

``count_corpus_dask`` gives exactly the :class:`~engram_viz.analysis.corpus.counting.CorpusStats`
of ``count_corpus`` (same counts, raw counts, per-file records), spread over the workers of a
local cluster (``workers=N``) or of an existing one (``scheduler="tcp://host:8786"``):

- The client cuts each file into batches of whole documents (about ``DocumentSpec.batch_chars`` bytes, cut
  only where a document starts, so no hash window crosses a batch: ``documents.document_spans``)
  and submits each batch as a task that names its bytes, not their text: read, tokenize, cut
  windows, count (``corpus_counts.count_batch``). So the workers must see the files at the same
  paths (one machine, or a shared file system). A gzipped file cannot be read from the middle:
  the client decompresses it, as it cuts it, into a temporary folder under ``spool_dir``, and the
  batches name bytes of that copy (the workers must see ``spool_dir`` too). The copies take the
  decompressed size on disk until the count ends (a lost worker's batches may be read again); no
  text travels in a task.
- Each batch's counts are split into ``partitions`` shares by a stable hash of the n-gram key
  (``counts.key_partition``); share i is merged into partition i's running total on its worker,
  so a worker holds only the partitions it merges, never the whole corpus's keys. Partition i
  stays on worker i mod N (a loose restriction: another takes it over when that one is lost).
  The local cluster runs without work stealing: Dask sizes a partition by its in-memory keys
  only, so it looks cheap to move, and a moved partition travels with its spilled runs read back
  into memory, which breaks the memory bound (measured in ``benchmarks/results/corpus_scale.txt``).
  On a cluster of your own, start the scheduler with
  ``DASK_DISTRIBUTED__SCHEDULER__WORK_STEALING=False`` for the same bound.
- At the end the partitions, disjoint by key, merge into one ``NgramCounts`` on the client,
  each sent in pieces of ``PIECE_KEYS`` keys (a worker reads a piece from its spilled run), so
  neither side holds a whole partition.
- ``memory_limit``: a partition whose keys outgrow its share of the worker's budget spills
  sorted runs to the worker's local directory (``spill``); the client's accumulator may spill
  under its own limit.

Tasks name their inputs, so a worker that dies loses nothing: the scheduler reruns its
tasks elsewhere (``retries`` more for errors), and the counts stay exact. A task's error (a bad JSONL line) reaches
the client as the task's own ``CorpusError``; the local cluster's logs are silenced, so the user
sees that one line, not every worker's traceback. Every file is stamped (``file_stamp``) before it is
cut and checked again when its spans are read (on the worker) and when the count ends: a file
changed meanwhile is refused. The scheduler keeps every
finished task of a partition's merge chain for that (a lost partition is recomputed from its
first batch on): a few hundred bytes per batch, as the tasks name their bytes. At most
``2 * workers`` batches are in flight, so the client's memory stays bounded by a few batches.
"""

from __future__ import annotations

import logging
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from engram_viz._progress import progress_bar
from engram_viz.analysis.corpus.counting import CorpusStats, count_batch, file_record
from engram_viz.analysis.corpus.documents import (
    CorpusError,
    DocumentSpec,
    Span,
    check_unchanged,
    document_spans,
    file_stamp,
    is_gzip,
    iter_span_documents,
)
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.config import EngramConfig

RETRIES = 3  # extra tries of a task that raised (a lost worker's tasks are rerun regardless)
PIECE_KEYS = 1 << 22  # keys per piece of a partition sent to the client at the end (64 MiB)


@contextmanager
def dask_client(workers: int | None = None, scheduler: str | None = None, processes: bool = True):
    """A ``dask.distributed.Client``: joined to ``scheduler`` when given, else on a fresh local
    cluster of ``workers`` single-threaded workers (``processes=False``: threads, for tests)."""
    try:
        import dask
        from dask.distributed import Client, LocalCluster
    except ImportError:
        raise CorpusError(
            "--workers/--scheduler need dask.distributed; install the corpus extra: pip install 'engram-viz[corpus]'"
        ) from None
    if scheduler:
        with Client(scheduler) as client:
            yield client
        return
    checked_workers(workers)
    with (
        dask.config.set(
            {"distributed.scheduler.work-stealing": False}
        ),  # partitions stay put: see the module docstring
        LocalCluster(
            n_workers=workers,
            threads_per_worker=1,
            processes=processes,
            dashboard_address=None,
            scheduler_kwargs={"dashboard_address": "127.0.0.1:0"},  # its HTTP server: no "port 8787 in use" warning
            silence_logs=logging.CRITICAL,  # a task's error reaches the user once, as the client's one line
        ) as cluster,
        Client(cluster) as client,
    ):
        yield client


def checked_workers(workers: Any) -> int:
    """``workers`` if it is a positive integer, else ``CorpusError``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise CorpusError(f"workers must be a positive integer, got {workers!r}")
    return workers


def file_spans(files: list[Path], spec: DocumentSpec, spool: Path | None) -> Iterator[tuple[int, Span]]:
    """``(file index, span)`` in order: byte spans of whole documents of about ``spec.batch_chars`` bytes;
    a gzipped file's spans are of its decompressed copy in ``spool``, written as they are cut."""
    for fi, path in enumerate(files):
        copy = spool / f"{fi:06d}-{path.name[:-3]}" if is_gzip(path) else None
        yield from ((fi, span) for span in document_spans(path.absolute(), spec.doc_mode, spec.batch_chars, copy))


def _task(span: Span, spec: DocumentSpec, config, tok, partitions):
    """On a worker: read and count one span, split its counts into ``partitions`` shares."""
    texts, continues = [], []
    for text, cont in iter_span_documents(span, spec.text_field, spec.doc_mode, spec.max_doc_chars):
        texts.append(text)
        continues.append(cont)
    counts, raw, tokens = count_batch(texts, continues, config, tok, spec.bos)
    return counts.split(partitions), raw, tokens, continues.count(False)


def _meta(result):
    return result[1:]


def _share(result, i):
    return result[0][i]


def _merge(total: NgramCounts | None, part: NgramCounts, memory_limit: int | None) -> NgramCounts:
    """On a worker: add one share to its partition's running total (in place, so never retried on
    an error: a lost worker's tasks are rerun from their inputs regardless). With a memory limit
    the total spills sorted runs into the worker's local directory."""
    if total is None:  # a fresh total: the share itself may still be held by its batch's result
        spill_dir = None
        if memory_limit is not None:
            from dask.distributed import get_worker

            spill_dir = get_worker().local_directory
        total = NgramCounts(part.config, part.pad_id, memory_limit, spill_dir)
    return total.merge(part)


def _layout(total: NgramCounts) -> tuple[int, int, list[tuple[int, int, int]]]:
    """On a worker: a partition's position totals and ``(order, group, keys)`` of each group (a
    spilled group is merged into one run on the worker's disk here)."""
    return total.n_positions, total.n_masked, [(n, g, len(lo)) for n in total.orders for g, lo, _ in total.groups(n)]


def _piece(total: NgramCounts, order: int, group: int, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
    """On a worker: keys ``start:stop`` of one group of a partition, with their counts (copies)."""
    for g, lo, counts in total.groups(order):
        if g == group:
            return np.array(lo[start:stop]), np.array(counts[start:stop])
    raise KeyError(f"partition has no group {group} of order {order}")


def _gather(client: Any, totals: list[Any], counts: NgramCounts) -> None:
    """Merge the partitions into ``counts`` in pieces of at most ``PIECE_KEYS`` keys, a few in
    flight, so neither a worker nor the client ever holds a whole partition at once."""
    specs = []
    for total in totals:
        if total is None:
            continue
        positions, masked, groups = client.submit(_layout, total, pure=False).result()
        counts.n_positions += positions
        counts.n_masked += masked
        for n, g, size in groups:
            specs += [(total, n, g, a, min(a + PIECE_KEYS, size)) for a in range(0, size, PIECE_KEYS)]
    pending: list[tuple[int, int, Any]] = []
    for spec in specs:
        pending.append((spec[1], spec[2], client.submit(_piece, *spec, pure=False, retries=RETRIES)))
        if len(pending) > 2:
            n, g, fut = pending.pop(0)
            counts.add_sorted(n, g, *fut.result())
    for n, g, fut in pending:
        counts.add_sorted(n, g, *fut.result())


def count_corpus_dask(
    client: Any,
    files: list[Path],
    cfg: EngramConfig,
    tok: Any,
    spec: DocumentSpec | None = None,
    partitions: int | None = None,
    progress: bool = True,
    memory_limit: int | None = None,
    counts: NgramCounts | None = None,
    spool_dir: str | Path | None = None,
    spool_prefix: str = "engram-spool-",
) -> CorpusStats:
    """``count_corpus`` on the cluster behind ``client`` (see the module docstring), the documents
    as ``spec`` says (default ``DocumentSpec()``; a task counts ``spec.batch_chars`` bytes). ``memory_limit``
    (bytes): each worker's budget for the keys of its partitions, split evenly among them; past
    it a partition spills sorted runs to disk. ``counts``: the client's accumulator for the merged
    partitions (e.g. one with its own memory limit); a fresh in-memory one by default.
    ``spool_dir`` (default: the system's temporary folder): where a folder named ``spool_prefix...``
    holds the decompressed copies of gzipped files while the count runs; removed at the end."""
    from dask.distributed import wait

    spec = spec or DocumentSpec()
    addresses = sorted(client.scheduler_info().get("workers", {}))
    n_workers = max(1, len(addresses))
    parts = partitions or 2 * n_workers
    part_limit = None if memory_limit is None else max(1, memory_limit * n_workers // parts)
    t0 = time.perf_counter()
    stamps = [file_stamp(f) for f in files]
    records = [file_record(f, stamp) for f, stamp in zip(files, stamps, strict=True)]
    raw_counts = np.zeros(cfg.vocab_size, dtype=np.int64)
    totals: list[Any] = [None] * parts
    tok_f = client.scatter(
        tok, broadcast=True, hash=False
    )  # a fresh key: an earlier count's copy may be being released
    pending: list[tuple[int, Any]] = []
    tokens = documents = 0
    bar = progress_bar(unit="tok", unit_scale=True, disable=not progress, desc="corpus")

    def settle(fi: int, meta: Any) -> None:
        nonlocal tokens, documents
        raw, n, docs = meta.result()
        raw_counts[:] += raw
        records[fi]["tokens"] += n
        records[fi]["documents"] += docs
        tokens += n
        documents += docs
        bar.update(n)

    gzipped = any(map(is_gzip, files))
    spool = tempfile.TemporaryDirectory(suffix=".tmp", prefix=spool_prefix, dir=spool_dir) if gzipped else None
    try:
        for fi, span in file_spans(files, spec, Path(spool.name).absolute() if spool else None):
            bar.set_postfix_str(files[fi].name)
            fut = client.submit(_task, span, spec, cfg, tok_f, parts, pure=False, retries=RETRIES)
            for i in range(parts):
                share = client.submit(_share, fut, i, pure=False, retries=RETRIES)
                home = [addresses[i % len(addresses)]] if addresses else None  # a partition stays on its worker
                totals[i] = client.submit(
                    _merge, totals[i], share, part_limit, pure=False, workers=home, allow_other_workers=True
                )
            pending.append((fi, client.submit(_meta, fut, pure=False)))
            if len(pending) > 2 * n_workers:
                settle(*pending.pop(0))
        for item in pending:
            settle(*item)
        wait([t for t in totals if t is not None])
        if counts is None:
            counts = NgramCounts(cfg, int(tok.token_map[cfg.engram_pad_id]))  # as count_corpus
        _gather(client, totals, counts)
        for f, stamp in zip(files, stamps, strict=True):  # a file changed while it was read: counts of two files
            check_unchanged(f, stamp)
    finally:
        bar.close()
        if spool:
            spool.cleanup()
    stats = CorpusStats(counts, raw_counts, records, tokens, documents, False)
    stats.elapsed_s = time.perf_counter() - t0
    return stats
