"""A corpus's row-access trace on Dask: the spans of ``dask_counting`` traced as tasks, written in order.

The client cuts the files into spans of whole documents (``dask_counting.file_spans``: about
``spec.batch_chars`` bytes, cut where a document starts, gzipped files decompressed into a spool
folder first), and each task reads, tokenizes and hashes one span (a span starts a sequence, so
its windows need nothing from the span before) and returns the row ids of the traced layers as
uint32 ``[N, layers, 24]``. The client appends them to the trace in span order, at most ``2 x
workers`` spans in flight, so its memory holds a few spans' row ids (about 200 B a token) and the
trace file itself streams to disk. The simulations then run as one task each
(``simulate.simulate_trace(client=...)``); the workers must see the trace folder (one machine,
or a shared file system).
"""

from __future__ import annotations

import tempfile
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engram_viz._progress import progress_bar
from engram_viz.analysis.caches.row_trace import ROW_DTYPE, RowTrace, TraceWriter
from engram_viz.analysis.corpus.counting import encode_pieces, file_record
from engram_viz.analysis.corpus.dask_counting import RETRIES, file_spans
from engram_viz.analysis.corpus.documents import (
    DocumentSpec,
    Span,
    check_unchanged,
    file_stamp,
    is_gzip,
    iter_span_documents,
)
from engram_viz.analysis.corpus.row_ids import rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import EngramConfig
from engram_viz.core.layout import EngramLayout


def span_rows(
    span: Span, spec: DocumentSpec, config: EngramConfig, tok: Any, layer_index: Any = slice(None)
) -> tuple[np.ndarray, int]:
    """On a worker: the row ids of one span's layers ``layer_index`` (positions in the config's
    Engram layers), uint32 ``[N, layers, 24]``, and its documents."""
    texts, continues = [], []
    for text, cont in iter_span_documents(span, spec.text_field, spec.doc_mode, spec.max_doc_chars):
        texts.append(text)
        continues.append(cont)
    ids, starts = encode_pieces(tok, texts, continues, spec.bos)
    if not len(ids):
        shape = (0, config.n_engram_layers, config.n_hash_cols)
        return np.zeros(shape, dtype=ROW_DTYPE)[:, layer_index], continues.count(False)
    rows = rows_from_windows(EngramLayout(config), StreamWindows(config, tok.token_map)(ids, starts))
    return rows[:, layer_index].astype(ROW_DTYPE), continues.count(False)


def trace_corpus_dask(
    client: Any,
    files: list[Path],
    cfg: EngramConfig,
    tok: Any,
    folder: Path,
    spec: DocumentSpec | None = None,
    chunk: int | None = None,
    orders: bool = True,
    progress: bool = True,
    layers: Sequence[int] | None = None,
    scopes: Sequence[str] | None = None,
) -> RowTrace:
    """``corpus_trace.trace_corpus`` on the cluster behind ``client`` (see the module docstring);
    ``layers`` / ``scopes``: trace only these (``row_trace.TraceWriter``)."""
    spec = spec or DocumentSpec()
    n_workers = max(1, len(client.scheduler_info().get("workers", {})))
    stamps = [file_stamp(f) for f in files]
    records = [file_record(f, s) for f, s in zip(files, stamps, strict=True)]
    writer = TraceWriter(cfg, folder, chunk, orders, layers, scopes)
    tok_f = client.scatter(tok, broadcast=True, hash=False)
    pending: deque = deque()
    bar = progress_bar(unit="tok", unit_scale=True, disable=not progress, desc="trace", delay=1.0)

    def settle() -> None:
        fi, fut = pending.popleft()
        rows, docs = fut.result()
        writer.add_traced(rows)
        records[fi]["tokens"] += len(rows)
        records[fi]["documents"] += docs
        bar.update(len(rows))

    spool = tempfile.TemporaryDirectory(prefix="engram-viz-trace-spool-") if any(map(is_gzip, files)) else None
    try:
        for fi, span in file_spans(files, spec, Path(spool.name) if spool else None):
            pending.append(
                (fi, client.submit(span_rows, span, spec, cfg, tok_f, writer.layer_index, pure=False, retries=RETRIES))
            )
            if len(pending) > 2 * n_workers:
                settle()
        while pending:
            settle()
        for f, stamp in zip(files, stamps, strict=True):
            check_unchanged(f, stamp)
    finally:
        bar.close()
        if spool:
            spool.cleanup()
    return writer.close(", ".join(str(p) for p in files), records)
