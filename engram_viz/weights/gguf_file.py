"""A GGUF file (llama.cpp's format) as the weights layer sees it: metadata, tensor places, block rows.

``open_gguf(path)`` parses the header (``gguf_header.py``; no tensor data is touched) and checks
that every tensor's bytes lie inside the file. A
``GGUFTensor`` says where one tensor lies and in which GGML type. Rows are read by id as raw block
bytes (``gguf_table.block_rows``: the ``pread`` engine of ``rows.LazyRows``): a row of ``cols`` values is
``cols / block_size * type_size`` bytes for every type (Q8_0: 8 blocks of 34 bytes for 256 values;
a K-quant: one super-block), so a row is a fixed run of bytes and a gather reads only the rows
asked for. ``decode_blocks`` dequantises such rows with gguf's own dequantisers; ``read_small``
reads a whole small tensor (wkv, q, k, the tiny LM's own); a table is never read whole.
``gguf_config`` is the suite's config a file carries. No torch is imported until a tensor is read.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants

from engram_viz.config import ConfigError, EngramConfig, load_config, match_preset
from engram_viz.errors import CheckpointError, GGUFHeaderError
from engram_viz.weights.gguf_header import read_gguf_header
from engram_viz.weights.safetensors import pread_into

if TYPE_CHECKING:
    import torch

GGUF_SUFFIX = ".gguf"
DEFAULT_GGUF_CONFIG = "v41-flash"  # a GGUF file that does not carry the suite's config
INTEGER_TYPES = ("I8", "I16", "I32", "I64")  # stored values, not weights: never dequantised
ARCH_KEY = "general.architecture"


def is_gguf_path(path: str | Path | None) -> bool:
    """True for an existing file named ``*.gguf`` or starting with the GGUF magic ``b'GGUF'``."""
    if path is None:
        return False
    p = Path(path)
    if not p.is_file():
        return False
    if p.suffix == GGUF_SUFFIX:
        return True
    try:
        with p.open("rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


@dataclass(frozen=True)
class GGUFTensor:
    """Where one tensor's bytes lie in a GGUF file. ``shape`` is numpy order (GGUF lists dims
    reversed): ``[rows, cols]`` for a matrix; ``start`` is an absolute file offset."""

    path: Path
    name: str
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]
    start: int
    nbytes: int

    @property
    def type_name(self) -> str:
        return self.qtype.name

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def rows(self) -> int:
        return math.prod(self.shape[:-1])

    @property
    def block(self) -> tuple[int, int]:
        """``(values per block, bytes per block)`` of the type."""
        return GGML_QUANT_SIZES[self.qtype]

    @property
    def row_bytes(self) -> int:
        """Bytes of one row of ``cols`` values; a ``CheckpointError`` when a row is not whole blocks."""
        size, nbytes = self.block
        if self.cols % size:
            raise CheckpointError(
                f"{self.path}: tensor {self.name!r} ({self.type_name}) has rows of {self.cols} values, "
                f"not a whole number of {self.type_name} blocks of {size} values"
            )
        return self.cols // size * nbytes

    @property
    def bits_per_weight(self) -> float:
        size, nbytes = self.block
        return 8 * nbytes / size

    def where(self) -> str:
        return f"{self.path}: tensor {self.name!r} ({self.type_name} {list(self.shape)})"


def decode_blocks(raw: np.ndarray, qtype: GGMLQuantizationType, cols: int, where: str) -> np.ndarray:
    """Rows of raw blocks uint8 ``[n, row_bytes]`` -> float32 ``[n, cols]`` by gguf's dequantiser."""
    if qtype.name in INTEGER_TYPES:
        raise CheckpointError(f"{where}: GGML type {qtype.name} holds integers, not weights")
    try:
        out = quants.dequantize(np.ascontiguousarray(raw), qtype)
    except NotImplementedError:
        raise CheckpointError(f"{where}: the gguf package cannot dequantise GGML type {qtype.name}") from None
    return np.asarray(out, dtype=np.float32).reshape(raw.shape[0], cols)


