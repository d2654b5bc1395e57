"""The corpus path's batch tokenizer (fastokens when installed) against the ``tokenizers`` reference
on real text: the whole default corpus as the corpus job reads it, and every training source."""

from __future__ import annotations

import numpy as np
import pytest

from engram_viz.analysis.corpus.default_corpus import default_corpus_files
from engram_viz.analysis.corpus.documents import CorpusError, iter_documents
from engram_viz.tiny.sources import SOURCES, SourceMissingError, source_documents


def assert_reference_ids(tok, texts: list[str]) -> None:
    """``encode_batch`` equals the reference batch API text by text (lengths and every id)."""
    ids, lengths = tok.encode_batch(texts)
    ref = tok.backend.encode_batch(texts, add_special_tokens=False)
    assert lengths.tolist() == [len(e.ids) for e in ref]
    assert np.array_equal(ids, np.fromiter((i for e in ref for i in e.ids), dtype=np.int64, count=len(ids)))


def test_default_corpus_tokenizes_to_the_reference_ids(tokenizer):
    try:
        files = default_corpus_files()
    except CorpusError as err:
        pytest.skip(f"default corpus not installed (.ci/system-deps.sh installs it): {err}")
    texts = [text for f in files for text, _ in iter_documents(f)]  # the pieces count_corpus encodes
    assert len(texts) > 1000
    assert_reference_ids(tokenizer, texts)


@pytest.mark.parametrize("key", sorted(SOURCES))
def test_training_source_tokenizes_to_the_reference_ids(tokenizer, key):
    try:
        docs = source_documents(key)
    except SourceMissingError as err:
        pytest.skip(str(err))
    assert_reference_ids(tokenizer, docs)
