"""The safetensors file format, read by hand: header parsing, whole-tensor reads, sparse files.

A file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
``data_offsets`` relative to the data start) and the data. The header is validated against the
file size before any tensor is read, so a corrupt or truncated file is named at open time.
Reading headers imports no torch (the corpus path and ``weights_config`` read headers only);
torch is imported when a tensor or its dtype is first asked for.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from engram_viz._files import atomic_path
from engram_viz.core.schema import SAFETENSORS_DTYPES
from engram_viz.errors import CheckpointError, InputError

if TYPE_CHECKING:
    import torch

MAX_HEADER_BYTES = 100 * 2**20  # the safetensors library refuses larger headers too

if sys.byteorder != "little":  # safetensors is little-endian; every byte view of the weights layer assumes so
    raise ImportError("engram_viz.weights needs a little-endian machine")


@dataclass(frozen=True)
class TensorInfo:
    """Where one tensor's bytes lie in a safetensors file (offsets are absolute file offsets)."""

    path: Path
    name: str
    dtype: str  # safetensors dtype string, e.g. "F8_E4M3"
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype not in SAFETENSORS_DTYPES:
            raise CheckpointError(
                f"{self.path}: tensor {self.name!r} has dtype {self.dtype}, which engram-viz cannot read"
            )
        return torch_dtype_of(self.dtype)

    @property
    def itemsize(self) -> int:
        return SAFETENSORS_DTYPES[self.dtype][1]


@dataclass(frozen=True)
class SafetensorsHeader:
    """A parsed and validated safetensors header."""

    path: Path
    file_size: int
    data_start: int  # 8 + header length
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str] = field(default_factory=dict)


def _read_header_bytes(path: Path) -> tuple[int, bytes]:
    """The file size and the raw JSON header, after checking the length prefix fits the file."""
    try:
        file_size = path.stat().st_size
        with open(path, "rb") as fh:
            prefix = fh.read(8)
            if len(prefix) < 8:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header: the file has {file_size} bytes, fewer than the 8-byte length prefix"
                )
            (n,) = struct.unpack("<Q", prefix)
            if n > MAX_HEADER_BYTES:
                raise CheckpointError(
                    f"{path}: corrupt safetensors header: header length {n} exceeds the {MAX_HEADER_BYTES}-byte limit"
                )
            if 8 + n > file_size:
                raise CheckpointError(
                    f"{path}: corrupt or truncated safetensors header: header length {n} runs past the end of the file ({file_size} bytes)"
                )
            return file_size, fh.read(n)
    except FileNotFoundError:
        raise CheckpointError(f"safetensors file {path} does not exist") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a directory, expected a safetensors file") from None
    except OSError as err:  # permission, I/O error, a name the OS refuses
        raise CheckpointError(f"safetensors file {path} cannot be read: {err.strerror or err}") from None


