"""Traces from text: corpus files, a list of texts, or a Trace's rows frame -> a :class:`RowTrace`.

The corpus path is the one ``analysis.corpus`` counts with, called, not copied: files become
documents (``documents.iter_documents``, :class:`DocumentSpec`), each document one sequence with
BOS first (``counting.encode_pieces``), windows carried across batch cuts (``StreamWindows``), row ids
from the vectorised hash (``row_ids.rows_from_windows``, bit-identical to ``NgramHasher``).
Memory: one batch of ``spec.batch_chars`` characters, its row ids (``[N, n_layers, 24]`` int64,
about 400 B a token) and an unfinished prefill chunk; the trace itself goes to disk as it comes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engram_viz._progress import progress_bar
from engram_viz.analysis.caches.row_trace import RowTrace, TraceWriter
from engram_viz.analysis.corpus.counting import checked_files, encode_pieces, file_record
from engram_viz.analysis.corpus.documents import DocumentSpec, check_unchanged, file_stamp, iter_documents
from engram_viz.analysis.corpus.row_ids import rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CacheSimError
from engram_viz.weights.weights_rule import weights_config


def trace_folder(folder: str | Path | None) -> Path:
    """``folder``, or a fresh temporary one (``RowTrace.cleanup`` removes it)."""
    return Path(folder) if folder is not None else Path(tempfile.mkdtemp(prefix="engram-viz-trace-"))


class _Tracer:
    """Raw ids of the stream -> row ids -> the writer, with the token cap."""

    def __init__(self, cfg: EngramConfig, tok: Any, writer: TraceWriter, max_tokens: int | None, bar: Any):
        self.layout, self.tok, self.writer, self.max_tokens, self.bar = EngramLayout(cfg), tok, writer, max_tokens, bar
        self.stream = StreamWindows(cfg, tok.token_map)

    def add(self, texts: list[str], continues: list[bool], bos: bool, record: dict | None = None) -> bool:
        """Tokenize one batch of document pieces and trace it; False once max_tokens is reached."""
        if not texts:
            return True
        ids, starts = encode_pieces(self.tok, texts, continues, bos)
        done = False
        if self.max_tokens is not None and self.writer.tokens + len(ids) >= self.max_tokens:
            keep = self.max_tokens - self.writer.tokens
            ids, starts, done = ids[:keep], starts[:keep], True
        if len(ids):
            self.writer.add(rows_from_windows(self.layout, self.stream(ids, starts)))
            self.bar.update(len(ids))
            if record is not None:
                record["tokens"] += len(ids)
        return not done

    def file(self, path: Path, spec: DocumentSpec) -> tuple[dict, bool]:
        """Trace one file in batches of about ``spec.batch_chars`` characters: its record, going on."""
        stamp = file_stamp(path)
        record = file_record(path, stamp)
        texts: list[str] = []
        continues: list[bool] = []
        size, going = 0, True
        for i, (text, cont) in enumerate(iter_documents(path, spec.text_field, spec.doc_mode, spec.max_doc_chars)):
            cont = cont and i > 0  # a file always starts a sequence
            texts.append(text)
            continues.append(cont)
            record["documents"] += not cont
            size += len(text)
            if size >= spec.batch_chars:
                going = self.add(texts, continues, spec.bos, record)
                texts, continues, size = [], [], 0
                if not going:
                    break
        if going:
            going = self.add(texts, continues, spec.bos, record)
        check_unchanged(path, stamp)  # a file changed while it was read: a trace of two files
        return record, going


def trace_corpus(
    files: Iterable[str | Path],
    config: EngramConfig | str | None = None,
    tokenizer: Any = None,
    max_tokens: int | None = None,
    spec: DocumentSpec | None = None,
    chunk: int | None = None,
    orders: bool = True,
    folder: str | Path | None = None,
    progress: bool = True,
) -> RowTrace:
    """The row-access trace of corpus ``files`` (documents as ``spec`` says, default
    ``DocumentSpec()``) under ``config`` (default: the default weights'), per token and, with
    ``chunk``, per prefill step of ``chunk`` tokens; ``orders``: also one trace per n-gram order.
    Written into ``folder`` (default: a temporary one). An empty corpus is refused."""
    spec = spec or DocumentSpec()
    cfg = load_config(weights_config() if config is None else config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    paths = checked_files(files, max_tokens)
    writer = TraceWriter(cfg, trace_folder(folder), chunk, orders)
    bar = progress_bar(total=max_tokens, unit="tok", unit_scale=True, disable=not progress, desc="trace", delay=1.0)
    records = []
    try:
        tracer = _Tracer(cfg, tok, writer, max_tokens, bar)
        for path in paths:
            record, going = tracer.file(path, spec)
            records.append(record)
            if not going:
                break
    finally:
        bar.close()
    trace = writer.close(", ".join(str(p) for p in paths), records)
    return _non_empty(trace, f"corpus {[str(p) for p in paths]}")


def trace_texts(
    texts: Sequence[str],
    config: EngramConfig | str | None = None,
    tokenizer: Any = None,
    chunk: int | None = None,
    orders: bool = True,
    bos: bool = True,
    folder: str | Path | None = None,
    source: str = "texts",
) -> RowTrace:
    """The trace of ``texts``, each one document (a prompt set's texts, a sample in a notebook)."""
    cfg = load_config(weights_config() if config is None else config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    texts = [str(t) for t in texts]
    writer = TraceWriter(cfg, trace_folder(folder), chunk, orders)
    with progress_bar(disable=True) as bar:
        _Tracer(cfg, tok, writer, None, bar).add(texts, [False] * len(texts), bos)
    return _non_empty(writer.close(source), f"{len(texts)} texts")


def trace_token_ids(
    sequences: Sequence[Sequence[int]],
    config: EngramConfig | str | None = None,
    tokenizer: Any = None,
    chunk: int | None = None,
    orders: bool = True,
    folder: str | Path | None = None,
    source: str = "token ids",
) -> RowTrace:
    """The trace of raw token id sequences, each one sequence as given (no BOS added): prompts
    already tokenized, or random ids (the uniform worst case of a cache)."""
    cfg = load_config(weights_config() if config is None else config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in sequences]
    ids = np.concatenate(seqs) if seqs else np.zeros(0, dtype=np.int64)
    starts = np.zeros(len(ids), dtype=bool)
    starts[np.cumsum([0, *(len(s) for s in seqs[:-1])])[[len(s) > 0 for s in seqs]]] = True
    writer = TraceWriter(cfg, trace_folder(folder), chunk, orders)
    if len(ids):
        writer.add(rows_from_windows(EngramLayout(cfg), StreamWindows(cfg, tok.token_map)(ids, starts)))
    return _non_empty(writer.close(source), f"{len(seqs)} token id sequences")


def trace_rows_frame(
    rows: pd.DataFrame,
    config: EngramConfig | str,
    chunk: int | None = None,
    orders: bool = True,
    folder: str | Path | None = None,
    source: str = "a Trace's rows",
) -> RowTrace:
    """The trace of a Trace's rows frame (prompt, position, layer, order, head, row): the rows the
    Pipeline's hasher gave, image positions included, prompts in frame order."""
    cfg = load_config(config)
    need = {"prompt", "position", "layer", "order", "head", "row"}
    if not need <= set(rows.columns):
        raise CacheSimError(f"rows frame lacks columns {sorted(need - set(rows.columns))}")
    prompts = pd.unique(rows["prompt"])
    order = pd.Categorical(rows["prompt"], categories=prompts, ordered=True)
    layer_index = {lay: i for i, lay in enumerate(cfg.engram_layer_ids)}
    col = (rows["order"].to_numpy() - 2) * cfg.engram_n_heads + rows["head"].to_numpy()
    df = pd.DataFrame(
        {"p": order.codes, "t": rows["position"], "li": rows["layer"].map(layer_index), "c": col, "row": rows["row"]}
    )
    if df["li"].isna().any():
        raise CacheSimError(f"rows frame has layers {sorted(set(rows['layer']))}; config has {cfg.engram_layer_ids}")
    wide = df.pivot_table(index=["p", "t"], columns=["li", "c"], values="row", aggfunc="first").sort_index()
    want = cfg.n_engram_layers * cfg.n_hash_cols
    if wide.shape[1] != want or wide.isna().any().any():
        raise CacheSimError(f"rows frame must hold all {want} (layer, order, head) rows of every position")
    writer = TraceWriter(cfg, trace_folder(folder), chunk, orders)
    writer.add(wide.to_numpy(np.int64).reshape(len(wide), cfg.n_engram_layers, cfg.n_hash_cols))
    return _non_empty(writer.close(source), "the rows frame")


def _non_empty(trace: RowTrace, shown: str) -> RowTrace:
    if trace.tokens == 0:
        trace.cleanup()
        raise CacheSimError(f"{shown} gave no tokens: nothing to trace (an empty corpus?)")
    return trace
