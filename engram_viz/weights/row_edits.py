"""Counterfactual row edits: an overlay on any Engram table, in memory, never on disk.

``with edit_rows(table, {row: spec, ...}):`` makes every gather of ``table`` (an
:class:`~engram_viz.weights.tables.EngramTable`: in memory, lazy or procedural) return the edited
rows; on exit the table is what it was. The checkpoint is never written. A spec is

- ``"zero"``: the row dequantises to zeros (weight 0, scale 1): the memory is ablated;
- an ``int``: the stored bits of that other row, as the table reads it just before this edit
  (outer edits included);
- a float tensor ``[head_dim]``: a new row, quantised as the checkpoint stores rows
  (``fp8.quantize_rows``: e4m3 with one e8m0 scale per 32 features);
- a pair ``(weight e4m3 [head_dim], scale e8m0 [head_dim / 32])``: the stored bits themselves.

Instead of a mapping, ``edits`` may be a ``range`` or an array of row ids: all zeroed. A ``range``
costs nothing however long (a whole column of the real table is 16 M rows), so one head's rows of a
layer are ``range(offset, offset + prime)`` (``analysis.edit_targets.head_rows``).

How: the overlay wraps the table's ``_gather_unique`` (the one place every backing reads rows), so
``gather_fp8`` and the bf16 lookup ``table(ids)`` both see it; rows that are not edited come back
bit for bit as stored. :meth:`RowOverlay.covers` says which ids an edit touches (the run layer
uses it to mark positions that read an edited row). Edits nest: the innermost wins.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from engram_viz.config import FP8_BLOCK_SIZE
from engram_viz.core import fp8
from engram_viz.errors import RowEditError
from engram_viz.weights.tables import EngramTable

ZERO = "zero"
E8M0_ONE = 127  # the e8m0 byte of the scale 1.0 (2**(127 - 127))


@dataclass
class RowOverlay:
    """Resolved edits of one table: ``rows`` sorted int64 ``[E]`` with their stored bits ``weight``
    e4m3 ``[E, head_dim]`` and ``scale`` e8m0 ``[E, head_dim / 32]``, plus zeroed ``ranges``
    ``[(lo, hi)]`` (half open)."""

    rows: np.ndarray
    weight: torch.Tensor
    scale: torch.Tensor
    ranges: list[tuple[int, int]] = field(default_factory=list)

    def covers(self, ids) -> np.ndarray:
        """bool, the shape of ``ids``: True where the id is an edited row."""
        a = np.asarray(ids, dtype=np.int64)
        hit = np.isin(a, self.rows)
        for lo, hi in self.ranges:
            hit |= (a >= lo) & (a < hi)
        return hit

    @property
    def n_rows(self) -> int:
        return len(self.rows) + sum(hi - lo for lo, hi in self.ranges)

    def apply(self, ids: np.ndarray, w: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows ``w, s`` read for sorted unique ``ids`` with the edits put in (copies; bytes views)."""
        wb, sb = w.view(torch.uint8).clone(), s.view(torch.uint8).clone()
        if len(self.rows):
            at = np.minimum(np.searchsorted(self.rows, ids), len(self.rows) - 1)
            hit = np.flatnonzero(self.rows[at] == ids)
            if len(hit):
                src = torch.from_numpy(at[hit])
                dst = torch.from_numpy(hit)
                wb[dst] = self.weight.view(torch.uint8)[src].to(wb.device)
                sb[dst] = self.scale.view(torch.uint8)[src].to(sb.device)
        for lo, hi in self.ranges:
            dst = torch.from_numpy(np.flatnonzero((ids >= lo) & (ids < hi)))
            wb[dst], sb[dst] = 0, E8M0_ONE
        return wb.view(torch.float8_e4m3fn), sb.view(torch.float8_e8m0fnu)


def _check_row(table: EngramTable, row: int, what: str) -> int:
    if isinstance(row, bool) or not isinstance(row, (int, np.integer)):
        raise RowEditError(f"{what} must be an int row id of {table.label}, got {type(row).__name__} {row!r}")
    if not 0 <= int(row) < table.num_rows:
        raise RowEditError(f"{what} {row} out of range for {table.label}: expected 0..{table.num_rows - 1}")
    return int(row)


