"""The corpus job: document reading, streaming counts == per-document hashing, tables, CLI."""

from __future__ import annotations

import gzip
import itertools
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from engram_viz._cache import cached_path
from engram_viz.analysis.corpus import counting, default_corpus
from engram_viz.analysis.corpus.counting import count_corpus
from engram_viz.analysis.corpus.default_corpus import default_corpus_files, kjv_chapters_text, unwrap_paragraphs
from engram_viz.analysis.corpus.documents import (
    DOC_MODES,
    CorpusError,
    DocumentSpec,
    document_spans,
    iter_documents,
    iter_span_documents,
)
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.row_ids import rows_from_windows
from engram_viz.analysis.corpus.windows import StreamWindows
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.cli import main
from engram_viz.config import load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import BOS_ID
from engram_viz.weights.resolve import weights_config

TEXT = (
    "In the beginning God created the heaven and the earth.\n"
    "And the earth was without form, and void.\n"
    "\n"
    "Alexander the Great tamed Bucephalus.\n"
    "\n\n"
    "中国古代的四大发明是造纸术、指南针、火药和印刷术。\n"
    "张仲景是东汉末年的名医。\n"
)
PARAGRAPHS = [
    "In the beginning God created the heaven and the earth.\nAnd the earth was without form, and void.",
    "Alexander the Great tamed Bucephalus.",
    "中国古代的四大发明是造纸术、指南针、火药和印刷术。\n张仲景是东汉末年的名医。",
]


@pytest.fixture()
def text_file(tmp_path) -> Path:
    path = tmp_path / "small.txt"
    path.write_text(TEXT, encoding="utf-8")
    return path


def _counts_per_document(cfg, tokenizer, docs: list[str], bos: bool = True) -> NgramCounts:
    counts = NgramCounts(cfg)
    for d in docs:
        ids = ([BOS_ID] if bos else []) + tokenizer.encode(d)
        counts.add_compressed(tokenizer.compress(ids))
    return counts


def test_iter_documents_modes(tmp_path, text_file):
    assert [t for t, _ in iter_documents(text_file)] == PARAGRAPHS
    assert [t for t, _ in iter_documents(text_file, doc_mode="line")] == [ln for ln in TEXT.splitlines() if ln]
    assert [t for t, _ in iter_documents(text_file, doc_mode="file")] == [TEXT]
    gz = tmp_path / "small.txt.gz"
    gz.write_bytes(gzip.compress(TEXT.encode()))
    assert [t for t, _ in iter_documents(gz)] == PARAGRAPHS
    jl = tmp_path / "d.jsonl"
    jl.write_text("\n".join(json.dumps({"text": p, "n": i}) for i, p in enumerate(PARAGRAPHS)) + "\n\n")
    assert [t for t, _ in iter_documents(jl)] == PARAGRAPHS
    other = tmp_path / "d2.jsonl"
    other.write_text(json.dumps({"body": "x"}) + "\n")
    assert [t for t, _ in iter_documents(other, text_field="body")] == ["x"]


def test_long_documents_are_cut_at_line_ends_and_continue(text_file):
    pieces = list(iter_documents(text_file, max_doc_chars=60))
    assert "".join(t for t, _ in pieces[:2]).rstrip("\n") == PARAGRAPHS[0]
    assert [c for _, c in pieces[:3]] == [False, True, False]
    for mode in ("line", "file", "paragraph"):
        joined, docs = "", []
        for t, cont in iter_documents(text_file, doc_mode=mode, max_doc_chars=25):
            if not cont and joined:
                docs.append(joined)
                joined = ""
            joined += t
        docs.append(joined)
        full = [t for t, _ in iter_documents(text_file, doc_mode=mode)]
        assert [d.rstrip("\n") for d in docs] == [d.rstrip("\n") for d in full]


