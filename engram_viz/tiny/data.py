"""The tiny LM's training data: documents, the fixed split, the small vocabulary, the windows.

Sources: the King James Bible (Debian ``bible-kjv-text``, public domain) and the Chinese
translation of the Debian Reference (Debian ``debian-reference-zh-cn``). Each document (a Bible
chapter; a ~1,000-character run of Chinese paragraphs) is tokenised with the V4 tokenizer, BOS
first. Every 25th document (index % 25 == 12) is held out; the rest are concatenated into one
training stream. A training batch is ``batch`` windows of ``seq_len + 1`` tokens starting at
offsets drawn from a ``torch.Generator`` seeded with the seed (:func:`batch_offsets`); held-out
loss is the mean over fixed non-overlapping windows of the held-out stream
(:func:`heldout_windows`). Every window hashes as a fresh prompt.
"""

from __future__ import annotations

import gzip
import re
import subprocess
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engram_viz.config import load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer

HOLDOUT_EVERY, HOLDOUT_AT = 25, 12
ZH_DOC_CHARS = 1000
VOCAB_ROWS = 4096  # the small vocabulary: unknown row 0 + the 4,095 commonest raw ids of the training split


def _kjv_text() -> str:
    """The whole KJV as printed by Debian's ``bible`` program (bible-kjv)."""
    try:
        out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise FileNotFoundError("the `bible` program is missing: apt-get install bible-kjv bible-kjv-text") from None
    return out.stdout


def kjv_documents(text: str | None = None) -> list[str]:
    """One document per chapter: ``"Genesis 1\\nIn the beginning ..."``, verse numbers dropped."""
    text = _kjv_text() if text is None else text
    docs, title, verses = [], None, []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" ") and re.match(r"^[1-3]?\s?[A-Za-z ]+ \d+$", line.strip()):
            if title is not None:
                docs.append(title + "\n" + " ".join(verses))
            title, verses = line.strip(), []
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        verses.append((m.group(1) if m else line).strip())
    if title is not None:
        docs.append(title + "\n" + " ".join(verses))
    return docs


ZH_REFERENCE = Path("/usr/share/debian-reference/debian-reference.zh-cn.txt.gz")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def zh_documents(path: Path = ZH_REFERENCE) -> list[str]:
    """Chinese prose paragraphs of the Debian Reference (tables, code lines and paragraphs
    without Chinese characters dropped), grouped into documents of ~1,000 characters."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: apt-get install debian-reference-zh-cn")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        raw = unicodedata.normalize("NFC", fh.read()).replace("\u00a0", " ")
    paras, cur = [], []
    for line in raw.splitlines():
        s = line.strip()
        if not s or s[0] in "|+-$#" or s.startswith("*"):
            if cur:
                paras.append("".join(cur) if _CJK.search("".join(cur)) else "")
                cur = []
            continue
        cur.append(s if not cur or _CJK.match(s[0]) else " " + s)
    if cur:
        paras.append("".join(cur))
    docs, acc = [], ""
    for p in (p for p in paras if p and _CJK.search(p)):
        acc = acc + "\n" + p if acc else p
        if len(acc) >= ZH_DOC_CHARS:
            docs.append(acc)
            acc = ""
    if acc:
        docs.append(acc)
    return docs


@dataclass
class Corpus:
    """Token streams (raw V4 ids, int64) of the fixed split, and the small vocabulary."""

    train: torch.Tensor
    heldout: torch.Tensor
    raw_ids: torch.Tensor  # [V] raw id of each small-vocab row; raw_ids[0] = -1 (unknown)
    n_docs: dict


def build_corpus(config="tiny", vocab_rows: int = VOCAB_ROWS) -> Corpus:
    """Tokenise both sources, split every 25th document off, build the vocabulary from train: the
    ``vocab_rows - 1`` commonest raw ids (ties: lower id first), sorted by id, after the unknown row."""
    tok = get_tokenizer(load_config(config))
    docs = [("en", d) for d in kjv_documents()] + [("zh", d) for d in zh_documents()]
    enc = tok.backend.encode_batch([d for _, d in docs], add_special_tokens=False)
    train, held = [], []
    n_docs = {"en_train": 0, "en_heldout": 0, "zh_train": 0, "zh_heldout": 0}
    for i, ((lang, _), e) in enumerate(zip(docs, enc)):
        is_held = i % HOLDOUT_EVERY == HOLDOUT_AT
        (held if is_held else train).append([BOS_ID, *e.ids])
        n_docs[f"{lang}_{'heldout' if is_held else 'train'}"] += 1
    train_ids = torch.tensor([t for d in train for t in d], dtype=torch.int64)
    held_ids = torch.tensor([t for d in held for t in d], dtype=torch.int64)
    counts = torch.bincount(train_ids, minlength=tok.vocab_size)
    order = np.lexsort((np.arange(len(counts)), -counts.numpy()))  # by count desc, then id
    kept = torch.from_numpy(np.sort(order[: vocab_rows - 1]))
    raw_ids = torch.cat([torch.tensor([-1]), kept])
    return Corpus(train_ids, held_ids, raw_ids, n_docs)


def batch_offsets(n_tokens: int, seq_len: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """``[steps, batch]`` window starts, a pure function of the seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len - 1, (steps, batch), generator=g)


def heldout_windows(heldout: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Fixed non-overlapping windows ``[N, seq_len + 1]`` of the held-out stream."""
    n = (len(heldout) - 1) // seq_len
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return heldout[idx]
