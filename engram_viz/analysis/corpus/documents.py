"""Corpus files as documents: plain text (paragraphs, lines or the whole file) or JSONL.

Plain text (``.txt``, or anything not JSONL; ``.gz`` is read transparently):
``doc_mode='paragraph'`` (default) makes every run of non-blank lines a document,
``'line'`` every non-blank line, ``'file'`` the whole file. JSONL (``.jsonl``, ``.ndjson``,
also ``.gz``): one document per line, its ``text_field`` (``text``). A document longer than
``max_doc_chars`` is cut at line ends into pieces (``continues`` True for the later ones). Text is
decoded as UTF-8 with invalid bytes replaced by U+FFFD (and so is an unpaired surrogate escape
in a JSONL text, ``"\\ud800"``: valid JSON, but no text). A corpus file must be a regular file,
and one that changes while it is read (:func:`file_stamp`: size, modification time, inode) is
refused. :class:`DocumentSpec` holds these options, and how the documents are counted (BOS,
batch size), as one value the counting functions take.
"""

from __future__ import annotations

import contextlib
import errno
import gzip
import io
import json
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from engram_viz.errors import CorpusError

DOC_MODES = ("paragraph", "line", "file")
JSONL_SUFFIXES = (".jsonl", ".ndjson")
_SURROGATE = re.compile("[\ud800-\udfff]")  # what json.loads leaves of an unpaired \uXXXX escape


@dataclass(frozen=True)
class DocumentSpec:
    """How corpus files become counted documents (``counting.count_corpus``, ``dask_counting``,
    ``engram-viz corpus``): the reading options of :func:`iter_documents` and the counting ones."""

    text_field: str = "text"  # JSONL: the field holding a document's text
    doc_mode: str = "paragraph"  # plain text: a document per paragraph, line or file (DOC_MODES)
    max_doc_chars: int = 1 << 16  # a longer document is cut at line ends into pieces (one sequence still)
    bos: bool = True  # every document's sequence starts with BOS
    batch_chars: int = 1 << 22  # characters tokenized and counted at a time (a Dask task's bytes)


class Span(NamedTuple):
    """Bytes ``start:stop`` of a plain-text corpus file, cut where a document starts; ``line0``:
    the lines before it (as the file's own reading counts them); ``source``: the gzipped corpus
    file that ``path`` is the decompressed copy of (named in errors), None for a plain file;
    ``stamp``: the plain file's :func:`file_stamp` when it was cut, checked again as the span is
    read (None: not checked, as for a decompressed copy, which grows while it is cut)."""

    path: Path
    start: int
    stop: int
    line0: int
    source: Path | None = None
    stamp: tuple[int, int, int] | None = None

    @property
    def shown(self) -> Path:
        """The corpus file the span's documents come from, as errors name it."""
        return self.source or self.path


def is_gzip(path: str | Path) -> bool:
    return Path(path).name.lower().endswith(".gz")


def is_jsonl(path: str | Path) -> bool:
    name = Path(path).name.lower()
    name = name.removesuffix(".gz")
    return name.endswith(JSONL_SUFFIXES)


def _kind(mode: int) -> str:
    """What a file that is not a regular one is, in words."""
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    return "a socket" if stat.S_ISSOCK(mode) else "a special file"


