"""Non-finite weights: which stored bit patterns are NaN or Inf, found in the raw bytes.

A float is non-finite when its exponent bits are all ones (IEEE: Inf or NaN). The checkpoint's fp8
formats have no Inf: e4m3fn's only NaN is ``S.1111.111`` (0x7F / 0xFF: exponent and mantissa all
ones); e8m0fnu is an exponent alone and 0xFF is its NaN. So one rule covers every dtype:

    non-finite  <=>  (bits & MASK) == MASK      on the element's unsigned integer view

with ``MASK`` below. Integer and bool tensors are always finite. The rule runs on bytes as read
(no dequantisation), so it costs one pass over the rows a gather reads anyway.

Where it is applied: small tensors (``wkv``, its scales, ``q_weight``, ``k_weight``, a tiny LM's
tensors) when opened (:func:`read_checked`); table and embedding rows when gathered, only the rows
read (``rows.LazyRows``, ``tables.InMemoryTable``); whole tensors by ``engram-viz inspect --verify``
(``verify.py``). Every error is a :class:`NonFiniteError` naming the file, the tensor and the rows.
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.errors import NonFiniteError
from engram_viz.weights.safetensors import TensorInfo, read_tensor

# torch dtype -> (unsigned view of one element, bits that are all ones exactly when non-finite)
NONFINITE_MASK: dict[torch.dtype, tuple[type, int]] = {
    torch.float64: (np.uint64, 0x7FF0_0000_0000_0000),
    torch.float32: (np.uint32, 0x7F80_0000),
    torch.float16: (np.uint16, 0x7C00),
    torch.bfloat16: (np.uint16, 0x7F80),
    torch.float8_e5m2: (np.uint8, 0x7C),
    torch.float8_e4m3fn: (np.uint8, 0x7F),  # NaN only: 0x7F, 0xFF
    torch.float8_e8m0fnu: (np.uint8, 0xFF),  # NaN only: 0xFF
}
_WHAT = {
    torch.float8_e4m3fn: "NaN: e4m3 bytes 0x7F/0xFF",
    torch.float8_e8m0fnu: "NaN: e8m0 scale bytes 0xFF",
}
CHUNK_ELEMENTS = 1 << 22  # elements tested per step: temporaries stay a few MB
SHOWN_ROWS = 8  # row ids named in a message


def nonfinite_rows(raw: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """Indices of the rows of ``raw`` (uint8 ``[rows, row_bytes]``, rows of ``dtype`` elements) that
    hold at least one non-finite value; empty for integer dtypes and for clean rows."""
    if dtype not in NONFINITE_MASK or raw.size == 0:
        return np.empty(0, dtype=np.int64)
    view, mask = NONFINITE_MASK[dtype]
    elems = np.ascontiguousarray(raw).view(view).reshape(raw.shape[0], -1)
    step = max(1, CHUNK_ELEMENTS // max(1, elems.shape[1]))
    bad = []
    for a in range(0, elems.shape[0], step):
        block = elems[a : a + step]
        hit = block == mask if mask == np.iinfo(view).max else (block & view(mask)) == mask
        if hit.any():  # the common case (no hit) costs one pass and no per-row work
            bad.append(a + np.flatnonzero(hit.any(axis=1)))
    return np.concatenate(bad).astype(np.int64) if bad else np.empty(0, dtype=np.int64)


def count_nonfinite(raw: np.ndarray, dtype: torch.dtype) -> int:
    """How many elements of ``raw`` (uint8 bytes of ``dtype`` elements) are non-finite."""
    if dtype not in NONFINITE_MASK or raw.size == 0:
        return 0
    view, mask = NONFINITE_MASK[dtype]
    elems = np.ascontiguousarray(raw).reshape(-1).view(view)
    return int(np.count_nonzero((elems & view(mask)) == mask))


def describe(dtype: torch.dtype) -> str:
    """What a non-finite value of ``dtype`` is, for messages."""
    return _WHAT.get(dtype, "NaN or Inf")


def rows_text(ids) -> str:
    """``[3, 17, 250]`` or ``[3, 17, ...] (12 rows)`` for messages."""
    ids = [int(i) for i in ids]
    shown = ", ".join(str(i) for i in ids[:SHOWN_ROWS])
    return f"[{shown}]" if len(ids) <= SHOWN_ROWS else f"[{shown}, ...] ({len(ids):,} rows)"


def nonfinite_error(where: str, dtype: torch.dtype, row_ids) -> NonFiniteError:
    """The error for non-finite rows ``row_ids`` of the tensor ``where`` (``'<file>: tensor <name>'``)."""
    return NonFiniteError(
        f"{where}: non-finite weights ({describe(dtype)}) in rows {rows_text(row_ids)}; "
        "the file is corrupt or was written from diverged weights"
    )


def as_rows(t: torch.Tensor) -> np.ndarray:
    """The bytes of a CPU tensor as uint8 ``[rows, row_bytes]`` (rows: the first dimension; a 0-D
    or 1-D tensor is one row)."""
    flat = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
    rows = t.shape[0] if t.dim() >= 2 else 1
    return flat.reshape(rows, -1) if flat.size else np.empty((rows, 0), dtype=np.uint8)


def tensor_nonfinite_rows(t: torch.Tensor) -> np.ndarray:
    """:func:`nonfinite_rows` of a tensor's rows (first dimension). fp8 tensors on an accelerator are
    tested there (one flag comes back), so an in-memory GPU table's gathers copy nothing to the host."""
    if t.dtype not in NONFINITE_MASK or t.numel() == 0:
        return np.empty(0, dtype=np.int64)
    if t.device.type != "cpu" and t.element_size() == 1:
        mask = NONFINITE_MASK[t.dtype][1]
        hit = (t.view(torch.uint8) & mask) == mask
        if not bool(hit.any()):
            return np.empty(0, dtype=np.int64)
        return torch.nonzero(hit.reshape(hit.shape[0] if hit.dim() >= 2 else 1, -1).any(1)).flatten().cpu().numpy()
    return nonfinite_rows(as_rows(t), t.dtype)


def check_finite(t: torch.Tensor, where: str) -> torch.Tensor:
    """``t`` itself when every value is finite, else :class:`NonFiniteError` naming ``where`` and the rows."""
    bad = tensor_nonfinite_rows(t)
    if len(bad):
        raise nonfinite_error(where, t.dtype, bad)
    return t


def read_checked(info: TensorInfo) -> torch.Tensor:
    """Read one whole tensor (``safetensors.read_tensor``) and check that it is finite."""
    return check_finite(read_tensor(info), f"{info.path}: tensor {info.name!r}")
