"""Counting a corpus: files -> documents -> tokens -> n-gram windows -> :class:`NgramCounts`.

Each document is one sequence: its first token (BOS when ``DocumentSpec.bos``, the default) starts a
sequence, so no n-gram reaches across documents - the hash's sequence-start blocking. A document
cut into pieces (``documents.iter_documents``) stays one sequence: the hash window carries across
the cut; only a token spanning the cut may differ. Memory: one batch of about ``spec.batch_chars``
characters at a time, plus 16 bytes per distinct n-gram (and order).

The capped sample the notebooks count is ``corpus_sample`` (its own module: it falls back on
the shipped prompts, whose reader imports torch, which counting does not need).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from engram_viz._progress import progress_bar
from engram_viz.analysis.corpus.documents import (
    CorpusError,
    DocumentSpec,
    check_unchanged,
    corpus_file_stat,
    file_stamp,
    is_jsonl,
    iter_documents,
)
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer
from engram_viz.weights.weights_rule import weights_config


@dataclass
class CorpusStats:
    """What ``count_corpus`` saw: the n-gram counts plus per-file totals."""

    counts: NgramCounts
    raw_counts: np.ndarray | None = None  # int64 [vocab]: occurrences of each raw id (for decoding)
    files: list[dict] = field(default_factory=list)
    tokens: int = 0
    documents: int = 0
    truncated: bool = False  # reading stopped at max_tokens
    elapsed_s: float = 0.0


def encode_pieces(tok: Any, texts: list[str], continues: list[bool], bos: bool) -> tuple[np.ndarray, np.ndarray]:
    """One batch of document pieces -> ``(raw ids int64 [N], seq_start bool [N])``; a piece that
    starts a document starts a sequence (with BOS first when ``bos``), unless it has no tokens."""
    ids, lengths = tok.encode_batch(texts)  # one batch call (EngramTokenizer.encode_batch)
    starts_doc = ~np.asarray(continues, dtype=bool)
    if bos:
        ids = np.insert(ids, (np.cumsum(lengths) - lengths)[starts_doc], BOS_ID)
        lengths = lengths + starts_doc
    seq_start = np.zeros(len(ids), dtype=bool)
    seq_start[(np.cumsum(lengths) - lengths)[starts_doc & (lengths > 0)]] = True
    return ids, seq_start


def count_batch(
    texts: list[str], continues: list[bool], config: EngramConfig, tok: Any, bos: bool
) -> tuple[NgramCounts, np.ndarray, int]:
    """One batch of whole documents counted on its own (its first piece starts a document):
    ``(counts, raw id occurrences int64 [vocab], tokens)``. The unit of work of the Dask engine."""
    ids, st = encode_pieces(tok, texts, continues, bos)
    stream = StreamWindows(config, tok.token_map)
    counts = NgramCounts(config, stream.pad_id)
    if len(ids):
        counts.add_tokens(stream, ids, st)
    return counts, np.bincount(ids, minlength=config.vocab_size), len(ids)


def file_record(path: Path, stamp: tuple[int, int, int] | None = None) -> dict:
    """The ``corpus_files`` row of one file, before counting (its size from ``stamp``, the file's
    ``file_stamp`` when given)."""
    return {
        "path": str(path),
        "format": "jsonl" if is_jsonl(path) else "text",
        "bytes": (stamp or file_stamp(path))[0],
        "documents": 0,
        "tokens": 0,
    }


class _Counter:
    """The counting loop of :func:`count_corpus`: batches of document pieces into ``stats``."""

    def __init__(
        self, stats: CorpusStats, stream: StreamWindows, tok: Any, spec: DocumentSpec, max_tokens: int | None, bar
    ):
        self.stats, self.stream, self.tok, self.spec, self.bar = stats, stream, tok, spec, bar
        self.max_tokens = max_tokens

    def flush(self, texts: list[str], continues: list[bool], record: dict) -> bool:
        """Tokenize and count one batch; False once max_tokens is reached."""
        if not texts:
            return True
        ids, st = encode_pieces(self.tok, texts, continues, self.spec.bos)
        if not len(ids):
            return True
        stats, done = self.stats, False
        if self.max_tokens is not None and stats.tokens + len(ids) >= self.max_tokens:
            keep = self.max_tokens - stats.tokens
            ids, st, done = ids[:keep], st[:keep], True
        stats.counts.add_tokens(self.stream, ids, st)
        stats.raw_counts += np.bincount(ids, minlength=len(stats.raw_counts))
        stats.tokens += len(ids)
        record["tokens"] += len(ids)
        self.bar.update(len(ids))
        return not done

    def file(self, path: Path) -> bool:
        """Count one file; False once max_tokens is reached. A file that changes while it is read
        is refused (``CorpusError``): its counts would mix two files."""
        stamp = file_stamp(path)
        going = self._file(path, file_record(path, stamp))
        check_unchanged(path, stamp)
        return going

    def _file(self, path: Path, record: dict) -> bool:
        spec = self.spec
        self.stats.files.append(record)
        self.bar.set_postfix_str(path.name)
        texts, continues, size = [], [], 0
        first = True
        for text, cont in iter_documents(path, spec.text_field, spec.doc_mode, spec.max_doc_chars):
            cont = cont and not first  # a file always starts a sequence
            first = False
            texts.append(text)
            continues.append(cont)
            size += len(text)
            if not cont:
                record["documents"] += 1
                self.stats.documents += 1
            if size >= spec.batch_chars:
                if not self.flush(texts, continues, record):
                    return False
                texts, continues, size = [], [], 0
        return self.flush(texts, continues, record)


def checked_files(files: Iterable[str | Path], max_tokens: int | None = None) -> list[Path]:
    """The corpus files as paths, each an existing regular file, and max_tokens positive (CorpusError)."""
    files = [Path(f) for f in files]
    if not files:
        raise CorpusError("no corpus files given")
    for f in files:
        corpus_file_stat(f)  # a regular file, else what it is (missing, a folder, a FIFO, a device...)
    if max_tokens is not None and max_tokens < 1:
        raise CorpusError(f"max_tokens must be positive, got {max_tokens}")
    return files


def count_corpus(
    files: Iterable[str | Path],
    config: EngramConfig | str | None = None,
    tokenizer=None,
    max_tokens: int | None = None,
    spec: DocumentSpec | None = None,
    progress: bool = True,
    counts: NgramCounts | None = None,
) -> CorpusStats:
    """Stream ``files`` into an :class:`NgramCounts` (documents as in the module docstring) under
    ``config`` (default: the default weights', ``weights.resolve.weights_config``, so the
    row ids are the ones its runs show); ``spec``: how files become documents (default
    ``DocumentSpec()``). Memory: one batch of about ``spec.batch_chars`` characters at a time, plus
    the counts."""
    spec = spec or DocumentSpec()
    cfg = load_config(weights_config() if config is None else config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    files = checked_files(files, max_tokens)
    stream = StreamWindows(cfg, tok.token_map)
    counts = counts if counts is not None else NgramCounts(cfg, stream.pad_id)
    stats = CorpusStats(counts, np.zeros(cfg.vocab_size, dtype=np.int64))
    t0 = time.perf_counter()
    bar = progress_bar(total=max_tokens, unit="tok", unit_scale=True, disable=not progress, desc="corpus")
    try:
        counter = _Counter(stats, stream, tok, spec, max_tokens, bar)
        going = True
        for path in files:
            going = counter.file(path)
            if not going:
                break
        stats.truncated = not going  # stopped at max_tokens (the input may have ended there too)
        counts.flush()
    finally:
        bar.close()
    stats.elapsed_s = time.perf_counter() - t0
    return stats
