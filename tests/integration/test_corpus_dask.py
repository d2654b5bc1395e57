"""The corpus job on Dask: a 2-worker local cluster counts exactly what one process counts, also
with a worker killed mid-run and with spilling forced by a tiny memory limit."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from engram_viz.analysis.corpus import dask_counting
from engram_viz.analysis.corpus.counting import count_corpus
from engram_viz.analysis.corpus.dask_counting import count_corpus_dask, dask_client
from engram_viz.analysis.corpus.documents import CorpusError, DocumentSpec
from engram_viz.apps.corpus_job import run_corpus

pytest.importorskip("dask.distributed")

DOCS = [
    "In the beginning God created the heaven and the earth.",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Alexander the Great tamed Bucephalus.",
    "中国古代的四大发明是造纸术、指南针、火药和印刷术。",
    "张仲景是东汉末年的名医。",
]


@pytest.fixture(scope="module")
def corpus_files(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("dask_corpus")
    rng = np.random.default_rng(0)
    files = []
    for i in range(2):
        paras = [" ".join(rng.choice(DOCS, size=3)) for _ in range(120)]
        text = ("\n\n".join(paras) + "\n").encode()
        path = folder / ("part0.txt" if i == 0 else "part1.txt.gz")  # read by the workers / by the client
        path.write_bytes(text if i == 0 else gzip.compress(text))
        files.append(path)
    return files


def test_two_workers_count_exactly_one_process(corpus_files, v41_config, tokenizer):
    spec = DocumentSpec(batch_chars=2000, max_doc_chars=100)
    one = count_corpus(corpus_files, v41_config, tokenizer, spec=spec, progress=False)
    with dask_client(workers=2, processes=False) as client:
        two = count_corpus_dask(client, corpus_files, v41_config, tokenizer, spec=spec, progress=False)
    assert two.counts == one.counts  # every key and count, every order, and the position totals
    assert np.array_equal(two.raw_counts, one.raw_counts)
    assert (two.tokens, two.documents, two.files) == (one.tokens, one.documents, one.files)


def test_local_cluster_steals_no_task():
    """Partitions stay on their workers: a stolen merge would carry its partition's spilled runs
    to the thief in memory (Dask sizes a partition by its in-memory keys only)."""
    with dask_client(workers=2, processes=False) as client:
        assert "stealing" not in client.run_on_scheduler(lambda dask_scheduler: set(dask_scheduler.extensions))


def test_partitions_reach_the_client_in_pieces(corpus_files, v41_config, tokenizer, monkeypatch):
    """Partitions of many more keys than a piece, spilled on the workers: still exactly one process's counts."""
    one = count_corpus(corpus_files, v41_config, tokenizer, progress=False)
    monkeypatch.setattr(dask_counting, "PIECE_KEYS", 3)
    spec = DocumentSpec(batch_chars=2000)
    with dask_client(workers=2, processes=False) as client:
        two = count_corpus_dask(client, corpus_files, v41_config, tokenizer, spec, progress=False, memory_limit=4000)
    assert min(one.counts.n_distinct(n) for n in v41_config.ngram_orders) > 3 * 3 * 4  # > 3 pieces a group
    assert two.counts == one.counts


def test_two_worker_tables_byte_identical(corpus_files, v41_config, tokenizer, tmp_path):
    a = run_corpus(corpus_files, tmp_path / "one", v41_config, tokenizer, progress=False)
    run_corpus(corpus_files, tmp_path / "two", v41_config, tokenizer, progress=False, workers=2, processes=False)
    for name in a.tables:
        for ext in ("csv", "parquet"):
            assert (tmp_path / "one" / f"{name}.{ext}").read_bytes() == (
                tmp_path / "two" / f"{name}.{ext}"
            ).read_bytes()


def test_distributed_refuses_max_tokens(corpus_files, v41_config, tokenizer, tmp_path):
    with pytest.raises(CorpusError, match="max_tokens"):
        run_corpus(corpus_files, tmp_path / "x", v41_config, tokenizer, max_tokens=10, workers=2, progress=False)
    assert not (tmp_path / "x").exists()


def _same_tables(a: Path, b: Path, names) -> None:
    for name in names:
        for ext in ("csv", "parquet"):
            assert (a / f"{name}.{ext}").read_bytes() == (b / f"{name}.{ext}").read_bytes(), name


def test_tiny_memory_limit_spills_and_gives_identical_tables(corpus_files, v41_config, tokenizer, tmp_path):
    free = run_corpus(corpus_files, tmp_path / "free", v41_config, tokenizer, progress=False)
    one = run_corpus(corpus_files, tmp_path / "one", v41_config, tokenizer, progress=False, memory_limit="4kB")
    assert one.summary["spills"] > 0 and one.summary["memory_limit"] == 4000
    _same_tables(tmp_path / "free", tmp_path / "one", free.tables)
    run_corpus(
        corpus_files,
        tmp_path / "two",
        v41_config,
        tokenizer,
        progress=False,
        workers=2,
        processes=False,
        memory_limit=4000,
    )
    _same_tables(tmp_path / "free", tmp_path / "two", free.tables)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["free", "one", "two"]


