"""The CLI turns every user error into one line on stderr and exit code 2, never a traceback:
a bad --checkpoint path, a corrupt checkpoint header, an output folder that cannot be written,
a cache that cannot be used, a garbage tokenizer.json, a missing CJK font. Outputs take the
umask's permissions."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import engram_viz.apps.report_job as report_module
import engram_viz.viz.style as style_module
from engram_viz.apps.report_job import ReportError
from engram_viz.cli import main
from engram_viz.core.tokenizer import EngramTokenizer
from engram_viz.errors import EngramVizError
from engram_viz.settings import CACHE
from engram_viz.viz.export import ExportError
from engram_viz.viz.style import CJKFontMissingError

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "engram_viz.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False, cwd=cwd)


def assert_one_line_error(proc: subprocess.CompletedProcess, command: str, *needles: str) -> str:
    """Exit code != 0, no traceback, stderr exactly one line ``engram-viz COMMAND: error: ...``."""
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"engram-viz {command}: error: "), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_user_facing_errors_share_one_base():
    for cls in (ReportError, ExportError, CJKFontMissingError):
        assert issubclass(cls, EngramVizError), cls


def test_report_with_a_checkpoint_that_does_not_exist(tmp_path):
    missing = tmp_path / "nonexistent"
    proc = run_cli("report", "--checkpoint", str(missing), "--out", str(tmp_path / "out"), "--quiet")
    assert_one_line_error(proc, "report", str(missing))
    assert not (tmp_path / "out" / "report.html").exists()


def test_inspect_a_checkpoint_with_a_corrupt_header(tmp_path):
    folder = tmp_path / "corrupt"
    folder.mkdir()
    shutil.copy(REPO / "data" / "configs" / "tiny.json", folder / "config.json")
    # a plausible header length followed by bytes that are not JSON
    (folder / "model.safetensors").write_bytes((64).to_bytes(8, "little") + b"\xff\xfe garbage, not a header" * 8)
    proc = run_cli("inspect", str(folder))
    assert_one_line_error(proc, "inspect", "model.safetensors")


def test_report_into_a_path_below_a_regular_file(tmp_path):
    """The output folder cannot be created: a file sits where a folder should be."""
    blocker = tmp_path / "somefile"
    blocker.write_text("not a folder\n")
    proc = run_cli("report", "--out", str(blocker / "sub"), "--quiet")
    assert_one_line_error(proc, "report", "output folder", str(blocker / "sub"))
    assert blocker.read_text() == "not a folder\n"


def test_report_into_a_read_only_folder(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        if os.access(locked, os.W_OK):  # root writes anyway; the test above covers the path
            pytest.skip("this user can write into a 0o500 folder (root)")
        proc = run_cli("report", "--out", str(locked / "report"), "--quiet")
        assert_one_line_error(proc, "report", "output folder")
        assert list(locked.iterdir()) == []
    finally:
        locked.chmod(0o700)


def test_report_without_a_cjk_font(tmp_path, monkeypatch, capsys):
    """A figure export that requires a CJK font, on a machine without one: one line, exit 2."""
    monkeypatch.setattr(style_module, "cjk_font", lambda: None)
    export_all = report_module.export_all

    def export_needing_cjk(fig, stem, formats=None):
        style_module.require_cjk_font()
        return export_all(fig, stem, formats)

    monkeypatch.setattr(report_module, "export_all", export_needing_cjk)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"id": "zh", "category": "mine", "text": "四大发明 造纸术"}\n', encoding="utf-8")
    out = tmp_path / "r"
    code = main(["report", "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert "Traceback" not in err
    (line,) = err.splitlines()
    assert line.startswith("engram-viz report: error: no CJK-capable font found") and "fonts-noto-cjk" in line
    assert not (out / "report.html").exists()
    assert not [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def test_help_imports_no_optional_dependency():
    code = (
        "import sys, engram_viz.cli\n"
        "print(sorted(m for m in ('ipywidgets', 'voila', 'plotly', 'kaleido', 'IPython', 'playwright') "
        "if m in sys.modules))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    assert proc.stdout.strip() == "[]", proc.stdout


def _blocked_out(tmp_path: Path, case: str) -> tuple[list[str], str, str]:
    """(argv, what the error line must name, what it must say) for one blocked output folder."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    text = tmp_path / "x.txt"
    text.write_text("In the beginning.\n")
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    corpus = ["corpus", str(text), "--quiet", "--out"]
    return {
        "report_out_is_a_file": (["report", "--quiet", "--out", str(afile)], str(afile), "it is a file"),
        "corpus_out_under_a_file": (corpus + [str(afile / "sub")], str(afile / "sub"), "is a file, not a folder"),
        "report_out_of_something_else": (["report", "--quiet", "--out", str(mine)], str(mine), "no manifest.json"),
        "corpus_out_of_something_else": (corpus + [str(mine)], str(mine), "no summary.json"),
    }[case]


@pytest.mark.parametrize(
    "case",
    ["report_out_is_a_file", "corpus_out_under_a_file", "report_out_of_something_else", "corpus_out_of_something_else"],
)
def test_an_output_folder_that_cannot_be_used(tmp_path, capsys, case):
    argv, names, says = _blocked_out(tmp_path, case)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"engram-viz {argv[0]}: error: ") and names in line and says in line, line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_a_garbage_tokenizer_json(tmp_path, capsys):
    garbage = tmp_path / "tokenizer.json"
    garbage.write_text("{garbage")
    for argv in (
        ["hash", "hi", "--tokenizer", str(garbage)],
        ["corpus", "--tokenizer", str(garbage), "--out", str(tmp_path / "x")],
    ):
        assert main(argv) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert str(garbage) in line and "cannot be read as a tokenizer.json" in line
    assert not (tmp_path / "x").exists()


def test_a_cache_that_is_a_file_or_holds_a_folder_for_a_file(tmp_path, monkeypatch):
    """$ENGRAM_VIZ_CACHE pointing at a file; a cached token map whose path is a folder. The map
    itself is written with the umask's permissions."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    env = {**os.environ, CACHE: str(afile)}
    proc = subprocess.run(
        [sys.executable, "-m", "engram_viz.cli", "hash", "hi"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert_one_line_error(proc, "hash", f"${CACHE}={afile}", "it is a file")

    cache = tmp_path / "cache"
    monkeypatch.setenv(CACHE, str(cache))
    old = os.umask(0o022)
    try:
        EngramTokenizer("v41-flash")  # builds and caches the token map
    finally:
        os.umask(old)
    written = [p for p in cache.iterdir() if p.is_file()]
    assert written and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in written)
    (token_map,) = cache.glob("token_map-*.npy")
    for p in written:
        p.unlink()
    token_map.mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "engram_viz.cli", "hash", "hi", "--config", "v41-flash"],
        env={**os.environ, CACHE: str(cache)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert_one_line_error(proc, "hash", str(token_map), "a folder is in the way")


def test_corpus_outputs_take_the_umask_modes(tmp_path, capsys):
    text = tmp_path / "x.txt"
    text.write_text("In the beginning.\n")
    out = tmp_path / "out"
    old = os.umask(0o022)
    try:
        assert main(["corpus", str(text), "--out", str(out), "--quiet", "--save-counts"]) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in out.iterdir()}
    assert "ngram_counts.npz" in modes and set(modes.values()) == {0o644}, modes
