"""Property tests: safetensors headers, index files and tiny-LM shards corrupted at random (random
bytes, flipped bytes, truncated files, wrong length prefixes, wrong dtypes / shapes / offsets,
non-UTF-8, huge numbers). Whatever comes, the weights layer either reads the file or raises one of
the suite's own errors (an ``EngramVizError``) naming the file: never a ``KeyError``, a
``json`` error, a ``SafetensorError`` or an ``IndexError``."""

from __future__ import annotations

import json
import os
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_viz.core.schema import SAFETENSORS_DTYPES
from engram_viz.errors import EngramVizError
from engram_viz.tiny.files import load_tiny_model
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.index import INDEX_FILE
from engram_viz.weights.inspect import inspect_checkpoint
from engram_viz.weights.nonfinite import check_finite
from engram_viz.weights.rows import LazyRows
from engram_viz.weights.safetensors import read_safetensors_header, read_tensor
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD

GOOD = {
    "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
    "b": {"dtype": "BF16", "shape": [3], "data_offsets": [16, 22]},
    "c": {"dtype": "F8_E4M3", "shape": [4, 8], "data_offsets": [22, 54]},
}
DATA = bytes(range(54))

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)
json_value = st.recursive(
    json_leaf,
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
    max_leaves=8,
)
dtype_value = st.one_of(st.sampled_from([*SAFETENSORS_DTYPES, "F4", "f32", ""]), json_value)
shape_value = st.one_of(st.lists(st.integers(min_value=-3, max_value=2**40), max_size=3), json_value)
offsets_value = st.one_of(st.lists(st.integers(min_value=-10, max_value=2**66), min_size=0, max_size=3), json_value)


@st.composite
def corrupt_file(draw) -> bytes:
    """A small safetensors file damaged in one or more ways."""
    header = json.loads(json.dumps(GOOD))
    for name in draw(st.lists(st.sampled_from(sorted(GOOD)), max_size=3)):
        field, value = draw(
            st.sampled_from(
                [("dtype", dtype_value), ("shape", shape_value), ("data_offsets", offsets_value), (None, json_value)]
            )
        )
        entry = header[name] if isinstance(header[name], dict) else {}
        header[name] = draw(value) if field is None else {**entry, field: draw(value)}
    if draw(st.booleans()):
        header["__metadata__"] = draw(json_value)
    body = json.dumps(header).encode()
    for _ in range(draw(st.integers(0, 3))):  # flipped bytes: non-UTF-8, broken JSON, changed digits
        i = draw(st.integers(0, len(body) - 1))
        body = body[:i] + bytes([draw(st.integers(0, 255))]) + body[i + 1 :]
    length = draw(st.one_of(st.just(len(body)), st.integers(0, 2**64 - 1), st.integers(0, len(body) + 60)))
    raw = struct.pack("<Q", length) + body + DATA
    cut = draw(st.one_of(st.none(), st.integers(0, len(raw))))
    return raw if cut is None else raw[:cut]


def _assert_named(err: BaseException, path: Path) -> None:
    assert isinstance(err, EngramVizError), f"{type(err).__name__}: {err}"
    assert str(path) in str(err), str(err)


def _read_everything(path: Path) -> None:
    """Parse the header and read every tensor: whole, by rows (2-D), checked finite."""
    header = read_safetensors_header(path)
    for info in header.tensors.values():
        for read in (read_tensor, lambda i: LazyRows(i).gather(torch.arange(i.shape[0]))):
            try:
                check_finite(read(info), f"{path}: tensor {info.name!r}")
            except EngramVizError as err:
                _assert_named(err, path)


@given(st.one_of(corrupt_file(), st.binary(max_size=120)))
def test_corrupt_safetensors_files_raise_only_named_suite_errors(raw):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        path.write_bytes(raw)
        try:
            _read_everything(path)
        except EngramVizError as err:
            _assert_named(err, path)


def _linked_copy(src: Path, dst: Path, skip: tuple[str, ...] = ()) -> None:
    """``dst`` holding hard links to ``src``'s files (nothing is written to them; copies across file
    systems), but ``skip``."""
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file() and p.name not in skip:
            try:
                os.link(p, dst / p.name)
            except OSError:
                shutil.copy(p, dst / p.name)


shard_name = st.one_of(
    st.sampled_from(
        ["model-00001-of-00003.safetensors", "model-00003-of-00003.safetensors", "../x", "/etc/passwd", ""]
    ),
    st.text(max_size=12),
)


@st.composite
def corrupt_index(draw, weight_map: dict) -> bytes:
    """The index file with entries repointed, dropped or retyped, random JSON, or damaged bytes."""
    doc = {"metadata": {"total_size": 1}, "weight_map": dict(weight_map)}
    names = sorted(weight_map)
    for name in draw(st.lists(st.sampled_from(names), max_size=4)):
        doc["weight_map"][name] = draw(st.one_of(shard_name, json_value))
    for name in draw(st.lists(st.sampled_from(names), max_size=2)):
        doc["weight_map"].pop(name, None)
    if draw(st.integers(0, 9)) == 0:
        doc = draw(json_value)
    text = json.dumps(doc).encode()
    if draw(st.booleans()):
        cut = draw(st.integers(0, len(text)))
        text = text[:cut] + draw(st.binary(max_size=4))
    return text


@settings(max_examples=40)
@given(data=st.data())
def test_corrupt_index_files_raise_only_named_suite_errors(synthetic_hf, data):
    clean = synthetic_hf
    weight_map = json.loads((clean / INDEX_FILE).read_text())["weight_map"]
    text = data.draw(corrupt_index(weight_map))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        _linked_copy(clean, folder, skip=(INDEX_FILE,))
        (folder / INDEX_FILE).write_bytes(text)
        for call in (open_checkpoint, inspect_checkpoint):
            try:
                call(folder)
            except EngramVizError as err:
                _assert_named(err, folder)
            except Exception as err:  # noqa: BLE001 - the property: nothing else comes out
                pytest.fail(f"{call.__name__} raised {type(err).__name__}: {err}")


@settings(max_examples=15)
@given(st.data())
def test_corrupt_tiny_lm_shards_raise_only_named_suite_errors(data):
    """The tiny-LM folder's shards with damaged headers (the loader once raised SafetensorError)."""
    shard = data.draw(st.sampled_from([LM_SHARD, ENGRAM_SHARD]))
    raw = (DEFAULT_DIR / shard).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    for _ in range(data.draw(st.integers(1, 3))):
        i = data.draw(st.integers(0, 8 + n - 1))
        raw = raw[:i] + bytes([data.draw(st.integers(0, 255))]) + raw[i + 1 :]
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(raw))))
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "tiny"
        _linked_copy(DEFAULT_DIR, folder, skip=(shard,))
        (folder / shard).write_bytes(raw if cut is None else raw[:cut])
        try:
            load_tiny_model(folder)
        except EngramVizError as err:
            _assert_named(err, folder)
