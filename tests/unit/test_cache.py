"""Cached derived files: the sha256 sidecar, and what makes an entry untrusted."""

from __future__ import annotations

import gzip
import hashlib

import pytest
import torch

from engram_viz._cache import (
    cached,
    cached_folder,
    cached_path,
    checksum_path,
    file_sha256,
    is_verified,
    write_checksum,
)
from engram_viz.analysis.corpus import default_corpus
from engram_viz.analysis.corpus.documents import CorpusError
from engram_viz.config import load_config
from engram_viz.weights import synthetic


def test_cached_path_writes_the_file_then_its_checksum(tmp_path):
    path = tmp_path / "sub" / "entry.bin"
    with cached_path(path) as tmp:
        assert not checksum_path(path).exists()
        tmp.write_bytes(b"derived bytes")
    assert path.read_bytes() == b"derived bytes"
    digest = hashlib.sha256(b"derived bytes").hexdigest()
    assert checksum_path(path).read_text() == f"{digest}  entry.bin\n"  # sha256sum format
    assert file_sha256(path) == digest and is_verified(path)
    assert sorted(p.name for p in path.parent.iterdir()) == ["entry.bin", "entry.bin.sha256"]


@pytest.mark.parametrize(
    "damage",
    ["edit", "truncate", "no-sidecar", "sidecar-garbage", "sidecar-other-name", "sidecar-binary", "no-file", "folder"],
)
def test_an_entry_that_differs_from_its_checksum_is_untrusted(tmp_path, damage):
    path = tmp_path / "entry.bin"
    with cached_path(path) as tmp:
        tmp.write_bytes(b"0123456789")
    side = checksum_path(path)
    if damage == "edit":
        path.write_bytes(b"0123456780")
    elif damage == "truncate":
        path.write_bytes(b"01234")
    elif damage == "no-sidecar":
        side.unlink()
    elif damage == "sidecar-garbage":
        side.write_text("nonsense")
    elif damage == "sidecar-other-name":
        side.write_text(side.read_text().replace("entry.bin", "other.bin"))
    elif damage == "sidecar-binary":
        side.write_bytes(b"\xff\xfe\x00")
    elif damage == "no-file":
        path.unlink()
    else:
        path.unlink()
        path.mkdir()
    assert not is_verified(path)


def test_a_failed_rebuild_leaves_no_trusted_entry(tmp_path):
    path = tmp_path / "entry.bin"
    with cached_path(path) as tmp:
        tmp.write_bytes(b"old")
    with pytest.raises(KeyboardInterrupt), cached_path(path) as tmp:
        tmp.write_bytes(b"new, half")
        raise KeyboardInterrupt
    assert path.read_bytes() == b"old" and not is_verified(path)  # rebuilt at the next use
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.bin"]
    write_checksum(path)
    assert is_verified(path)


# ---------------------------------------------------------------- the cached files that use it


def test_a_tampered_default_corpus_file_is_rebuilt(tmp_path, monkeypatch):
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(default_corpus.shutil, "which", lambda name: None)  # a KJV rebuild would fail
    source = tmp_path / "zh.txt.gz"
    with gzip.open(source, "wt", encoding="utf-8") as fh:
        fh.write("第一段\n第二行\n\n second para\n")
    monkeypatch.setattr(default_corpus, "ZH_REFERENCE", source)
    kjv, zh = tmp_path / "corpus" / "kjv-chapters-v1.txt", tmp_path / "corpus" / "debian-reference-zh-cn-v1.txt"
    for path in (kjv, zh):
        with cached_path(path) as tmp:
            tmp.write_text("cached text\n", encoding="utf-8")
    assert default_corpus.default_corpus_files() == [kjv, zh]  # trusted: nothing rebuilt
    assert zh.read_text(encoding="utf-8") == "cached text\n"
    zh.write_text("cached text, edited\n", encoding="utf-8")
    default_corpus.default_corpus_files()
    assert zh.read_text(encoding="utf-8") == "第一段第二行\n\nsecond para\n" and is_verified(zh)
    kjv.write_text("edited\n", encoding="utf-8")
    with pytest.raises(CorpusError, match="King James Bible"):  # rebuilt, not used
        default_corpus.default_corpus_files()


def test_a_tampered_cached_synthetic_wkv_is_rebuilt(tmp_path):
    cfg = load_config("tiny")
    want_w, want_s = synthetic._synthetic_wkv(cfg, 0, 1)
    w, s = synthetic._cached_wkv(cfg, 0, 1, tmp_path)
    (path,) = tmp_path.glob("*-wkv-L1.safetensors")
    assert is_verified(path) and torch.equal(w.view(torch.uint8), want_w.view(torch.uint8))
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01  # one weight byte: the header still parses, shapes and dtypes still match
    path.write_bytes(bytes(data))
    w, s = synthetic._cached_wkv(cfg, 0, 1, tmp_path)
    assert torch.equal(w.view(torch.uint8), want_w.view(torch.uint8))
    assert torch.equal(s.view(torch.uint8), want_s.view(torch.uint8)) and is_verified(path)


def test_cached_reads_a_verified_entry_and_rebuilds_one_it_rejects(tmp_path):
    path, builds = tmp_path / "value.txt", []

    def build() -> str:
        builds.append(1)
        return "fresh"

    def get(read) -> str:
        return cached(path, read, build, lambda value, tmp: tmp.write_text(value))

    assert get(lambda p: p.read_text()) == "fresh" and is_verified(path) and len(builds) == 1
    assert get(lambda p: p.read_text()) == "fresh" and len(builds) == 1  # reused
    assert get(lambda p: None) == "fresh" and len(builds) == 2  # read rejected it: rebuilt
    path.write_text("edited")
    assert get(lambda p: p.read_text()) == "fresh" and len(builds) == 3  # sidecar disagrees: rebuilt


class Damaged(Exception):
    pass


def test_cached_folder_opens_builds_and_replaces_a_damaged_folder(tmp_path):
    folder, builds = tmp_path / "entry", []

    def open_folder(path):
        if not (path / "ok").is_file():
            raise Damaged(path)
        return (path / "ok").read_text()

    def build(into):
        builds.append(into)
        (into / "ok").write_text("built")

    def get():
        return cached_folder(folder, open_folder, build, damaged=(Damaged,))

    assert get() == "built" and len(builds) == 1 and builds[0] != folder  # built beside, swapped in
    assert get() == "built" and len(builds) == 1
    (folder / "ok").unlink()
    (folder / "junk").write_text("x")
    assert get() == "built" and len(builds) == 2 and not (folder / "junk").exists()  # replaced whole
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry"]  # no build folder or lock left