def test_document_spans_hold_exactly_the_files_documents(tmp_path, text_file):
    """Spans of any size, read apart, give the file's pieces: cuts fall between documents, also with
    CRLF, lone CR and whitespace-only lines, invalid UTF-8 and documents longer than max_doc_chars."""
    odd = tmp_path / "odd.txt"
    odd.write_bytes(TEXT.encode() + b"a\r\nb\r\n \t\r\nc\rd\r\re\n\xff\xfe x\n\n\n" + b"long line " * 30 + b"\nend")
    jl = tmp_path / "docs.jsonl"
    jl.write_text("".join(json.dumps({"text": p}) + "\n" for p in PARAGRAPHS * 3) + "\n")
    files = [text_file, odd, jl]
    for f in list(files):  # gzipped: decompressed into a spool copy as it is cut
        files.append(tmp_path / f"{f.name}.gz")
        files[-1].write_bytes(gzip.compress(f.read_bytes()))
    for path in files:
        for mode, span_bytes in itertools.product(
            ("paragraph",) if "jsonl" in path.name else DOC_MODES, (1, 40, 1 << 20)
        ):
            copy = tmp_path / f"copy-{mode}-{span_bytes}-{path.name[:-3]}" if path.suffix == ".gz" else None
            spans = list(document_spans(path, mode, span_bytes, copy))
            plain = copy or path
            assert all(s.path == plain and s.source == (path if copy else None) for s in spans)
            assert spans[0].start == 0 and spans[-1].stop == plain.stat().st_size
            assert all(a.stop == b.start for a, b in itertools.pairwise(spans))
            assert len(spans) > 1 or span_bytes > 40 or mode == "file"
            read = [p for s in spans for p in iter_span_documents(s, doc_mode=mode, max_doc_chars=50)]
            assert read == list(iter_documents(path, doc_mode=mode, max_doc_chars=50)), (path.name, mode, span_bytes)
    jl.write_text('{"text": "ok"}\r\n{"text": "ok"}\r{"text": "ok"}\nnot json\n')
    with pytest.raises(CorpusError, match="docs.jsonl:4: not valid JSON"):
        [p for s in document_spans(jl, span_bytes=1) for p in iter_span_documents(s)]
    gz = tmp_path / "docs.jsonl.gz"
    gz.write_bytes(gzip.compress(jl.read_bytes()))
    with pytest.raises(CorpusError, match="docs.jsonl.gz:4: not valid JSON"):  # the gzipped file, not its copy
        [p for s in document_spans(gz, span_bytes=1, spool=tmp_path / "c1") for p in iter_span_documents(s)]
    gz.write_bytes(gzip.compress(jl.read_bytes())[:-9])
    with pytest.raises(CorpusError, match="corpus file .*docs.jsonl.gz could not be read"):
        list(document_spans(gz, spool=tmp_path / "c2"))
    with pytest.raises(ValueError, match="gzipped: document_spans needs a spool file"):
        list(document_spans(gz))
    with pytest.raises(CorpusError, match="doc_mode"):
        list(document_spans(jl, doc_mode="chapter"))


