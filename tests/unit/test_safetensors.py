"""engram_viz.weights.safetensors: header validation (every corrupt case named) and unknown dtypes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from engram_viz.errors import CheckpointError
from engram_viz.weights.safetensors import read_safetensors_header, read_tensor


def _write_raw(path: Path, header: bytes | dict, data: bytes = b"", length: int | None = None) -> Path:
    body = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(body) if length is None else length) + body + data)
    return path


@pytest.mark.parametrize(
    "case,pattern",
    [
        ("short", "fewer than the 8-byte length prefix"),
        ("length_past_eof", "runs past the end of the file"),
        ("huge_length", "exceeds the"),
        ("not_json", "not valid UTF-8 JSON"),
        ("not_object", "expected a JSON object"),
        ("bad_shape", "shape must be a list of non-negative ints"),
        ("bad_offsets", "data_offsets must be"),
        ("size_mismatch", "needs 8 bytes but data_offsets span 6"),
        ("truncated", "truncated file"),
        ("missing", "does not exist"),
    ],
)
def test_corrupt_headers_raise(tmp_path, case, pattern):
    p = tmp_path / "bad.safetensors"
    good = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
    if case == "short":
        p.write_bytes(b"\x01\x02")
    elif case == "length_past_eof":
        _write_raw(p, good, b"\0" * 8, length=10**6)
    elif case == "huge_length":
        _write_raw(p, good, b"\0" * 8, length=2**40)
    elif case == "not_json":
        _write_raw(p, b"{not json", b"")
    elif case == "not_object":
        _write_raw(p, b"[1, 2]", b"")
    elif case == "bad_shape":
        _write_raw(p, {"x": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, b"\0" * 8)
    elif case == "bad_offsets":
        _write_raw(p, {"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}}, b"\0" * 8)
    elif case == "size_mismatch":
        _write_raw(p, {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 6]}}, b"\0" * 8)
    elif case == "truncated":
        _write_raw(p, good, b"\0" * 5)
    with pytest.raises(CheckpointError, match=pattern) as info:
        read_safetensors_header(p)
    assert str(p) in str(info.value)


def test_unknown_dtype_is_listed_but_not_readable(tmp_path):
    p = _write_raw(
        tmp_path / "f4.safetensors", {"experts": {"dtype": "F4", "shape": [4], "data_offsets": [0, 2]}}, b"\0\0"
    )
    header = read_safetensors_header(p)
    assert header.tensors["experts"].dtype == "F4"
    with pytest.raises(CheckpointError, match="F4, which engram-viz cannot read"):
        read_tensor(header.tensors["experts"])


@pytest.mark.parametrize(
    "offsets,pattern",
    [
        (
            {"a": [0, 16], "b": [8, 24]},
            r"tensor 'b' \(data_offsets \[8, 24\]\) overlaps tensor 'a' \(data_offsets \[0, 16\]\)",
        ),
        ({"a": [0, 32], "b": [8, 24]}, r"tensor 'b' \(data_offsets \[8, 24\]\) overlaps tensor 'a'"),  # inside
        ({"a": [0, 16], "b": [0, 16]}, r"overlaps tensor"),  # the same bytes twice
        ({"a": [16, 32], "b": [0, 16], "c": [8, 24]}, r"tensor 'c' .* overlaps tensor 'b'"),
    ],
)
def test_overlapping_tensors_are_refused(tmp_path, offsets, pattern):
    """One tensor's bytes inside another's (a tampered header: writing one would change the other)."""
    header = {n: {"dtype": "F32", "shape": [(e - b) // 4], "data_offsets": [b, e]} for n, (b, e) in offsets.items()}
    p = _write_raw(tmp_path / "overlap.safetensors", header, b"\0" * 32)
    with pytest.raises(CheckpointError, match=pattern) as info:
        read_safetensors_header(p)
    assert str(p) in str(info.value)


def test_adjacent_and_empty_tensors_are_fine(tmp_path):
    header = {
        "a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
        "empty": {"dtype": "F32", "shape": [0], "data_offsets": [8, 8]},  # no bytes: overlaps nothing
        "b": {"dtype": "F32", "shape": [4], "data_offsets": [16, 32]},
    }
    p = _write_raw(tmp_path / "ok.safetensors", header, b"\0" * 32)
    header = read_safetensors_header(p)
    assert set(header.tensors) == {"a", "empty", "b"}
    assert read_tensor(header.tensors["empty"]).shape == (0,)  # an empty F32 tensor reads (found by the fuzz test)


@pytest.mark.parametrize(
    "header,pattern",
    [
        (b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 1' + b"0" * 5000 + b"]}}", "not valid UTF-8 JSON"),
        (b"[" * 100_000 + b"]" * 100_000, "not valid UTF-8 JSON"),
        (b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}, "\xff": 1}', "not valid UTF-8 JSON"),
        (b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [8, 16]}}', "truncated file"),  # outside the data
        (b'{"x": {"dtype": "F32", "shape": [2.0], "data_offsets": [0, 8]}}', "shape must be"),
        (b'{"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, NaN]}}', "data_offsets must be"),
    ],
)
def test_more_corrupt_headers_name_the_file(tmp_path, header, pattern):
    """A 5,000-digit number, nesting deeper than Python's recursion limit, a non-UTF-8 name, offsets
    past the data region, float shapes and NaN offsets: all a ``CheckpointError`` naming the file."""
    p = _write_raw(tmp_path / "bad.safetensors", header, b"\0" * 8)
    with pytest.raises(CheckpointError, match=pattern) as info:
        read_safetensors_header(p)
    assert str(p) in str(info.value)
