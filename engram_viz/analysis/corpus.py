"""Corpus-scale row usage and hash collisions: stream text or JSONL files, write tidy tables.

``engram-viz corpus FILE... --out DIR`` (``run_corpus``) reads the files in chunks, tokenizes
them with the V4 tokenizer, cuts every position's n-gram window with the vectorised stream
hasher (``ngrams``; bit-identical to ``NgramHasher``) and accumulates the distinct n-grams
(``NgramCounts``), from which ``RowUsage`` and ``CollisionStats`` derive their tables. Memory
stays bounded by the chunk size plus 16 bytes per distinct n-gram (and order).

**Documents.** Plain text (``.txt``, or anything not JSONL; ``.gz`` is read transparently):
``doc_mode='paragraph'`` (default) makes every run of non-blank lines a document,
``'line'`` every non-blank line, ``'file'`` the whole file. JSONL (``.jsonl``, ``.ndjson``,
also ``.gz``): one document per line, its ``text_field`` (``text``). Each document is one
sequence: its first token (BOS when ``bos``, the default) starts a sequence, so no n-gram reaches
across documents - the hash's sequence-start blocking. A document longer than ``max_doc_chars``
is cut at line ends into pieces tokenized separately, but it stays one sequence (the hash window
carries across the cut; only a token spanning the cut may differ). Text is decoded as UTF-8
with invalid bytes replaced by U+FFFD.

**Default corpus** (``default_corpus_files``), from Debian packages a fresh machine can install
(``.ci/system-deps.sh``): the King James Bible (``bible-kjv`` + ``bible-kjv-text``; the 1611 text
is public domain; the ``bible`` program that prints it is GPL-2+), one chapter per document,
verse numbers dropped; and the Chinese Debian Reference (``debian-reference-zh-cn``, GPL-2+),
one paragraph per document with hard line wraps joined. Together about 1.3M tokens. Both are
written once into ``tokenizer.cache_dir()/corpus``.

**Output** (``DIR``): every table as ``NAME.parquet`` and ``NAME.csv`` (written atomically):
``row_usage_columns``, ``row_usage_hit_histogram``, ``row_usage_rank_frequency``,
``row_usage_hot_rows`` (schemas in ``usage``), ``collisions_columns``, ``collisions_heads_shared``,
``collisions_examples``, ``collisions_top_ngrams`` (schemas in ``collisions``), ``corpus_files``
(path, format, bytes, documents, tokens), and ``summary.json``. ``save_counts`` adds
``ngram_counts.npz`` (``NgramCounts.load``) so shards can be merged later.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import re
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from engram_viz.analysis.collisions import CollisionStats, analyse_together
from engram_viz.analysis.ngrams import NgramCounts, NgramDecoder, StreamWindows
from engram_viz.analysis.usage import RowUsage
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.tokenizer import BOS_ID, cache_dir, get_tokenizer

DOC_MODES = ("paragraph", "line", "file")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
ZH_REFERENCE = Path("/usr/share/debian-reference/debian-reference.zh-cn.txt.gz")
SOURCES = {
    "kjv-chapters.txt": {
        "name": "King James Bible (1611)",
        "packages": "bible-kjv bible-kjv-text",
        "licence": "text: public domain; bible-kjv program: GPL-2+",
    },
    "debian-reference-zh-cn.txt": {
        "name": "Debian Reference, Simplified Chinese translation (Osamu Aoki et al.)",
        "packages": "debian-reference-zh-cn",
        "licence": "GPL-2+",
    },
}
_CORPUS_VERSION = "v1"


class CorpusError(ValueError):
    """A corpus file is missing or malformed, or the default corpus is not installed."""


# ------------------------------------------------------------------------------ default corpus


def _atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_KJV_TITLE = re.compile(r"^[1-3]? ?[A-Z][A-Za-z ]* \d+$")  # "Genesis 1", "1 Samuel 3", "Song of Solomon 2"


def kjv_chapters_text(printed: str) -> str:
    """The output of ``bible -l100000 gen1:1-rev22:21`` -> one paragraph per chapter: the title
    line (``Genesis 1``), then the chapter's verses joined by spaces, verse numbers dropped."""
    chapters, title, verses = [], None, []
    for line in printed.splitlines():
        if not line.strip():
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        if m:
            verses.append(m.group(1).strip())
        elif _KJV_TITLE.match(line):
            if title is not None:
                chapters.append(title + "\n" + " ".join(verses))
            title, verses = line.strip(), []
        elif verses:  # a wrapped continuation line
            verses[-1] += " " + line.strip()
    if title is not None:
        chapters.append(title + "\n" + " ".join(verses))
    return "\n\n".join(chapters) + "\n"