def corpus_file_stat(path: str | Path) -> os.stat_result:
    """The ``os.stat`` of a corpus file, else ``CorpusError`` saying what ``path`` is instead: missing,
    a dangling symlink, a symlink loop, a folder, a FIFO or a device (a corpus file is read more
    than once, from offsets, so it must be a regular file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        dangling = os.path.islink(path)
        what = f"is a dangling symlink (to {os.readlink(path)})" if dangling else "does not exist"
        raise CorpusError(f"corpus file {path} {what}") from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise CorpusError(f"corpus file {path} is a symlink loop (it never reaches a file)") from None
        raise CorpusError(f"corpus file {path} cannot be read: {err.strerror or err}") from None
    if not stat.S_ISREG(st.st_mode):
        hint = f"; give the files in it (e.g. {Path(path) / '*.txt'})" if stat.S_ISDIR(st.st_mode) else ""
        raise CorpusError(f"corpus file {path} is {_kind(st.st_mode)}, not a regular text or JSONL file{hint}")
    return st


def file_stamp(path: str | Path) -> tuple[int, int, int]:
    """``(size, modification time in ns, inode)`` of a corpus file: what must not change
    while it is read (:func:`check_unchanged`)."""
    st = corpus_file_stat(path)
    return st.st_size, st.st_mtime_ns, st.st_ino  # not the device: a worker mounting a shared disk sees another


def check_unchanged(path: str | Path, stamp: tuple[int, int, int]) -> None:
    """``CorpusError`` when ``path`` is no longer the file stamped ``stamp`` (:func:`file_stamp`):
    a file changed while it was counted would be counted as a mix of two files."""
    try:
        now = file_stamp(path)
    except CorpusError as err:
        raise CorpusError(f"corpus file {path} changed while it was read: {err}") from None
    if now != stamp:
        what = f"{stamp[0]} bytes -> {now[0]} bytes" if now[0] != stamp[0] else "modified or replaced, same size"
        raise CorpusError(
            f"corpus file {path} changed while it was read ({what}); count it again once nothing writes to it"
        )


def _open_text(path: Path) -> io.TextIOBase:
    corpus_file_stat(path)
    if is_gzip(path):
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
    stamp = file_stamp(path)
    with _open_text(path) as fh:
        yield from _parse(fh, path, text_field, doc_mode, max_doc_chars, 0)
    check_unchanged(path, stamp)


def document_spans(
    path: str | Path, doc_mode: str = "paragraph", span_bytes: int = 1 << 22, spool: str | Path | None = None
) -> Iterator[Span]:
    """A corpus file cut into byte spans of whole documents, each of about ``span_bytes`` or more:
    a cut falls only after a line end, and in ``paragraph`` mode only after a blank line, so the
    documents of the spans (:func:`iter_span_documents`) are exactly the file's. ``file`` mode is
    one span. Reads the file once, a line at a time.

    A gzipped file cannot be read from the middle: it is decompressed into ``spool`` (a new plain
    file, required then) as it is read, the spans are of ``spool`` (``source``: the gzipped file),
    and each span's bytes are on disk (flushed and synced) before it is yielded."""
    path = Path(path)
    if doc_mode not in DOC_MODES:
        raise CorpusError(f"doc_mode {doc_mode!r} unknown; expected one of {DOC_MODES}")
    stamp = file_stamp(path)
    gz = is_gzip(path)
    if gz and spool is None:
        raise CorpusError(f"{path} is gzipped: document_spans needs a spool file to decompress it into")
    every_line = is_jsonl(path) or doc_mode == "line"  # else after a blank line (paragraph) or never (file)
    start = pos = lines = line0 = 0
    try:
        with (
            gzip.open(path, "rb") if gz else open(path, "rb") as fh,
            open(spool, "xb") if gz else contextlib.nullcontext() as copy,
        ):
            spanned = Path(spool) if gz else path
            source = path if gz else None
            for line in fh:  # binary lines end at b"\n"; a \r\n only at the end of one
                if copy:
                    copy.write(line)
                pos += len(line)
                lines += line.count(b"\n") + line.count(b"\r") - line.count(b"\r\n")  # as newline="" reads them
                cut = every_line or (doc_mode == "paragraph" and not line.strip())
                if cut and pos - start >= span_bytes:
                    _synced(copy)
                    yield Span(spanned, start, pos, line0, source, None if gz else stamp)
                    start, line0 = pos, lines
            _synced(copy)
    except (OSError, EOFError) as err:  # a corrupt or truncated gzip stream, a full disk
        into = f" (decompressing into {spool})" if gz else ""
        raise CorpusError(f"corpus file {path} could not be read{into}: {err}") from None
    check_unchanged(path, stamp)  # the spans cut are of the file as it still is
    if pos > start:
        yield Span(spanned, start, pos, line0, source, None if gz else stamp)


def _synced(copy) -> None:
    """The bytes written to a decompressed copy on disk, for readers on other machines too."""
    if copy:
        copy.flush()
        os.fsync(copy.fileno())


def iter_span_documents(
    span: Span, text_field: str = "text", doc_mode: str = "paragraph", max_doc_chars: int = 1 << 16
) -> Iterator[tuple[str, bool]]:
    """The ``(text, continues)`` pieces of one span of :func:`document_spans` (JSONL errors name
    the line in the whole file)."""
    if span.stamp is not None:
        check_unchanged(span.path, span.stamp)
    try:
        with open(span.path, "rb") as fh:
            fh.seek(span.start)
            data = fh.read(span.stop - span.start)
    except OSError as err:
        copy = f" (its decompressed copy {span.path})" if span.source else ""
        raise CorpusError(f"corpus file {span.shown} could not be read{copy}: {err}") from None
    if span.stamp is not None:
        check_unchanged(span.path, span.stamp)
    with io.TextIOWrapper(io.BytesIO(data), encoding="utf-8", errors="replace", newline="") as fh:
        yield from _parse(fh, span.shown, text_field, doc_mode, max_doc_chars, span.line0)


def _parse(
    fh: io.TextIOBase, path: Path, text_field: str, doc_mode: str, max_doc_chars: int, line0: int
) -> Iterator[tuple[str, bool]]:
    """The pieces of the documents read from ``fh`` (``path``'s text from line ``line0`` on)."""

    def pieces(doc: str) -> Iterator[tuple[str, bool]]:
        for i, piece in enumerate(_split_long(doc, max_doc_chars)):
            yield piece, i > 0

    try:
        if is_jsonl(path):
            for lineno, line in enumerate(fh, line0 + 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as err:
                    raise CorpusError(f"{path}:{lineno}: not valid JSON: {err}") from None
                text = obj.get(text_field) if isinstance(obj, dict) else None
                if not isinstance(text, str):
                    raise CorpusError(f"{path}:{lineno}: expected an object with a string field {text_field!r}")
                text = _SURROGATE.sub("\ufffd", text)  # as invalid UTF-8 bytes are read elsewhere
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
                if not line.isspace():  # a line read is never empty: isspace() is strip() == "" without a copy
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


def first_documents(path: str | Path, chars: int) -> list[str]:
    """The first paragraphs of a text file, about ``chars`` characters (a sample for a quick look)."""
    out, size = [], 0
    for text, _ in iter_documents(path, "text", "paragraph", 1 << 16):
        if size >= chars:
            break
        out.append(text)
        size += len(text)
    return out