def test_killed_worker_is_rerun_and_counts_stay_exact(corpus_files, v41_config, tokenizer):
    kw = {"spec": DocumentSpec(batch_chars=400, max_doc_chars=100), "progress": False}
    one = count_corpus(corpus_files, v41_config, tokenizer, **kw)
    import dask

    # forkserver: worker processes start in about half the time of spawn, without fork's hazards
    with dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"}), dask_client(2) as client:
        client.run(
            lambda: __import__("engram_viz.analysis.corpus.dask_counting")
        )  # imports done: the kill lands mid-run
        victim, pid = min(client.run(os.getpid).items())
        killed = threading.Event()

        def kill_when_busy() -> None:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not client.processing().get(victim):
                time.sleep(0.002)
            os.kill(pid, signal.SIGKILL)
            killed.set()

        killer = threading.Thread(target=kill_when_busy, daemon=True)
        killer.start()
        two = count_corpus_dask(client, corpus_files, v41_config, tokenizer, **kw)
        killer.join()
    assert killed.is_set()
    assert two.counts == one.counts
    assert np.array_equal(two.raw_counts, one.raw_counts)
    assert (two.tokens, two.documents, two.files) == (one.tokens, one.documents, one.files)


def test_gzipped_files_travel_as_spans_of_a_decompressed_copy(
    corpus_files, v41_config, tokenizer, tmp_path, monkeypatch
):
    """No task carries text: a gzipped file's batches name bytes of its copy, decompressed by the
    client under ``spool_dir`` (so nothing the scheduler keeps grows with the corpus); the copy is
    removed when the count ends, and ``run_corpus`` leaves nothing beside its output."""
    one = count_corpus(corpus_files, v41_config, tokenizer, progress=False)
    tasks = []
    cut = dask_counting.file_spans

    def spy(*args):  # each span as the client submits it: its bytes already on disk?
        for fi, span in cut(*args):
            tasks.append((span, span.path.stat().st_size >= span.stop))
            yield fi, span

    monkeypatch.setattr(dask_counting, "file_spans", spy)
    spool = tmp_path / "spool"
    spool.mkdir()
    with dask_client(workers=2, processes=False) as client:
        two = count_corpus_dask(
            client, corpus_files, v41_config, tokenizer, DocumentSpec(batch_chars=2000), progress=False, spool_dir=spool
        )
    assert two.counts == one.counts and two.files == one.files
    gz = corpus_files[1]
    copies = {span.path for span, _ in tasks if span.source == gz}
    assert len(copies) == 1 and next(iter(copies)).parent.parent == spool  # one copy, in a folder under spool_dir
    assert all(exists for _, exists in tasks) and len(tasks) > 4
    assert {span.path for span, _ in tasks if span.source is None} == {corpus_files[0].absolute()}
    assert list(spool.iterdir()) == []  # the copy's folder removed at the end
    run_corpus(corpus_files, tmp_path / "out", v41_config, tokenizer, progress=False, workers=2, processes=False)
    assert not [p for p in tmp_path.iterdir() if ".new-" in p.name]


def test_a_file_changed_while_the_workers_read_it_is_refused(tmp_path, v41_config, tokenizer, monkeypatch):
    """Truncated between cutting and reading (a worker reads the span) or touched before the count
    ends: once counted as a mix of two files, rc 0. Now refused naming the file. And a lone
    surrogate escape is counted as U+FFFD, exactly as in one process."""
    big = tmp_path / "big.txt"
    big.write_text("\n\n".join(DOCS * 40) + "\n", encoding="utf-8")
    size = big.stat().st_size
    lone, replaced = tmp_path / "lone.jsonl", tmp_path / "replaced.jsonl"
    lone.write_text('{"text": "a \\ud800 b"}\n{"text": "c \\udc00"}\n')
    replaced.write_text('{"text": "a \\ufffd b"}\n{"text": "c \\ufffd"}\n')
    spec = DocumentSpec(batch_chars=500)
    read, gather = dask_counting.iter_span_documents, dask_counting._gather

    def truncating(span, *args):  # on a worker thread, before its first span is read
        if span.path == big.absolute() and big.stat().st_size == size:
            os.truncate(big, size // 2)
        return read(span, *args)

    def touching(*args, **kwargs):  # on the client, after every span was read
        os.utime(big, ns=(1, 1))
        return gather(*args, **kwargs)

    with dask_client(workers=2, processes=False) as client:
        two = count_corpus_dask(client, [lone], v41_config, tokenizer, spec, progress=False)
        one = count_corpus([replaced], v41_config, tokenizer, spec=DocumentSpec(batch_chars=500), progress=False)
        assert two.counts == one.counts and two.tokens == one.tokens > 0
        monkeypatch.setattr(dask_counting, "iter_span_documents", truncating)
        with pytest.raises(CorpusError, match=f"corpus file {big}.* changed while it was read .*{size // 2} bytes"):
            count_corpus_dask(client, [big], v41_config, tokenizer, spec, progress=False)
        monkeypatch.setattr(dask_counting, "iter_span_documents", read)
        monkeypatch.setattr(dask_counting, "_gather", touching)
        big.write_text("\n\n".join(DOCS * 40) + "\n", encoding="utf-8")
        with pytest.raises(CorpusError, match=f"corpus file {big} changed while it was read .*same size"):
            count_corpus_dask(client, [big], v41_config, tokenizer, spec, progress=False)


def test_a_bad_line_on_worker_processes_is_one_line_on_stderr(tmp_path):
    """Once six worker tracebacks (61 lines) came before the one correct line."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"text": "fine"}\nnot json\n')
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "engram_viz.cli",
            "corpus",
            str(bad),
            "--out",
            str(out),
            "--workers",
            "2",
            "--quiet",
        ],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"engram-viz corpus: error: {bad}:3: not valid JSON: Expecting value: line 1 column 1 (char 0)"
    ]
    assert not out.exists()