def _spec_bits(table: EngramTable, row: int, spec, stored) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight e4m3 [D], scale e8m0 [D/32])`` of one spec; ``stored(r)`` reads the unedited row."""
    d, nb = table.head_dim, table.head_dim // FP8_BLOCK_SIZE
    if isinstance(spec, str):
        if spec != ZERO:
            raise RowEditError(f"edit of row {row}: spec {spec!r} unknown; expected 'zero', a row id or a row")
        return torch.zeros(d, dtype=torch.uint8).view(torch.float8_e4m3fn), torch.full(
            (nb,), E8M0_ONE, dtype=torch.uint8
        ).view(torch.float8_e8m0fnu)
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return stored(_check_row(table, spec, f"edit of row {row}: source row"))
    if isinstance(spec, tuple) and len(spec) == 2:
        w, s = spec
        if w.dtype != torch.float8_e4m3fn or s.dtype != torch.float8_e8m0fnu or w.shape != (d,) or s.shape != (nb,):
            raise RowEditError(
                f"edit of row {row}: stored bits must be (e4m3 [{d}], e8m0 [{nb}]), "
                f"got ({w.dtype} {list(w.shape)}, {s.dtype} {list(s.shape)})"
            )
        return w.cpu(), s.cpu()
    t = torch.as_tensor(spec)
    if not t.is_floating_point() or t.shape != (d,) or not bool(torch.isfinite(t).all()):
        raise RowEditError(
            f"edit of row {row}: a new row must be a finite float tensor [{d}], got {t.dtype} {list(t.shape)}"
        )
    w, s = fp8.quantize_rows(t.detach().float().cpu().reshape(1, d))
    return w[0], s[0]


def resolve_edits(table: EngramTable, edits) -> RowOverlay:
    """The :class:`RowOverlay` of ``edits`` (see the module docstring) on ``table``."""
    if not isinstance(table, EngramTable):
        raise RowEditError(f"edits need an fp8 EngramTable (in memory, lazy or procedural), got {type(table).__name__}")
    if isinstance(edits, range):
        if edits.step != 1 or (len(edits) and (edits.start < 0 or edits.stop > table.num_rows)):
            raise RowEditError(
                f"a zeroed range must have step 1 inside 0..{table.num_rows - 1} of {table.label}, got {edits}"
            )
        ranges = [(edits.start, edits.stop)] if len(edits) else []
        return RowOverlay(np.empty(0, np.int64), *_stack([], table), ranges=ranges)
    if not isinstance(edits, Mapping):
        edits = dict.fromkeys((int(r) for r in np.asarray(edits, dtype=np.int64).reshape(-1)), ZERO)
    rows = sorted(_check_row(table, r, "edited row") for r in edits)

    def stored(r: int) -> tuple[torch.Tensor, torch.Tensor]:
        w, s = table.gather_fp8(torch.tensor([r]))
        return w[0].cpu(), s[0].cpu()

    bits = [_spec_bits(table, r, edits[r], stored) for r in rows]
    return RowOverlay(np.asarray(rows, dtype=np.int64), *_stack(bits, table))


def _stack(bits: list, table: EngramTable) -> tuple[torch.Tensor, torch.Tensor]:
    if not bits:
        d = table.head_dim
        return (
            torch.empty(0, d, dtype=torch.uint8).view(torch.float8_e4m3fn),
            torch.empty(0, d // FP8_BLOCK_SIZE, dtype=torch.uint8).view(torch.float8_e8m0fnu),
        )
    return (
        torch.stack([w.view(torch.uint8) for w, _ in bits]).view(torch.float8_e4m3fn),
        torch.stack([s.view(torch.uint8) for _, s in bits]).view(torch.float8_e8m0fnu),
    )


@contextmanager
def edit_rows(table: EngramTable, edits) -> Iterator[RowOverlay]:
    """Within the block, gathers of ``table`` return the edited rows (module docstring); yields
    the :class:`RowOverlay`. Nothing is written; on exit the table reads as stored again."""
    overlay = resolve_edits(table, edits)
    had_own = "_gather_unique" in vars(table)
    previous = table._gather_unique

    def gather(ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w, s = previous(ids)
        return overlay.apply(np.asarray(ids, dtype=np.int64), w, s)

    table._gather_unique = gather
    try:
        yield overlay
    finally:
        if had_own:
            table._gather_unique = previous
        else:
            del table._gather_unique


@contextmanager
def edit_tables(tables: Mapping[int, EngramTable], edits: Mapping[int, object]) -> Iterator[dict[int, RowOverlay]]:
    """Edits of several layers at once: ``tables`` {layer: table}, ``edits`` {layer: edits of
    :func:`edit_rows`}; yields {layer: RowOverlay}."""
    unknown = sorted(set(edits) - set(tables))
    if unknown:
        raise RowEditError(f"edits name layers {unknown}; the model's Engram layers are {sorted(tables)}")
    with ExitStack() as stack:
        yield {layer: stack.enter_context(edit_rows(tables[layer], e)) for layer, e in edits.items()}