_CJK_END = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]$")
_CJK_START = re.compile(r"^[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def unwrap_paragraphs(text: str) -> str:
    """Join hard-wrapped lines within each paragraph: no space between two CJK characters, one
    space otherwise; paragraphs stay separated by a blank line."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.splitlines() if ln.strip()]
        if not lines:
            continue
        joined = lines[0]
        for ln in lines[1:]:
            joined += ("" if _CJK_END.search(joined) and _CJK_START.match(ln) else " ") + ln
        out.append(joined)
    return "\n\n".join(out) + "\n"


def default_corpus_files(refresh: bool = False) -> list[Path]:
    """The default corpus as two text files (paragraph = document), built once into
    ``cache_dir()/corpus`` from the installed Debian packages; raises :class:`CorpusError`
    naming the package when one is missing."""
    folder = cache_dir() / "corpus"
    kjv = folder / f"kjv-chapters-{_CORPUS_VERSION}.txt"
    zh = folder / f"debian-reference-zh-cn-{_CORPUS_VERSION}.txt"
    if refresh or not kjv.is_file():
        bible = shutil.which("bible")
        if bible is None or not Path("/usr/lib/bible.data").exists():
            raise CorpusError(
                "the default corpus needs the King James Bible: apt-get install bible-kjv bible-kjv-text "
                "(or run .ci/system-deps.sh), or give corpus files explicitly"
            )
        try:
            printed = subprocess.run(
                [bible, "-l100000", "gen1:1-rev22:21"], capture_output=True, text=True, check=True, timeout=300
            ).stdout
        except (subprocess.SubprocessError, OSError) as err:
            raise CorpusError(f"`bible` (package bible-kjv) failed to print the KJV: {err}") from None
        text = kjv_chapters_text(printed)
        if len(text) < 1_000_000:
            raise CorpusError(f"`bible` printed only {len(text)} characters of the KJV; is bible-kjv-text complete?")
        _atomic_write_text(kjv, text)
    if refresh or not zh.is_file():
        if not ZH_REFERENCE.is_file():
            raise CorpusError(
                f"the default corpus needs {ZH_REFERENCE}: apt-get install debian-reference-zh-cn "
                "(or run .ci/system-deps.sh), or give corpus files explicitly"
            )
        with gzip.open(ZH_REFERENCE, "rt", encoding="utf-8", errors="replace") as fh:
            _atomic_write_text(zh, unwrap_paragraphs(fh.read()))
    return [kjv, zh]


def default_corpus_sources() -> list[dict]:
    """Name, Debian packages and licence of each default corpus file."""
    return [{"file": name, **meta} for name, meta in SOURCES.items()]


# ----------------------------------------------------------------------------------- reading


def is_jsonl(path: str | Path) -> bool:
    name = Path(path).name.lower()
    name = name.removesuffix(".gz")
    return name.endswith(JSONL_SUFFIXES)


def _open_text(path: Path) -> io.TextIOBase:
    if not path.is_file():
        raise CorpusError(f"corpus file {path} does not exist")
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="")
    return open(path, encoding="utf-8", errors="replace", newline="")


def _split_long(text: str, max_chars: int) -> Iterator[str]:
    """Cut at line ends into pieces of about ``max_chars`` (a single longer line is cut hard)."""
    while len(text) > max_chars:
        cut = text.rfind("\n", 0, max_chars) + 1 or max_chars
        yield text[:cut]
        text = text[cut:]
    if text:
        yield text


def iter_documents(
    path: str | Path, text_field: str = "text", doc_mode: str = "paragraph", max_doc_chars: int = 1 << 16
) -> Iterator[tuple[str, bool]]:
    """``(text, continues)`` pieces of the documents of one file, in order; ``continues`` is True
    for the second and later pieces of a document longer than ``max_doc_chars``."""
    path = Path(path)
    if doc_mode not in DOC_MODES:
        raise CorpusError(f"doc_mode {doc_mode!r} unknown; expected one of {DOC_MODES}")

    def pieces(doc: str) -> Iterator[tuple[str, bool]]:
        for i, piece in enumerate(_split_long(doc, max_doc_chars)):
            yield piece, i > 0

    with _open_text(path) as fh:
        try:
            if is_jsonl(path):
                for lineno, line in enumerate(fh, 1):
                    if not line.strip():
                        continue
                    try:
                        obj = json.loads(line)
                    except json.JSONDecodeError as err:
                        raise CorpusError(f"{path}:{lineno}: not valid JSON: {err}") from None
                    text = obj.get(text_field) if isinstance(obj, dict) else None
                    if not isinstance(text, str):
                        raise CorpusError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
                    if text:
                        yield from pieces(text)
            elif doc_mode == "line":
                for line in fh:
                    if line.strip():
                        yield from pieces(line.rstrip("\r\n"))
            elif doc_mode == "paragraph":
                buf: list[str] = []
                size = 0
                started = False  # a piece of the current paragraph was already yielded
                for line in fh:
                    if line.strip():
                        buf.append(line)
                        size += len(line)
                        if size > max_doc_chars:  # emit the full pieces, keep the rest buffered
                            *full, rest = _split_long("".join(buf), max_doc_chars)
                            for piece in full:
                                yield piece, started
                                started = True
                            buf, size = [rest], len(rest)
                        continue
                    if buf:
                        yield "".join(buf).rstrip("\r\n"), started
                    buf, size, started = [], 0, False
                if buf:
                    yield "".join(buf).rstrip("\r\n"), started
            else:  # file: one sequence streamed in pieces
                first = True
                while True:
                    chunk = fh.read(max_doc_chars)
                    if not chunk:
                        break
                    rest = fh.readline()  # finish the line so cuts fall at line ends
                    yield chunk + rest, not first
                    first = False
        except (OSError, EOFError, UnicodeError) as err:
            raise CorpusError(f"corpus file {path} could not be read: {err}") from None


# --------------------------------------------------------------------------------- counting


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


def count_corpus(
    files: Iterable[str | Path],
    config: EngramConfig | str = "tiny",
    tokenizer=None,
    max_tokens: int | None = None,
    text_field: str = "text",
    doc_mode: str = "paragraph",
    bos: bool = True,
    batch_chars: int = 1 << 22,
    max_doc_chars: int = 1 << 16,
    progress: bool = True,
    counts: NgramCounts | None = None,
) -> CorpusStats:
    """Stream ``files`` into an :class:`NgramCounts` (documents as in the module docstring).
    Memory: one batch of about ``batch_chars`` characters at a time, plus the counts."""
    from tqdm.auto import tqdm

    cfg = load_config(config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    files = [Path(f) for f in files]
    if not files:
        raise CorpusError("no corpus files given")
    for f in files:
        if not f.is_file():
            raise CorpusError(f"corpus file {f} does not exist")
    if max_tokens is not None and max_tokens < 1:
        raise CorpusError(f"max_tokens must be positive, got {max_tokens}")
    stream = StreamWindows(cfg, tok.token_map)
    counts = counts if counts is not None else NgramCounts(cfg, stream.pad_id)
    stats = CorpusStats(counts, np.zeros(cfg.vocab_size, dtype=np.int64))
    t0 = time.perf_counter()
    bar = tqdm(total=max_tokens, unit="tok", unit_scale=True, disable=not progress, desc="corpus")

    def flush(texts: list[str], continues: list[bool], record: dict) -> bool:
        """Tokenize and count one batch; False once max_tokens is reached."""
        if not texts:
            return True
        encoded = tok.backend.encode_batch(texts, add_special_tokens=False)
        parts, starts = [], []
        for enc, cont in zip(encoded, continues):
            ids = enc.ids
            if not cont and bos:
                ids = [BOS_ID, *ids]
            if not ids:
                continue
            arr = np.asarray(ids, dtype=np.int64)
            st = np.zeros(len(arr), dtype=bool)
            st[0] = not cont
            parts.append(arr)
            starts.append(st)
        if not parts:
            return True
        ids, st = np.concatenate(parts), np.concatenate(starts)
        done = False
        if max_tokens is not None and stats.tokens + len(ids) >= max_tokens:
            keep = max_tokens - stats.tokens
            ids, st, done = ids[:keep], st[:keep], True
        counts.add_windows(stream(ids, st))
        stats.raw_counts += np.bincount(ids, minlength=len(stats.raw_counts))
        stats.tokens += len(ids)
        record["tokens"] += len(ids)
        bar.update(len(ids))
        return not done

    try:
        going = True
        for path in files:
            if not going:
                break
            record = {
                "path": str(path),
                "format": "jsonl" if is_jsonl(path) else "text",
                "bytes": path.stat().st_size,
                "documents": 0,
                "tokens": 0,
            }
            stats.files.append(record)
            bar.set_postfix_str(path.name)
            texts, continues, size = [], [], 0
            first = True
            for text, cont in iter_documents(path, text_field, doc_mode, max_doc_chars):
                cont = cont and not first  # a file always starts a sequence
                first = False
                texts.append(text)
                continues.append(cont)
                size += len(text)
                if not cont:
                    record["documents"] += 1
                    stats.documents += 1
                if size >= batch_chars:
                    going = flush(texts, continues, record)
                    texts, continues, size = [], [], 0
                    if not going:
                        break
            if going:
                going = flush(texts, continues, record)
        stats.truncated = not going  # stopped at max_tokens (the input may have ended there too)
    finally:
        bar.close()
    stats.elapsed_s = time.perf_counter() - t0
    return stats


# ---------------------------------------------------------------------------------- writing


def write_table(df: pd.DataFrame, out_dir: str | Path, name: str) -> list[Path]:
    """``NAME.parquet`` and ``NAME.csv`` in ``out_dir``, each written to a temp file then renamed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for suffix, write in (
        (".parquet", lambda p: df.to_parquet(p, index=False)),
        (".csv", lambda p: df.to_csv(p, index=False)),
    ):
        path = out_dir / f"{name}{suffix}"
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            write(tmp)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise
        written.append(path)
    return written


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far, in MiB (Linux ru_maxrss is in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@dataclass
class CorpusResult:
    stats: CorpusStats
    usage: RowUsage
    collisions: CollisionStats
    tables: dict[str, pd.DataFrame]
    summary: dict
    out_dir: Path


def run_corpus(
    files: Iterable[str | Path] | None,
    out_dir: str | Path,
    config: EngramConfig | str = "tiny",
    tokenizer=None,
    max_tokens: int | None = None,
    text_field: str = "text",
    doc_mode: str = "paragraph",
    bos: bool = True,
    top: int = 20,
    save_counts: bool = False,
    progress: bool = True,
) -> CorpusResult:
    """The ``engram-viz corpus`` job: count ``files`` (None: ``default_corpus_files()``), derive
    the row-usage and collision tables, write them and ``summary.json`` to ``out_dir``."""
    cfg = load_config(config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    default = files is None
    files = default_corpus_files() if default else [Path(f) for f in files]
    stats = count_corpus(files, cfg, tok, max_tokens, text_field, doc_mode, bos, progress=progress)
    t0 = time.perf_counter()
    usage = RowUsage(cfg, stats.counts)
    collisions = CollisionStats(cfg, stats.counts)  # shares the counts: nothing more is added
    analyse_together(usage, collisions, top=top)  # one pass over the columns for both
    decoder = NgramDecoder(tok, stats.counts.pad_id, stats.raw_counts)  # show each id as its commonest form
    tables = {f"row_usage_{k}": v for k, v in usage.to_frame(top=top, tokenizer=decoder).items()}
    tables.update({f"collisions_{k}": v for k, v in collisions.to_frame(tokenizer=decoder).items()})
    tables["corpus_files"] = pd.DataFrame(stats.files, columns=["path", "format", "bytes", "documents", "tokens"])
    analysis_s = time.perf_counter() - t0
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, df in tables.items():
        write_table(df, out_dir, name)
    if save_counts:
        stats.counts.save(out_dir / "ngram_counts.npz")
    summary = {
        "config": cfg.name,
        "files": stats.files,
        "default_corpus": default_corpus_sources() if default else None,
        "doc_mode": doc_mode,
        "text_field": text_field,
        "bos": bos,
        "max_tokens": max_tokens,
        "truncated": stats.truncated,
        "tokens": stats.tokens,
        "documents": stats.documents,
        "distinct_ngrams": {str(n): stats.counts.n_distinct(n) for n in cfg.ngram_orders},
        "count_s": round(stats.elapsed_s, 3),
        "analysis_s": round(analysis_s, 3),
        "tokens_per_s": round(stats.tokens / max(stats.elapsed_s, 1e-9)),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "row_usage": usage.summary(),
        "collisions": collisions.summary(),
        "tables": sorted(tables),
    }
    _atomic_write_text(out_dir / "summary.json", json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    return CorpusResult(stats, usage, collisions, tables, summary, out_dir)
