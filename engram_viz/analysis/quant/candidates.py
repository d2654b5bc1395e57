"""Candidate tables for the quantisation study: what replaces the reference fp8 table of each layer.

A candidate is one of

- a GGML type name (``"Q8_0"``, ``"Q4_0"``, ``"Q5_0"``, ``"MXFP4"``, ... any type gguf can quantise):
  the reference rows quantised on the fly by gguf's quantiser (:class:`QuantisingRows`) and read
  back through a ``GGUFTable``, the class a GGUF file's table opens as, so the rows a prompt reads
  go through the same dequantiser and bf16 rounding as a file's (and are bit for bit a file's
  rows written by ``weights.gguf_export`` in that type);
- a path to a GGUF file: its tables (``weights.gguf_checkpoint``, constants checked);
- ``"off"``: every row zeroed (``weights.row_edits``): the value is 0, so the Engram output is its
  input, the end point of the scale.

:func:`using_candidate` swaps a model's tables for a candidate's within a ``with`` block.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engram_viz.config import load_config
from engram_viz.errors import InputError
from engram_viz.weights.gguf_checkpoint import open_gguf_checkpoint
from engram_viz.weights.gguf_export import qtype_of
from engram_viz.weights.gguf_file import check_quantiser, encode_blocks, is_gguf_path
from engram_viz.weights.gguf_table import GGUFTable, row_bytes_of
from engram_viz.weights.row_edits import edit_tables
from engram_viz.weights.rows import RowSource
from engram_viz.weights.tables import EngramTable

OFF = "off"
DEFAULT_TYPES = ("Q8_0", "Q5_0", "Q4_0", "MXFP4")  # the types gguf can quantise
FP8_BITS = 8.25  # the reference rows: e4m3 values and one e8m0 scale per 32 (8 + 8 / 32 bits a weight)
V41_TABLE_ROWS = int(np.mean(load_config("v41-flash").engram_num_embeddings))  # rows of one real table


class QuantisingRows(RowSource):
    """Rows of ``table`` (an ``EngramTable``) quantised to ``qtype`` when read: uint8 ``[n, row_bytes]``."""

    def __init__(self, table: EngramTable, qtype):
        self.table, self.qtype = table, qtype
        self.num_rows, self.dtype = table.num_rows, torch.uint8
        self.cols = row_bytes_of(qtype, table.head_dim, table.label)
        self.label = f"{table.label}, quantised to {qtype.name} on the fly"

    def read_unique(self, ids: np.ndarray) -> torch.Tensor:
        rows = self.table(torch.from_numpy(np.asarray(ids, dtype=np.int64))).float().numpy()
        return torch.from_numpy(encode_blocks(rows, self.qtype, self.label))


@dataclass
class Candidate:
    """A named replacement for each layer's table (``tables`` {layer: table}; None for ``off``)."""

    name: str
    bits_per_weight: float
    tables: dict[int, EngramTable] | None

    @property
    def table_gb(self) -> float:
        """Size of one V4.1-Flash table (``V41_TABLE_ROWS`` x 256) stored this way, in GB (1e9 bytes)."""
        return V41_TABLE_ROWS * 256 * self.bits_per_weight / 8 / 1e9


def candidate(spec: str | Path, reference: Mapping[int, EngramTable]) -> Candidate:
    """The candidate ``spec`` (a GGML type name, a GGUF file, or ``"off"``) for the reference tables."""
    if str(spec).lower() == OFF:
        return Candidate("Engram off", 0.0, None)
    if is_gguf_path(spec):
        ckpt = open_gguf_checkpoint(spec)
        tables = {n: ckpt.layer(n).table for n in reference}
        first = next(iter(tables.values()))
        bits = first.bits_per_weight if isinstance(first, GGUFTable) else FP8_BITS
        return Candidate(Path(spec).name, bits, tables)
    if str(spec).endswith(".gguf"):
        raise InputError(f"candidate {spec}: no such GGUF file")
    qtype = qtype_of(str(spec))
    check_quantiser(qtype, f"candidate {spec}")
    tables: dict[int, EngramTable] = {}
    for n, ref in reference.items():
        tables[n] = GGUFTable(QuantisingRows(ref, qtype), qtype, ref.head_dim, label=f"layer {n} table as {qtype.name}")
    return Candidate(qtype.name, next(iter(tables.values())).bits_per_weight, tables)  # type: ignore[union-attr]


@contextmanager
def using_candidate(engrams: Mapping[Any, Any], cand: Candidate) -> Iterator[None]:
    """Within the block, each Engram layer of ``engrams`` ({key: Engram}) reads the candidate's table."""
    found = {k: e.table for k, e in engrams.items()}
    if cand.tables is None:
        with edit_tables({int(k): t for k, t in found.items()}, {int(k): range(t.num_rows) for k, t in found.items()}):
            yield
        return
    try:
        for k, e in engrams.items():
            object.__setattr__(e, "table", cand.tables[int(k)])
        yield
    finally:
        for k, e in engrams.items():
            object.__setattr__(e, "table", found[k])
