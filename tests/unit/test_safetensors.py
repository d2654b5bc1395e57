"""engram_viz.weights.safetensors: header validation (every corrupt case named) and unknown dtypes."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from engram_viz.weights.errors import CheckpointError
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