def test_bad_inputs(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n')
    with pytest.raises(CorpusError, match="bad.jsonl:2: not valid JSON"):
        list(iter_documents(bad))
    bad.write_text('{"title": "no text"}\n')
    with pytest.raises(CorpusError, match="string field 'text'"):
        list(iter_documents(bad))
    with pytest.raises(CorpusError, match="does not exist"):
        count_corpus([tmp_path / "missing.txt"], progress=False)
    with pytest.raises(CorpusError, match="doc_mode"):
        list(iter_documents(bad, doc_mode="chapter"))


@pytest.mark.parametrize("config_name", ["tiny", "v41-flash"])
def test_counts_equal_per_document_hashing(config_name, text_file, tokenizer):
    cfg = load_config(config_name)
    stats = count_corpus([text_file], cfg, tokenizer, progress=False)
    assert stats.counts == _counts_per_document(cfg, tokenizer, PARAGRAPHS)
    assert stats.documents == 3 and stats.tokens == sum(len(tokenizer.encode(p)) + 1 for p in PARAGRAPHS)
    assert stats.raw_counts.sum() == stats.tokens and not stats.truncated
    no_bos = count_corpus([text_file], cfg, tokenizer, spec=DocumentSpec(bos=False), progress=False)
    assert no_bos.counts == _counts_per_document(cfg, tokenizer, PARAGRAPHS, bos=False)


def test_batching_and_file_split_change_nothing(tmp_path, text_file, tokenizer):
    cfg = load_config("tiny")
    one = count_corpus([text_file], cfg, tokenizer, progress=False)
    tiny_batches = count_corpus([text_file], cfg, tokenizer, spec=DocumentSpec(batch_chars=10), progress=False)
    assert tiny_batches.counts == one.counts
    # two shards, counted separately and merged, equal the whole
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(PARAGRAPHS[0] + "\n\n" + PARAGRAPHS[1] + "\n")
    b.write_text(PARAGRAPHS[2] + "\n")
    merged = count_corpus([a], cfg, tokenizer, progress=False).counts.merge(
        count_corpus([b], cfg, tokenizer, progress=False).counts
    )
    assert merged == one.counts == count_corpus([a, b], cfg, tokenizer, progress=False).counts


def test_cut_documents_stay_one_sequence(text_file, tokenizer):
    """A paragraph cut into pieces is hashed as one sequence (the window carries over the cut)."""
    cfg = load_config("tiny")
    stats = count_corpus([text_file], cfg, tokenizer, spec=DocumentSpec(max_doc_chars=60), progress=False)
    pieces = list(iter_documents(text_file, max_doc_chars=60))
    seqs, cur = [], []
    for t, cont in pieces:
        if not cont and cur:
            seqs.append(cur)
            cur = []
        cur += ([] if cont else [BOS_ID]) + tokenizer.encode(t)
    seqs.append(cur)
    expected = NgramCounts(cfg)
    for s in seqs:
        expected.add_compressed(tokenizer.compress(s))
    assert stats.counts == expected and stats.documents == 3


def test_stream_hash_of_corpus_equals_ngram_hasher(text_file, tokenizer):
    """The numpy hash over the corpus's 1D stream (documents as sequence starts) == NgramHasher."""
    cfg = load_config("v41-flash")
    docs = [[BOS_ID, *tokenizer.encode(p)] for p in PARAGRAPHS]
    ids = np.concatenate([np.array(d) for d in docs])
    starts = np.zeros(len(ids), bool)
    starts[np.cumsum([0] + [len(d) for d in docs[:-1]])] = True
    rows = rows_from_windows(EngramLayout(cfg), StreamWindows(cfg, tokenizer.token_map)(ids, starts))
    ref = np.concatenate([hash_prompt(cfg, tokenizer.token_map, torch.tensor([d]))[0].numpy() for d in docs])
    assert np.array_equal(rows, ref)


def test_max_tokens(text_file, tokenizer):
    stats = count_corpus([text_file], "tiny", tokenizer, max_tokens=7, progress=False)
    assert stats.tokens == 7 and stats.truncated and stats.counts.n_positions == 7
    ids = [BOS_ID, *tokenizer.encode(PARAGRAPHS[0])][:7]
    expected = NgramCounts("tiny")
    expected.add_compressed(tokenizer.compress(ids))
    assert stats.counts == expected
    with pytest.raises(CorpusError, match="positive"):
        count_corpus([text_file], "tiny", tokenizer, max_tokens=0, progress=False)


def test_run_corpus_writes_tables(tmp_path, text_file, tokenizer):
    out = tmp_path / "out"
    result = run_corpus([text_file], out, "tiny", tokenizer, top=3, save_counts=True, progress=False)
    names = {
        "row_usage_columns",
        "row_usage_hit_histogram",
        "row_usage_rank_frequency",
        "row_usage_hot_rows",
        "collisions_columns",
        "collisions_heads_shared",
        "collisions_examples",
        "collisions_top_ngrams",
        "corpus_files",
    }
    assert set(result.tables) == names
    for name in names:
        a, b = pd.read_parquet(out / f"{name}.parquet"), pd.read_csv(out / f"{name}.csv")
        assert len(a) == len(b) == len(result.tables[name]) and list(a.columns) == list(b.columns)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == result.stats.tokens and summary["documents"] == 3
    assert summary["tables"] == sorted(names) and summary["config"] == "tiny"
    assert NgramCounts.load(out / "ngram_counts.npz", "tiny") == result.stats.counts
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]
    cov = pd.read_parquet(out / "row_usage_columns.parquet")
    assert cov.hits.groupby(cov.layer).sum().eq(result.stats.tokens * 24).all()


