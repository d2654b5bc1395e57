"""A run folder is all or nothing (``_files.atomic_folder``): built beside the target and swapped
in whole, under a lock; failures and killed runs leave the previous folder; every write takes the
umask's permissions; a file or folder in the way is one error naming it."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pandas as pd
import pytest

from engram_viz import settings
from engram_viz._files import (
    STALE_TEMP_S,
    WriteError,
    atomic_folder,
    atomic_path,
    atomic_write_text,
    file_mode,
    folder_mode,
    write_table,
)
from engram_viz.errors import EngramVizError


def write_run(out: Path, files: dict[str, str], marker: str = "manifest.json") -> None:
    with atomic_folder(out, marker=marker) as build:
        for name, text in files.items():
            atomic_write_text(build / name, text)
        atomic_write_text(build / marker, ",".join(sorted(files)))


def contents(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if p.name.startswith("."))


def test_a_complete_rerun_leaves_no_stale_file(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"figures/a.png": "a", "figures/b.png": "b"})
    write_run(out, {"figures/a.png": "a2"})
    assert contents(out) == {"figures/a.png": "a2", "manifest.json": "figures/a.png"}
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("exc", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failed_run_leaves_the_previous_folder_untouched(tmp_path, exc):
    out = tmp_path / "out"
    write_run(out, {"t.csv": "old"})
    before = contents(out)
    with pytest.raises(type(exc)), atomic_folder(out, marker="manifest.json") as build:
        atomic_write_text(build / "t.csv", "half of the new run")
        raise exc
    assert contents(out) == before
    assert leftovers(tmp_path) == []


def test_a_failed_first_run_leaves_no_folder_and_no_parents(tmp_path):
    out = tmp_path / "new" / "deeper" / "out"
    with pytest.raises(RuntimeError), atomic_folder(out) as build:
        atomic_write_text(build / "t.csv", "x")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_a_second_writer_fails_at_once_naming_the_folder_and_the_pid(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"t.csv": "old"})
    with atomic_folder(out, marker="manifest.json") as build:
        atomic_write_text(build / "t.csv", "first")
        t0 = time.perf_counter()
        with pytest.raises(WriteError) as info, atomic_folder(out, marker="manifest.json"):
            pytest.fail("the second writer got in")
        assert time.perf_counter() - t0 < 1.0
        assert str(out) in str(info.value) and f"pid {os.getpid()}" in str(info.value)
        atomic_write_text(build / "manifest.json", "t.csv")
    assert contents(out) == {"t.csv": "first", "manifest.json": "t.csv"}
    assert leftovers(tmp_path) == []


def test_leftovers_of_a_killed_run_are_removed_by_the_next(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"t.csv": "old"})
    (tmp_path / ".out.new-abc123.tmp").mkdir()  # a build folder of a killed run
    (tmp_path / ".out.new-abc123.tmp" / "t.csv").write_text("half")
    (tmp_path / ".out.old-0f0f0f.tmp").mkdir()  # killed while deleting the old folder
    (tmp_path / ".out.lock").write_text("99999999\n")  # its lock file (no longer locked)
    (tmp_path / ".other.new-abc123.tmp").mkdir()  # another folder's: not ours to remove
    write_run(out, {"t.csv": "new"})
    assert contents(out)["t.csv"] == "new"
    assert leftovers(tmp_path) == [".other.new-abc123.tmp"]


def test_killed_between_the_two_renames_gets_the_previous_folder_back(tmp_path):
    out = tmp_path / "out"
    write_run(out, {"t.csv": "old"})
    before = contents(out)
    os.rename(out, tmp_path / ".out.old-1234abcd.tmp")  # renamed aside, the new one never renamed in
    (tmp_path / ".out.new-zzzz1234.tmp").mkdir()
    with pytest.raises(RuntimeError), atomic_folder(out, marker="manifest.json"):
        raise RuntimeError("this run fails too")
    assert contents(out) == before
    assert leftovers(tmp_path) == []


def test_a_folder_of_something_else_is_not_replaced(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("precious")
    with pytest.raises(WriteError, match="no manifest.json") as info, atomic_folder(mine, marker="manifest.json"):
        pytest.fail("entered")
    assert str(mine) in str(info.value)
    assert (mine / "thesis.tex").read_text() == "precious"
    empty = tmp_path / "empty"
    empty.mkdir()
    write_run(empty, {"t.csv": "x"})  # an empty folder is fine
    assert (empty / "t.csv").is_file()


@pytest.mark.parametrize("where", ["file", "under_file"])
def test_an_output_folder_blocked_by_a_file_is_one_error_naming_it(tmp_path, where):
    blocker = tmp_path / "afile"
    blocker.write_text("not a folder\n")
    out = blocker if where == "file" else blocker / "sub" / "out"
    with pytest.raises(WriteError) as info, atomic_folder(out):
        pytest.fail("entered")
    assert issubclass(info.type, EngramVizError) and "output folder" in str(info.value)
    assert str(out) in str(info.value)
    assert blocker.read_text() == "not a folder\n" and sorted(tmp_path.iterdir()) == [blocker]


def test_a_symlinked_output_folder_is_replaced_behind_the_link(tmp_path):
    real = tmp_path / "real"
    write_run(real, {"t.csv": "old"})
    link = tmp_path / "link"
    link.symlink_to(real)
    write_run(link, {"t.csv": "new"})
    assert link.is_symlink() and contents(link)["t.csv"] == "new"


def test_run_folders_and_their_files_take_the_umask_modes(tmp_path):
    old = os.umask(0o022)
    try:
        out = tmp_path / "out"
        write_run(out, {"tables/t.csv": "x"})
        assert stat.S_IMODE(out.stat().st_mode) == folder_mode() == 0o755
        assert stat.S_IMODE((out / "tables").stat().st_mode) == 0o755
        assert stat.S_IMODE((out / "tables" / "t.csv").stat().st_mode) == file_mode() == 0o644
        out.chmod(0o750)  # a mode the user chose for the folder is kept by a rerun
        write_run(out, {"tables/t.csv": "y"})
        assert stat.S_IMODE(out.stat().st_mode) == 0o750
    finally:
        os.umask(old)


def test_a_folder_where_a_file_goes_is_one_error_naming_it(tmp_path):
    """E.g. a cache entry (the token map) that is a folder."""
    entry = tmp_path / "token_map.npy"
    entry.mkdir()
    with pytest.raises(WriteError, match="a folder is in the way") as info, atomic_path(entry) as tmp:
        tmp.write_bytes(b"x")
    assert str(entry) in str(info.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["token_map.npy"]
    (tmp_path / "t.csv").mkdir()
    with pytest.raises(WriteError, match="t.csv"):
        write_table(pd.DataFrame({"a": [1]}), tmp_path, "t", formats=("csv",))


def test_a_temporary_file_of_a_killed_write_is_removed_by_a_later_write(tmp_path):
    target = tmp_path / "map.npy"
    stale, fresh = tmp_path / ".map.npy.abcd1234.tmp", tmp_path / ".map.npy.efgh5678.tmp"
    for p in (stale, fresh):
        p.write_bytes(b"half")
    old = time.time() - STALE_TEMP_S - 10
    os.utime(stale, (old, old))
    atomic_write_text(target, "x")
    assert not stale.exists() and fresh.exists()  # a recent one may belong to a live writer


def test_a_cache_setting_pointing_at_a_file_names_the_variable(tmp_path, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    monkeypatch.setenv(settings.CACHE, str(afile))
    with pytest.raises(settings.SettingError) as info:
        settings.cache_dir()
    assert f"${settings.CACHE}={afile}" in str(info.value) and "it is a file" in str(info.value)


def test_tables_on_disk_do_not_depend_on_a_frames_provenance(tmp_path):
    """A frame's ``attrs`` (its provenance in memory) never reach the files: the same rows write the
    same bytes, so a report's tables compare byte for byte across runs and versions."""
    df = pd.DataFrame({"position": [0, 1], "gate": [0.25, 0.5]})
    tagged = df.copy()
    tagged.attrs["provenance"] = {"model": "tiny", "synthetic": False}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    write_table(df, tmp_path / "a", "t")
    write_table(tagged, tmp_path / "b", "t")
    for ext in ("parquet", "csv"):
        assert (tmp_path / "a" / f"t.{ext}").read_bytes() == (tmp_path / "b" / f"t.{ext}").read_bytes()
    assert tagged.attrs["provenance"]["model"] == "tiny"  # the caller's frame keeps its attrs
