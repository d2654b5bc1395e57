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
import re
import shutil
import subprocess
from pathlib import Path

from engram_viz._cache import cached_path, is_verified
from engram_viz.analysis.documents import CorpusError
from engram_viz.settings import cache_dir

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
    if refresh or not is_verified(kjv):
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
