"""An Engram table stored in a GGUF block type, read lazily: the suite's table interface on GGUF rows.

``GGUFTable(rows, qtype, head_dim)`` is an ``EngramTable`` whose stored parts are a row's raw
blocks (uint8 ``[n, row_bytes]``) and an empty second part (uint8 ``[n, 0]``): gathers read only the
rows asked for (``rows``: a ``RowSource`` of block bytes, e.g. ``block_rows`` over a
file, or ``quant_candidates.QuantisingRows`` quantising reference rows on the fly) and dequantise
them with gguf's own dequantiser, then round to bf16 as the reference lookup does. Every analysis,
hook, explanation and row edit that takes an ``EngramTable`` takes this one; ``gather_fp8`` alone
is refused, as there are no fp8 bits (``gather_stored`` gives the blocks). Memory stays bounded: a
table is never dequantised whole.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from engram_viz.errors import CheckpointError, NonFiniteError
from engram_viz.weights.gguf_file import GGUFFile, GGUFTensor, decode_blocks, encode_blocks
from engram_viz.weights.rows import LazyRows, RowSource, take_rows, unique_ids
from engram_viz.weights.safetensors import TensorInfo
from engram_viz.weights.tables import DEQUANT_CHUNK_ROWS, EngramTable


def row_bytes_of(qtype: GGMLQuantizationType, head_dim: int, where: str) -> int:
    """Bytes of one row of ``head_dim`` values in ``qtype``; a ``CheckpointError`` if not whole blocks."""
    size, nbytes = GGML_QUANT_SIZES[qtype]
    if head_dim % size:
        raise CheckpointError(
            f"{where}: a row of {head_dim} values is not a whole number of {qtype.name} blocks of {size} values"
        )
    return head_dim // size * nbytes


def block_rows(t: GGUFTensor) -> LazyRows:
    """The rows of ``t`` as raw block bytes: a ``LazyRows`` of uint8 ``[rows, row_bytes]``."""
    rows, row_bytes = t.rows, t.row_bytes
    info = TensorInfo(t.path, t.name, "U8", (rows, row_bytes), t.start, t.start + rows * row_bytes)
    return LazyRows(info)


class GGUFTable(EngramTable):
    """Rows ``[num_rows, head_dim]`` stored as GGML ``qtype`` blocks, gathered by id from ``rows``."""

    def __init__(
        self,
        rows: RowSource,
        qtype: GGMLQuantizationType,
        head_dim: int,
        num_rows: int | None = None,
        label: str | None = None,
        synthetic: bool = False,
    ):
        where = label or rows.label
        want = row_bytes_of(qtype, head_dim, where)
        if rows.dtype != torch.uint8 or rows.cols != want:
            raise CheckpointError(
                f"{where}: {qtype.name} rows of {head_dim} values are {want} bytes; the source gives "
                f"{rows.dtype} rows of {rows.cols}"
            )
        num_rows = rows.num_rows if num_rows is None else int(num_rows)
        if num_rows > rows.num_rows:
            raise CheckpointError(f"{where}: {num_rows:,} rows wanted but the table holds {rows.num_rows:,}")
        self.rows, self.qtype = rows, qtype
        self.num_rows, self.head_dim = num_rows, head_dim
        self.row_bytes = want
        self.label, self.synthetic = where, synthetic
        self.stored_format = f"GGUF {qtype.name} blocks"
        self.device = torch.device("cpu")

    @classmethod
    def open(
        cls, file: GGUFFile | str | Path, name: str, num_rows: int | None = None, label: str | None = None
    ) -> GGUFTable:
        """The table tensor ``name`` of a GGUF file, ``[rows, head_dim]`` in numpy order."""
        f = file if isinstance(file, GGUFFile) else GGUFFile(file)
        t = f.tensor(name, "an Engram table")
        if len(t.shape) != 2:
            raise CheckpointError(f"{t.where()}: an Engram table must be 2-D [rows, head_dim]")
        where = label or f"table {name} ({t.type_name}) of {f.path}"
        row_bytes_of(t.qtype, t.cols, where)
        return cls(block_rows(t), t.qtype, t.cols, num_rows=num_rows, label=where)

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.row_bytes / self.head_dim

    def __call__(self, row_ids) -> torch.Tensor:
        """bf16 ``[..., head_dim]``: each unique row read and dequantised once (in chunks of
        ``DEQUANT_CHUNK_ROWS``), then expanded; on the ids' device."""
        ids = self._check(row_ids)
        uniq, inv = unique_ids(ids)
        w, s = self._gather_unique(uniq)
        rows = torch.empty(len(uniq), self.head_dim, dtype=torch.bfloat16)
        for a in range(0, len(uniq), DEQUANT_CHUNK_ROWS):
            rows[a : a + DEQUANT_CHUNK_ROWS] = self._decode(
                w[a : a + DEQUANT_CHUNK_ROWS], s[a : a + DEQUANT_CHUNK_ROWS]
            )
        return take_rows(rows, inv).reshape(*ids.shape, self.head_dim).to(ids.device)

    def _gather_unique(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = self.rows.read_unique(ids)
        return blocks, torch.empty(len(ids), 0, dtype=torch.uint8)

    def _decode(self, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        x = decode_blocks(w.cpu().numpy(), self.qtype, self.head_dim, self.label)
        bad = np.flatnonzero(~np.isfinite(x).all(axis=1))
        if len(bad):
            raise NonFiniteError(f"{self.label}: {len(bad)} of the {len(x)} rows read decode to NaN or Inf")
        return torch.from_numpy(x).to(torch.bfloat16).to(w.device)

    def _encode(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = encode_blocks(x.detach().cpu().float().numpy(), self.qtype, self.label)
        return torch.from_numpy(blocks), torch.empty(len(blocks), 0, dtype=torch.uint8)

    def _zero_parts(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        # all-zero blocks decode to zeros in every GGML type (zero scales and zero codes)
        return torch.zeros(n, self.row_bytes, dtype=torch.uint8), torch.empty(n, 0, dtype=torch.uint8)

    def gather_fp8(self, row_ids) -> tuple[torch.Tensor, torch.Tensor]:
        raise CheckpointError(
            f"{self.label} stores {self.stored_format}, not fp8 rows: table(ids) gives the rows (bf16), "
            "gather_stored(ids) the blocks"
        )
