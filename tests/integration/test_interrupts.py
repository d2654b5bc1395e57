"""Interrupted and concurrent runs of ``engram-viz report`` and ``engram-viz corpus``: SIGINT and
SIGKILL at several stages (the job waits at ``$ENGRAM_VIZ_PAUSE_AT``), a second writer into the
same ``--out`` meanwhile, then a rerun. The folder is always the previous complete run or the new
complete run (what its manifest/summary lists is exactly what it holds), never a mix; Ctrl-C ends
the CLI with exit code 130 and one line; no hidden temporary folder outlives the rerun."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from engram_viz.cli import main
from engram_viz.run.trace import Trace
from engram_viz.settings import PAUSE_AT

PROMPTS_B = [  # two categories: two heatmap figures (gates_b1, gates_b2)
    {"id": "b1", "category": "one", "text": "The Great Wall of China."},
    {"id": "b2", "category": "two", "text": "四大发明 造纸术"},
]
PROMPTS_A = [{"id": "a1", "category": "one", "text": "Alexander the Great tamed Bucephalus."}]


def _no_sigint_ignore() -> None:  # a test run in the background inherits SIGINT ignored
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def start(args: list[str], stage: str | None) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop(PAUSE_AT, None)
    if stage:
        env[PAUSE_AT] = stage
    cmd = [sys.executable, "-m", "engram_viz.cli", *args]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "env": env}
    return subprocess.Popen(cmd, **pipes, preexec_fn=_no_sigint_ignore)  # noqa: PLW1509 - one signal reset


def wait_paused(proc: subprocess.Popen, stage: str) -> None:
    """Read stderr until the job says it waits at ``stage``."""
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if f"paused at {stage} (pid {proc.pid})" in line:
            return
    proc.wait(timeout=60)
    pytest.fail(f"the job never paused at {stage} (exit {proc.returncode}): {''.join(seen)[-2000:]}")


def interrupt(proc: subprocess.Popen, sig: int) -> str:
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    if sig == signal.SIGKILL:
        assert proc.returncode == -signal.SIGKILL
    else:
        assert proc.returncode == 130, err
        assert "Traceback" not in err and err.splitlines() == [err.splitlines()[0]], err
    return err


def hidden(parent: Path, name: str) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith(f".{name}."))


def files_of(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}


def report_run(out: Path) -> list[str]:
    """The prompt ids of the one complete run ``out`` holds (asserting it is whole and unmixed)."""
    manifest = json.loads((out / "manifest.json").read_text())
    listed = {f for paths in (*manifest["tables"].values(), *manifest["figures"].values()) for f in paths}
    trace_files = {f for f in files_of(out) if f.startswith("trace/")}
    run_files = {"manifest.json", "report.html", manifest["provenance"]["prompts_file"]}  # the prompts that ran
    assert trace_files and files_of(out) == listed | trace_files | run_files
    ids = Trace.load(out / "trace").prompt_ids
    assert manifest["provenance"]["n_prompts"] == len(ids)
    assert sorted(pd.read_csv(out / "tables" / "gates.csv").prompt.unique()) == sorted(ids)
    assert {f"figures/gates_{p}.png" for p in ids} <= files_of(out)
    return ids


def test_report_interrupted_and_concurrent(tmp_path, capsys):
    for name, prompts in (("a.jsonl", PROMPTS_A), ("b.jsonl", PROMPTS_B)):
        (tmp_path / name).write_text("\n".join(json.dumps(p, ensure_ascii=False) for p in prompts), encoding="utf-8")
    out = tmp_path / "out"

    def args(prompts: str) -> list[str]:
        return ["report", "--prompts", str(tmp_path / prompts), "--out", str(out), "--device", "cpu", "--quiet"]

    assert main(args("b.jsonl")) == 0
    assert report_run(out) == ["b1", "b2"]

    # Ctrl-C after the tables; meanwhile a second writer into the same folder fails at once
    proc = start(args("a.jsonl"), "report:tables")
    wait_paused(proc, "report:tables")
    assert main(args("a.jsonl")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("engram-viz report: error: another engram-viz run") and f"pid {proc.pid}" in line
    assert str(out) in line
    assert interrupt(proc, signal.SIGINT).strip() == "engram-viz report: interrupted"
    assert report_run(out) == ["b1", "b2"] and hidden(tmp_path, "out") == []

    proc = start(args("a.jsonl"), "report:figures")  # killed while drawing (the swap: see the corpus test)
    wait_paused(proc, "report:figures")
    interrupt(proc, signal.SIGKILL)
    assert report_run(out) == ["b1", "b2"]
    assert hidden(tmp_path, "out")  # what the killed run left

    assert main(args("a.jsonl")) == 0
    assert report_run(out) == ["a1"]  # no figure of b1/b2 is left over
    assert hidden(tmp_path, "out") == [] and not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def corpus_run(out: Path) -> str:
    """The file the one complete corpus run in ``out`` counted (asserting it is whole and unmixed)."""
    summary = json.loads((out / "summary.json").read_text())
    tables = summary["tables"]
    assert files_of(out) == {f"{t}.{ext}" for t in tables for ext in ("parquet", "csv")} | {"summary.json"}
    (only,) = summary["files"]
    listed = pd.read_csv(out / "corpus_files.csv")
    assert list(listed.path) == [only["path"]] and int(listed.tokens.sum()) == summary["tokens"]
    return Path(only["path"]).name


def test_corpus_interrupted_and_concurrent(tmp_path, capsys):
    first_stage = "corpus:counted"
    (tmp_path / "x.txt").write_text("In the beginning God created the heaven and the earth.\n", encoding="utf-8")
    (tmp_path / "y.txt").write_text("Alexander the Great tamed Bucephalus.\n\n中国古代的四大发明。\n", encoding="utf-8")
    out = tmp_path / "out"

    def args(text: str) -> list[str]:
        return ["corpus", str(tmp_path / text), "--out", str(out), "--quiet", "--top", "2"]

    assert main(args("x.txt")) == 0
    assert corpus_run(out) == "x.txt"

    proc = start(args("y.txt"), first_stage)
    wait_paused(proc, first_stage)
    assert main(args("y.txt")) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("engram-viz corpus: error: another engram-viz run") and f"pid {proc.pid}" in line
    assert interrupt(proc, signal.SIGINT).strip() == "engram-viz corpus: interrupted"
    assert corpus_run(out) == "x.txt" and hidden(tmp_path, "out") == []

    for stage in ("corpus:tables", "swap"):
        proc = start(args("y.txt"), stage)
        wait_paused(proc, stage)
        interrupt(proc, signal.SIGKILL)
        if stage != "swap":
            assert corpus_run(out) == "x.txt"
        assert hidden(tmp_path, "out")

    assert main(args("y.txt")) == 0
    assert corpus_run(out) == "y.txt"
    assert hidden(tmp_path, "out") == []


def test_a_failed_first_run_leaves_no_folder(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("{not json\n")
    out = tmp_path / "new" / "out"
    assert main(["report", "--prompts", str(bad), "--out", str(out), "--quiet"]) == 2
    assert "not valid JSON" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [bad]
    assert main(["corpus", str(tmp_path / "nope.txt"), "--out", str(out), "--quiet"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == [bad]
