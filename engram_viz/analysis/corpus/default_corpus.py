"""The default corpus, built from Debian packages a fresh machine can install (``.ci/system-deps.sh``).

The King James Bible (``bible-kjv`` + ``bible-kjv-text``; the 1611 text is public domain; the
``bible`` program that prints it is GPL-2+), one chapter per document, verse numbers dropped; and
the Chinese Debian Reference (``debian-reference-zh-cn``, GPL-2+), one paragraph per document
with hard line wraps joined. Together about 1.3M tokens. Both are written once into
``settings.cache_dir()/corpus``, each with a sha256 sidecar (``engram_viz._cache``): a file that
no longer matches it is rebuilt.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

from engram_viz._cache import cached_path, is_verified
from engram_viz.analysis.corpus.documents import CorpusError
from engram_viz.settings import cache_dir
from engram_viz.tiny import sources

ZH_REFERENCE = sources.ZH_REFERENCE
SOURCES = {  # file -> name, Debian packages, licence (from the one source table, tiny.sources.SOURCES)
    "kjv-chapters.txt": {k: sources.SOURCES["kjv"][k] for k in ("name", "packages", "licence")},
    "debian-reference-zh-cn.txt": {k: sources.SOURCES["zh-ref"][k] for k in ("name", "packages", "licence")},
}
_CORPUS_VERSION = "v1"


def kjv_chapters_text(printed: str) -> str:
    """The output of ``bible -l100000 gen1:1-rev22:21`` -> one paragraph per chapter (the title line,
    then the chapter's verses, numbers dropped): ``tiny.sources.kjv_chapters``, as the tiny LM reads it."""
    return "\n\n".join(sources.kjv_chapters(printed)) + "\n"


def unwrap_paragraphs(text: str) -> str:
    """Hard-wrapped lines joined within each paragraph (``tiny.sources.unwrap_paragraphs``: no space
    between two CJK characters, one space otherwise); paragraphs separated by a blank line. The
    tiny LM trains on the prose subset of these paragraphs (``tiny.sources.zh_prose``)."""
    return "\n\n".join(sources.unwrap_paragraphs(text)) + "\n"


def default_corpus_files(refresh: bool = False) -> list[Path]:
    """The default corpus as two text files (paragraph = document), built once into
    ``cache_dir()/corpus`` from the installed Debian packages; raises :class:`CorpusError`
    naming the package when one is missing."""
    folder = cache_dir() / "corpus"
    kjv = folder / f"kjv-chapters-{_CORPUS_VERSION}.txt"
    zh = folder / f"debian-reference-zh-cn-{_CORPUS_VERSION}.txt"
    if refresh or not is_verified(kjv):
        bible = shutil.which("bible")
        if bible is None or not Path("/usr/lib/bible.data").exists():
            raise CorpusError(
                "the default corpus needs the King James Bible: apt-get install bible-kjv bible-kjv-text "
                "(or run .ci/system-deps.sh), or give corpus files explicitly"
            )
        try:
            printed = sources.print_bible(bible)
        except sources.SourceMissingError as err:
            raise CorpusError(str(err)) from None
        text = kjv_chapters_text(printed)
        if len(text) < 1_000_000:
            raise CorpusError(f"`bible` printed only {len(text)} characters of the KJV; is bible-kjv-text complete?")
        _write_cached(kjv, text)
    if refresh or not is_verified(zh):
        if not ZH_REFERENCE.is_file():
            raise CorpusError(
                f"the default corpus needs {ZH_REFERENCE}: apt-get install debian-reference-zh-cn "
                "(or run .ci/system-deps.sh), or give corpus files explicitly"
            )
        with gzip.open(ZH_REFERENCE, "rt", encoding="utf-8", errors="replace") as fh:
            _write_cached(zh, unwrap_paragraphs(fh.read()))
    return [kjv, zh]


def _write_cached(path: Path, text: str) -> None:
    """A corpus file and its sha256 sidecar (an edited file is rebuilt at the next call)."""
    with cached_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def default_corpus_sources() -> list[dict]:
    """Name, Debian packages and licence of each default corpus file."""
    return [{"file": name, **meta} for name, meta in SOURCES.items()]