def _tensor_entry(path: Path, name: str, entry, data_start: int, data_size: int, file_size: int) -> TensorInfo:
    """One validated header entry: dtype string, non-negative int shape, ``data_offsets`` whose span
    equals ``numel * itemsize`` (for known dtypes) and lies inside the file."""
    where = f"{path}: tensor {name!r}"
    if not isinstance(entry, dict):
        raise CheckpointError(f"{where}: corrupt header entry, expected an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str):
        raise CheckpointError(f"{where}: corrupt header entry, dtype must be a string, got {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape):
        raise CheckpointError(
            f"{where}: corrupt header entry, shape must be a list of non-negative ints, got {shape!r}"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise CheckpointError(
            f"{where}: corrupt header entry, data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}"
        )
    begin, end = offsets
    if dtype in SAFETENSORS_DTYPES:
        want = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        if end - begin != want:
            raise CheckpointError(
                f"{where}: corrupt header entry, {dtype} {shape} needs {want} bytes but data_offsets span {end - begin}"
            )
    if end > data_size:
        raise CheckpointError(
            f"{where}: truncated file: the tensor's bytes end at data offset {end} but the file holds only "
            f"{data_size} data bytes ({file_size} bytes in all)"
        )
    return TensorInfo(path, name, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_disjoint(path: Path, tensors: dict[str, TensorInfo], data_start: int) -> None:
    """No two tensors share a byte (a tampered header could make one tensor read another's bytes).
    Sorted by start, it is enough that each non-empty tensor begins at or after the end of the one
    before it: the ends then never decrease, so no later tensor can reach back either."""
    spans = sorted((t.start - data_start, t.end - data_start, t.name) for t in tensors.values() if t.end > t.start)
    for (begin_a, end_a, a), (begin_b, end_b, b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise CheckpointError(
                f"{path}: corrupt safetensors header: tensor {b!r} (data_offsets {[begin_b, end_b]}) "
                f"overlaps tensor {a!r} (data_offsets {[begin_a, end_a]}); each tensor needs its own bytes"
            )


def read_safetensors_header(path: str | Path) -> SafetensorsHeader:
    """Parse and validate the header of a safetensors file (without touching its data).

    Checks: the length prefix fits the file, the JSON parses to an object, every entry has a
    dtype string, a non-negative integer shape and ``data_offsets`` whose length equals
    ``numel * itemsize`` (for dtypes engram-viz knows), every tensor's bytes lie inside the
    file's data region (otherwise the file is reported as truncated) and no two tensors overlap. Tensors of unknown dtypes (e.g. packed
    fp4 experts) are listed but cannot be read.
    """
    path = Path(path)
    file_size, raw = _read_header_bytes(path)
    return parse_safetensors_header(path, file_size, raw)


def parse_safetensors_header(path: Path, file_size: int, raw: bytes) -> SafetensorsHeader:
    """The checks of :func:`read_safetensors_header` on a header already read: ``raw`` the JSON bytes
    after the length prefix of a ``file_size``-byte file named ``path`` (on disk or, ``hub_shards``,
    on the Hub)."""
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError) as err:  # bad UTF-8 or JSON, a 5,000-digit number, deep nesting
        raise CheckpointError(f"{path}: corrupt safetensors header: not valid UTF-8 JSON ({err})") from None
    if not isinstance(doc, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: expected a JSON object, got {type(doc).__name__}")
    data_start = 8 + len(raw)
    data_size = file_size - data_start
    metadata = doc.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise CheckpointError(f"{path}: corrupt safetensors header: __metadata__ must be an object")
    tensors = {name: _tensor_entry(path, name, entry, data_start, data_size, file_size) for name, entry in doc.items()}
    _check_disjoint(path, tensors, data_start)
    return SafetensorsHeader(path, file_size, data_start, tensors, {str(k): str(v) for k, v in metadata.items()})


def create_sparse_safetensors(
    path: str | Path, specs: dict[str, tuple[str, Sequence[int]]], metadata: dict[str, str] | None = None
) -> SafetensorsHeader:
    """Write a safetensors file of the given tensors (name -> (dtype string, shape)) whose data is a
    hole: a handwritten header, then ``truncate`` to the full size, so a 98 GB table takes no disk
    and reads as zeros. For memory tests and benchmarks at the real dimensions; fill rows with
    ``os.pwrite`` at ``header.tensors[name].start + row * row_bytes``. Written atomically."""
    path = Path(path)
    doc: dict = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name, (dtype, shape) in specs.items():
        if dtype not in SAFETENSORS_DTYPES:
            raise InputError(f"tensor {name!r}: unknown dtype {dtype!r}; expected one of {sorted(SAFETENSORS_DTYPES)}")
        nbytes = math.prod(shape) * SAFETENSORS_DTYPES[dtype][1]
        doc[name] = {"dtype": dtype, "shape": [int(s) for s in shape], "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps(doc, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # align the data to 8 bytes, as the safetensors writer does
    with atomic_path(path, suffix=".partial") as tmp, open(tmp, "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header)
        fh.truncate(8 + len(header) + offset)
    return read_safetensors_header(path)


def pread_into(fd: int, buf: memoryview, offset: int, what: str) -> None:
    """Fill ``buf`` from ``offset`` (looping over short reads); a read past EOF means truncation."""
    done, total = 0, len(buf)
    while done < total:
        got = os.preadv(fd, [buf[done:]], offset + done)
        if got == 0:
            raise CheckpointError(
                f"{what}: truncated file: read stopped at byte {offset + done}, expected {total - done} more bytes"
            )
        done += got


def torch_dtype_of(safetensors_dtype: str) -> torch.dtype:
    """The torch dtype of a dtype string of ``SAFETENSORS_DTYPES`` (KeyError for another)."""
    import torch  # here, not at the top: reading headers needs no torch

    return getattr(torch, SAFETENSORS_DTYPES[safetensors_dtype][0])


def read_tensor(info: TensorInfo) -> torch.Tensor:
    """Read one whole tensor eagerly (CPU), bit for bit as stored."""
    import torch  # see torch_dtype_of

    dtype = info.torch_dtype
    if info.nbytes == 0:  # no bytes to view as a wider dtype
        return torch.empty(info.shape, dtype=dtype)
    out = np.empty(info.nbytes, dtype=np.uint8)
    fd = os.open(info.path, os.O_RDONLY)
    try:
        pread_into(fd, memoryview(out), info.start, f"{info.path}: tensor {info.name!r}")
    finally:
        os.close(fd)
    flat = torch.from_numpy(out)
    if dtype == torch.bool:
        return flat.view(torch.bool).reshape(info.shape)
    return flat.view(dtype).reshape(info.shape)