def test_corpus_functions_default_to_the_default_models_config(tmp_path, text_file, tokenizer):
    """Without a config, the library counts under the embedded default model's config (as the CLI
    does), not the ``tiny`` preset, whose table sizes differ: row ids match a default run's."""
    default = weights_config()
    assert default.engram_num_embeddings != load_config("tiny").engram_num_embeddings
    assert count_corpus([text_file], tokenizer=tokenizer, progress=False).counts.config == default
    result = run_corpus([text_file], tmp_path / "out", tokenizer=tokenizer, progress=False)
    assert result.stats.counts.config == default and result.summary["config"] == default.name


def test_run_corpus_refuses_workers_that_are_not_a_positive_integer(tmp_path, text_file, tokenizer):
    for workers in (0, -2, 1.5, True):
        with pytest.raises(CorpusError, match=f"workers must be a positive integer, got {workers!r}"):
            run_corpus([text_file], tmp_path / "out", "tiny", tokenizer, workers=workers, progress=False)
    assert not (tmp_path / "out").exists()


def test_cli_corpus(tmp_path, text_file, capsys):
    out = tmp_path / "cli"
    assert main(["corpus", str(text_file), "--out", str(out), "--max-tokens", "20", "--quiet", "--top", "2"]) == 0
    printed = capsys.readouterr().out
    assert "20 tokens" in printed and "wrote 9 tables" in printed
    assert (out / "collisions_columns.parquet").is_file() and (out / "summary.json").is_file()
    assert json.loads((out / "summary.json").read_text())["truncated"] is True
    assert main(["corpus", str(tmp_path / "nope.txt"), "--out", str(out), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_kjv_and_zh_text_shaping():
    printed = "\nGenesis 1\n\n  1 In the beginning.\n  2 And the earth\nwas void.\n\nGenesis 2\n\n  1 Thus.\n"
    assert kjv_chapters_text(printed) == "Genesis 1\nIn the beginning. And the earth was void.\n\nGenesis 2\nThus.\n"
    assert (
        unwrap_paragraphs("  这是一\n  份指南 and\n  more text\n\n第二段\n") == "这是一份指南 and more text\n\n第二段\n"
    )


def test_default_corpus_missing_package_names_it(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(default_corpus.shutil, "which", lambda name: None)
    with pytest.raises(CorpusError, match="bible-kjv-text"):
        default_corpus_files()
    (tmp_path / "corpus").mkdir()
    with cached_path(tmp_path / "corpus" / "kjv-chapters-v1.txt") as tmp:  # a verified cache entry
        tmp.write_text("cached\n")
    monkeypatch.setattr(default_corpus, "ZH_REFERENCE", tmp_path / "missing.txt.gz")
    with pytest.raises(CorpusError, match="debian-reference-zh-cn"):
        default_corpus_files()


@pytest.mark.skipif(
    shutil.which("bible") is None or not default_corpus.ZH_REFERENCE.is_file(),
    reason="system packages bible-kjv / debian-reference-zh-cn not installed (.ci/system-deps.sh installs them)",
)
def test_default_corpus_has_over_a_million_tokens(tokenizer):
    files = default_corpus_files()
    assert [f.name for f in files] == ["kjv-chapters-v1.txt", "debian-reference-zh-cn-v1.txt"]
    kjv = files[0].read_text(encoding="utf-8")
    assert kjv.startswith("Genesis 1\nIn the beginning God created the heaven and the earth.")
    assert kjv.count("\n\n") + 1 == 1189  # chapters
    stats = count_corpus(files, "tiny", tokenizer, progress=False)
    assert stats.tokens > 1_000_000 and stats.files[1]["tokens"] > 100_000


def _not_a_file(tmp_path: Path, kind: str) -> Path:
    """A path given as a corpus file that is no regular file."""
    path = tmp_path / kind
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "loop":
        os.symlink(tmp_path / "loop2", path)
        os.symlink(path, tmp_path / "loop2")
    elif kind == "dangling":
        os.symlink(tmp_path / "gone.txt", path)
    else:
        path = Path(os.devnull)
    return path


@pytest.mark.parametrize(
    ("kind", "said"),
    [
        ("folder", r"is a folder, not a regular text or JSONL file; give the files in it \(e\.g\. .*folder/\*\.txt\)"),
        ("fifo", r"is a FIFO \(named pipe\), not a regular text or JSONL file"),
        ("loop", r"is a symlink loop"),
        ("dangling", r"is a dangling symlink \(to .*gone\.txt\)"),
        ("devnull", r"is a character device, not a regular text or JSONL file"),
    ],
)
def test_a_corpus_file_that_is_no_regular_file_says_what_it_is(tmp_path, kind, said, capsys):
    """Each of these was reported as "does not exist"; now one line says what the path is."""
    path = _not_a_file(tmp_path, kind)
    for read in (lambda: list(iter_documents(path)), lambda: list(document_spans(path))):
        with pytest.raises(CorpusError, match=said):
            read()
    out = tmp_path / "out"
    for workers in ([], ["--workers", "2"]):  # refused before any cluster starts
        assert main(["corpus", str(path), "--out", str(out), "--quiet", *workers]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and re.search(f"corpus file {re.escape(str(path))} {said}", err), err
    assert not out.exists()


def test_a_lone_surrogate_escape_is_read_as_the_replacement_character(tmp_path, tokenizer):
    """Valid JSON, but no text: counted as U+FFFD, as invalid UTF-8 bytes are in every file, not a
    traceback from the tokenizer."""
    lone, replaced = tmp_path / "lone.jsonl", tmp_path / "replaced.jsonl"
    lone.write_text('{"text": "a \\ud800 b \\udfff"}\n{"text": "\\ud83d\\ude00 paired"}\n')
    replaced.write_text('{"text": "a \\ufffd b \\ufffd"}\n{"text": "\\ud83d\\ude00 paired"}\n')
    assert [t for t, _ in iter_documents(lone)] == ["a \ufffd b \ufffd", "\U0001f600 paired"]
    assert [t for t, _ in iter_span_documents(next(document_spans(lone)))] == ["a \ufffd b \ufffd", "\U0001f600 paired"]
    a = count_corpus([lone], "tiny", tokenizer, progress=False)
    b = count_corpus([replaced], "tiny", tokenizer, progress=False)
    assert a.counts == b.counts and a.tokens == b.tokens > 0


def test_a_file_changed_while_it_is_counted_is_refused(tmp_path, text_file, tokenizer, monkeypatch):
    """Truncated (or rewritten) after its first documents were read: counting it went on and mixed
    the two files, rc 0, the summary stating the old size. Now one line names the file; no output."""
    for change in ("truncate", "touch"):
        big = tmp_path / f"{change}.txt"
        big.write_text(TEXT * 50, encoding="utf-8")
        size = big.stat().st_size

        def reading(path, *args, _change=change, _big=big, _size=size, **kwargs):
            for i, piece in enumerate(iter_documents(path, *args, **kwargs)):
                if i == 1 and Path(path) == _big:  # after the first document: the file changes
                    if _change == "truncate":
                        os.truncate(_big, _size // 2)
                    else:
                        os.utime(_big, ns=(1, 1))
                yield piece

        monkeypatch.setattr(counting, "iter_documents", reading)
        out = tmp_path / f"out-{change}"
        said = f"bytes -> {size // 2} bytes" if change == "truncate" else "modified or replaced, same size"
        with pytest.raises(CorpusError, match=f"corpus file .*{change}.txt changed while it was read .*{said}"):
            run_corpus([text_file, big], out, "tiny", tokenizer, progress=False, spec=DocumentSpec(batch_chars=100))
        assert not out.exists()
    with pytest.raises(CorpusError, match="changed while it was read"):  # iter_documents checks on its own too
        gen = iter_documents(text_file)
        next(gen)
        text_file.write_text(TEXT + "more\n", encoding="utf-8")
        list(gen)