def encode_blocks(x: np.ndarray, qtype: GGMLQuantizationType, where: str) -> np.ndarray:
    """float32 rows ``[n, cols]`` -> raw blocks uint8 ``[n, row_bytes]`` by gguf's quantiser (Q8_0,
    Q4_0/1, Q5_0/1, MXFP4, TQ1_0/2_0, BF16, F16, F32; gguf has none for the K- and IQ-types)."""
    try:
        out = quants.quantize(np.ascontiguousarray(x, dtype=np.float32), qtype)
    except NotImplementedError:
        raise CheckpointError(f"{where}: the gguf package has no quantiser for GGML type {qtype.name}") from None
    except quants.QuantError:
        raise CheckpointError(
            f"{where}: rows of {x.shape[-1]} values are not a whole number of {qtype.name} blocks of "
            f"{GGML_QUANT_SIZES[qtype][0]} values"
        ) from None
    return np.ascontiguousarray(out).view(np.uint8).reshape(x.shape[0], -1)


def check_quantiser(qtype: GGMLQuantizationType, where: str) -> None:
    """A ``CheckpointError`` naming ``where`` unless gguf can quantise ``qtype``."""
    encode_blocks(np.zeros((1, GGML_QUANT_SIZES[qtype][0]), np.float32), qtype, where)


class GGUFFile:
    """An opened GGUF file: ``arch`` (``general.architecture``), ``tensors`` {name: GGUFTensor} and
    ``value(key)`` for metadata (None when absent; arrays of numbers as numpy arrays)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise CheckpointError(f"GGUF file {self.path} does not exist or is not a file")
        try:
            self._fields, raw, _ = read_gguf_header(self.path)
        except (GGUFHeaderError, OSError, ValueError) as err:
            raise CheckpointError(f"{self.path}: not a readable GGUF file: {err}") from None
        size = self.path.stat().st_size
        self.tensors: dict[str, GGUFTensor] = {}
        for t in raw:
            info = GGUFTensor(self.path, t.name, t.qtype, tuple(reversed(t.dims)), t.start, t.nbytes)
            if info.start + info.nbytes > size:
                raise CheckpointError(
                    f"{info.where()}: its bytes end at {info.start + info.nbytes:,} but the file has {size:,} "
                    "(truncated)"
                )
            self.tensors[t.name] = info
        self.arch = str(self.value(ARCH_KEY) or "")

    def value(self, key: str) -> Any:
        return self._fields.get(key)

    def keys(self) -> list[str]:
        return list(self._fields)

    def tensor(self, name: str, what: str) -> GGUFTensor:
        """The tensor ``name``; a ``CheckpointError`` naming the file and ``what`` needs it when absent."""
        if name not in self.tensors:
            raise CheckpointError(f"{self.path}: tensor {name!r} not found ({what} needs it)")
        return self.tensors[name]


def open_gguf(path: str | Path) -> GGUFFile:
    """Parse the GGUF header of ``path`` (no tensor data read); ``CheckpointError`` if it is not one."""
    return GGUFFile(path)


def suite_config(file: GGUFFile, key: str) -> dict | None:
    """The suite's own ``config.json`` that a GGUF file written by the suite carries under ``key``."""
    text = file.value(key)
    if text is None:
        return None
    try:
        raw = json.loads(text)
    except (TypeError, ValueError) as err:
        raise CheckpointError(f"{file.path}: metadata {key} is not a JSON config: {err}") from None
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file.path}: metadata {key} must be a JSON object, got {type(raw).__name__}")
    return raw


def gguf_config(file: GGUFFile, config: EngramConfig | str | Path | None, key: str) -> EngramConfig:
    """``config`` when given; else the suite's config the file carries; else ``v41-flash``."""
    if config is not None:
        return load_config(config)
    raw = suite_config(file, key)
    if raw is None:
        return load_config(DEFAULT_GGUF_CONFIG)
    try:
        return match_preset(EngramConfig.from_dict(raw, name=file.path.name))
    except ConfigError as err:
        raise CheckpointError(f"{file.path}: metadata {key}: {err}") from None


def read_small(t: GGUFTensor) -> torch.Tensor:
    """A whole small tensor, dequantised to float32 in numpy order (integer types as int64)."""
    import torch  # here, not at the top: reading a header (``weights_config``) needs no torch

    raw = np.empty(t.nbytes, dtype=np.uint8)
    with t.path.open("rb") as f:
        pread_into(f.fileno(), memoryview(raw), t.start, t.where())
    if t.type_name in INTEGER_TYPES:
        return torch.from_numpy(raw.view(f"<i{t.block[1]}").astype(np.int64).reshape(t.shape))
    rows = raw.reshape(t.rows, t.row_bytes)
    return torch.from_numpy(decode_blocks(rows, t.qtype, t.cols, t.where()).reshape(t.shape))
