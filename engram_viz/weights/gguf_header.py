"""The header of a GGUF file parsed in one pass: metadata values and tensor places, no data read.

GGUF (v2/v3, little-endian): magic ``GGUF``, version u32, tensor count u64, metadata count u64;
each metadata entry a key (u64 length + UTF-8), a value type u32 and the value (an array: element
type u32, count u64, elements); each tensor a name, n_dims u32, dims u64 (fastest first), GGML
type u32 and offset u64 from the data start, which is the header's end rounded up to
``general.alignment`` (32 by default). Types and sizes are the ``gguf`` package's own
(``GGUFValueType``, ``GGMLQuantizationType``, ``GGML_QUANT_SIZES``).

Why not ``gguf.GGUFReader``: it parses a metadata array element by element (3 s for the 129,280
entry token map on this machine); here an array of numbers is one ``np.frombuffer``. The test
suite checks this parse against ``GGUFReader``'s on the same files.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from engram_viz.errors import GGUFHeaderError

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
NUMERIC = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype("?"),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}


@dataclass(frozen=True)
class RawTensor:
    """One tensor entry: ``dims`` in GGUF order (fastest first), ``start`` an absolute file offset."""

    name: str
    dims: tuple[int, ...]
    qtype: GGMLQuantizationType
    start: int

    @property
    def nbytes(self) -> int:
        size, nbytes = GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.dims, dtype=np.int64)) // size * nbytes


class _Cursor:
    def __init__(self, buf: memoryview):
        self.buf, self.at = buf, 0

    def take(self, n: int) -> memoryview:
        if n < 0 or self.at + n > len(self.buf):
            raise GGUFHeaderError(f"the header runs past the end of the file at byte {self.at:,} (truncated)")
        out = self.buf[self.at : self.at + n]
        self.at += n
        return out

    def num(self, dtype: np.dtype, count: int = 1) -> np.ndarray:
        return np.frombuffer(self.take(dtype.itemsize * count), dtype=dtype, count=count)

    def u32(self) -> int:
        return int(self.num(np.dtype("<u4"))[0])

    def u64(self) -> int:
        return int(self.num(np.dtype("<u8"))[0])

    def string(self) -> str:
        raw = bytes(self.take(self.u64()))
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise GGUFHeaderError(f"a string before byte {self.at:,} is not UTF-8") from None

    def vtype(self) -> GGUFValueType:
        raw = self.u32()
        try:
            return GGUFValueType(raw)
        except ValueError:
            raise GGUFHeaderError(f"unknown metadata value type {raw} before byte {self.at:,}") from None

    def value(self, vtype: GGUFValueType) -> Any:
        if vtype in NUMERIC:
            v = self.num(NUMERIC[vtype])[0]
            return v.item()
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            etype, count = self.vtype(), self.u64()
            if etype in NUMERIC:
                return self.num(NUMERIC[etype], count).copy()
            if etype == GGUFValueType.STRING:
                return [self.string() for _ in range(count)]
            raise GGUFHeaderError(f"nested metadata arrays are not read (before byte {self.at:,})")
        raise GGUFHeaderError(f"metadata value type {vtype.name} not read")

    def tensor(self) -> tuple[str, tuple[int, ...], GGMLQuantizationType, int]:
        name = self.string()
        n_dims = self.u32()
        if not 1 <= n_dims <= 4:
            raise GGUFHeaderError(f"tensor {name!r} has {n_dims} dims; GGUF allows 1 to 4")
        dims = tuple(int(d) for d in self.num(np.dtype("<u8"), n_dims))
        raw = self.u32()
        try:
            qtype = GGMLQuantizationType(raw)
        except ValueError:
            raise GGUFHeaderError(f"tensor {name!r} has unknown GGML type {raw}") from None
        return name, dims, qtype, self.u64()


def _parse(buf: memoryview) -> tuple[dict[str, Any], list[RawTensor], int]:
    cur = _Cursor(buf)
    if bytes(cur.take(4)) != MAGIC:
        raise GGUFHeaderError("it does not start with the GGUF magic b'GGUF'")
    version = cur.u32()
    if version not in VERSIONS:
        raise GGUFHeaderError(f"GGUF version {version}; expected one of {VERSIONS} (little-endian)")
    n_tensors, n_kv = cur.u64(), cur.u64()
    fields: dict[str, Any] = {}
    for _ in range(n_kv):
        key = cur.string()
        fields[key] = cur.value(cur.vtype())
    entries = [cur.tensor() for _ in range(n_tensors)]
    align = int(fields.get("general.alignment", DEFAULT_ALIGNMENT))
    if align <= 0 or align & (align - 1):
        raise GGUFHeaderError(f"general.alignment is {align}; expected a power of two")
    data_start = -(-cur.at // align) * align
    seen: set[str] = set()
    tensors = []
    for name, dims, qtype, offset in entries:
        if name in seen:
            raise GGUFHeaderError(f"tensor {name!r} is listed twice")
        seen.add(name)
        tensors.append(RawTensor(name, dims, qtype, data_start + offset))
    return fields, tensors, data_start


def read_gguf_header(path: str | Path) -> tuple[dict[str, Any], list[RawTensor], int]:
    """``(metadata {key: value}, tensors, data start)`` of a GGUF file; ``GGUFHeaderError`` if not one.
    Arrays of numbers come back as numpy arrays, of strings as lists; the file is memory-mapped and
    only the header's pages are touched."""
    with open(path, "rb") as f:
        if Path(path).stat().st_size < len(MAGIC):
            raise GGUFHeaderError("the file is shorter than the GGUF magic")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            view = memoryview(mm)
            try:
                return _parse(view)
            finally:
                view.release()
