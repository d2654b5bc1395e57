"""The capped corpus sample the notebooks count: the first ``$ENGRAM_VIZ_CORPUS_TOKENS`` (60,000)
tokens of each default corpus file, or the shipped prompt set's texts where the default corpus is
not installed (kept apart from ``counting``: the prompt reader imports torch, counting does not)."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from engram_viz import settings
from engram_viz.analysis.corpus.counting import CorpusStats, count_corpus
from engram_viz.analysis.corpus.default_corpus import default_corpus_files, default_corpus_sources
from engram_viz.analysis.corpus.documents import CorpusError, DocumentSpec
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.prompts import load_prompts

SAMPLE_TOKENS = 60_000  # tokens per default corpus file, unless the environment says


def corpus_sample(
    config: EngramConfig | str = "v41-flash", tokens_per_file: int | None = None, tokenizer: Any = None
) -> tuple[CorpusStats, str]:
    """``(CorpusStats, description)``: the first ``tokens_per_file`` tokens (default
    ``$ENGRAM_VIZ_CORPUS_TOKENS``, else 60,000) of each default corpus file (the KJV, the Chinese
    Debian Reference), counted into one ``NgramCounts``. Without the Debian packages: the shipped
    prompt set's texts, and the description says so."""
    cfg = load_config(config)
    tok = tokenizer if tokenizer is not None else get_tokenizer(cfg)
    cap = tokens_per_file or settings.corpus_tokens(SAMPLE_TOKENS)
    try:
        files = default_corpus_files()
        names = [s["name"] for s in default_corpus_sources()]
        desc = f"default corpus: first {cap:,} tokens of each of " + "; ".join(names)
    except CorpusError as err:
        tmp = Path(tempfile.mkdtemp(prefix="engram-viz-corpus-"))
        text = "\n\n".join(p.text for p in load_prompts() if p.text)
        (tmp / "prompts.txt").write_text(text, encoding="utf-8")
        files = [tmp / "prompts.txt"]
        desc = f"FALLBACK corpus (the shipped prompt set): the default corpus is not installed ({err})"
    counts, stats = None, None
    for f in files:
        st = count_corpus([f], cfg, tok, cap, DocumentSpec(batch_chars=1 << 17), progress=False, counts=counts)
        counts = st.counts
        if stats is None:
            stats = st
        else:
            stats.files += st.files
            stats.tokens += st.tokens
            stats.documents += st.documents
            stats.raw_counts += st.raw_counts
            stats.elapsed_s += st.elapsed_s
    return stats, desc
