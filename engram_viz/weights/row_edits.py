"""Counterfactual row edits: an overlay on any Engram table, in memory, never on disk.

``with edit_rows(table, {row: spec, ...}):`` makes every gather of ``table`` (an
:class:`~engram_viz.weights.tables.EngramTable`: in memory, lazy or procedural) return the edited
rows; on exit the table is what it was. The checkpoint is never written. A spec is

- ``"zero"``: the row dequantises to zeros (weight 0, scale 1): the memory is ablated;
- an ``int``: the stored bits of that other row, as the table reads it when this edit is entered
  (open edits included); the bits are copied then, so later edits of the source row do not follow;
- a float tensor ``[head_dim]`` (any float dtype, finite once converted to float32): a new row,
  quantised as the table stores rows (``table._encode``; fp8: e4m3 with one e8m0 scale per 32
  features; a GGUF table: its own block type, through gguf's quantiser);
- a pair ``(weight e4m3 [head_dim], scale e8m0 [head_dim / 32])``: the stored bits themselves,
  finite by the checkpoint's own rule (``nonfinite.py``: no e4m3 byte 0x7F/0xFF, no e8m0 0xFF);
  fp8 tables only.

Instead of a mapping, ``edits`` may be a ``range`` (step 1) or row ids (an int, a list, tuple or
set of ints, an integer array or tensor of any shape): all zeroed. Row ids are ints (Python or
NumPy/torch integer dtypes) inside the table, whichever form: a float, bool or string id is refused,
never truncated or parsed. A ``range`` costs nothing however long (a whole column of the real table
is 16 M rows), so one head's rows of a layer are ``range(offset, offset + prime)``
(``analysis.edit_targets.head_rows``). Every bad spec is a :class:`RowEditError` naming the table,
the row, what was expected and what came.

How: the overlay wraps the table's ``_gather_unique`` (the one place every backing reads rows), so
``gather_fp8`` and the bf16 lookup ``table(ids)`` both see it; rows that are not edited come back
bit for bit as stored. :meth:`RowOverlay.covers` says which ids an edit touches (the run layer
uses it to mark positions that read an edited row).

Several edits of one table: the table keeps the list of its open edits in the order they were
entered, and a read applies them in that order (the one entered last wins on a row several edit).
Leaving an edit removes it from the list wherever it is, so edits may be left in any order (an
outer block before an inner one, an ``ExitStack`` unwound out of order): while some are open the
table reads as stored with the still-open edits applied in entry order, and once the last one is
left the table's own gather is put back exactly as it was found.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

from engram_viz.config import FP8_BLOCK_SIZE
from engram_viz.errors import RowEditError
from engram_viz.weights.nonfinite import NONFINITE_MASK, describe, rows_text
from engram_viz.weights.tables import EngramTable

ZERO = "zero"
EXPECTED_EDITS = "a mapping {row: spec}, a range or int row ids (an int, a list/tuple/set, an integer array)"
EXPECTED_SPEC = "'zero', an int source row, a float row tensor or a pair (e4m3 weight, e8m0 scale)"
STACK_ATTR = "_row_edit_stack"  # the open edits of a table, in its instance dict while any is open


@dataclass
class RowOverlay:
    """Resolved edits of one table: ``rows`` sorted int64 ``[E]`` with their stored bits ``weight``
    e4m3 ``[E, head_dim]`` and ``scale`` e8m0 ``[E, head_dim / 32]``, plus zeroed ``ranges``
    ``[(lo, hi)]`` (half open)."""

    rows: np.ndarray
    weight: torch.Tensor
    scale: torch.Tensor
    ranges: list[tuple[int, int]] = field(default_factory=list)
    zero: tuple[torch.Tensor, torch.Tensor] | None = None  # one zero row's parts, for ``ranges``

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
            if self.zero is not None and len(dst):
                wb[dst] = self.zero[0].view(torch.uint8)[0].to(wb.device)
                sb[dst] = self.zero[1].view(torch.uint8)[0].to(sb.device)
        return wb.view(w.dtype), sb.view(s.dtype)


def _shown(x) -> str:
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _is_int(x) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def _check_row(table: EngramTable, row, what: str) -> int:
    if not _is_int(row):
        raise RowEditError(f"{what} must be an int row id of {table.label}, got {type(row).__name__} {_shown(row)}")
    if not 0 <= int(row) < table.num_rows:
        raise RowEditError(f"{what} {row} out of range for {table.label}: expected 0..{table.num_rows - 1}")
    return int(row)


def _in_range(table: EngramTable, a: np.ndarray) -> np.ndarray:
    """Integer array ``a`` (any integer dtype) as sorted unique int64 ids, every one inside ``table``."""
    bad = a[(a < 0) | (a >= table.num_rows)] if a.dtype.kind == "i" else a[a >= table.num_rows]
    if bad.size:
        raise RowEditError(
            f"edited rows {rows_text(bad.tolist())} out of range for {table.label}: expected 0..{table.num_rows - 1}"
        )
    return np.unique(a.astype(np.int64))


def _zeroed_rows(table: EngramTable, edits) -> np.ndarray:
    """Row ids ``edits`` (the array form, see the module docstring) as sorted unique int64."""
    if _is_int(edits):
        return np.asarray([_check_row(table, edits, "edited row")], dtype=np.int64)
    if isinstance(edits, torch.Tensor):
        if edits.is_floating_point() or edits.is_complex() or edits.dtype == torch.bool:
            raise RowEditError(f"edited row ids of {table.label} must be integers, got a {edits.dtype} tensor")
        try:  # every integer dtype numpy has (uint64 ids past int64 are named as they are)
            a = edits.detach().cpu().numpy()
        except TypeError:
            a = edits.detach().cpu().to(torch.int64).numpy()
        return _in_range(table, a.reshape(-1))
    if isinstance(edits, np.ndarray) and edits.dtype.kind in "iu":
        return _in_range(table, edits.reshape(-1))
    if isinstance(edits, np.ndarray) and edits.dtype.kind != "O":
        raise RowEditError(f"edited row ids of {table.label} must be integers, got a {edits.dtype} array")
    if edits is None or isinstance(edits, (str, bytes)) or not isinstance(edits, (Iterable, np.ndarray)):
        raise RowEditError(f"edits of {table.label} must be {EXPECTED_EDITS}, got {type(edits).__name__}")
    flat = []
    for x in edits.reshape(-1) if isinstance(edits, np.ndarray) else edits:
        if isinstance(x, (np.ndarray, torch.Tensor, list, tuple)):
            flat.extend(_zeroed_rows(table, x).tolist())  # nested lists / arrays: ids of any shape
        else:
            flat.append(_check_row(table, x, "edited row"))
    return np.unique(np.asarray(flat, dtype=np.int64))


def _zero_bits(n: int, table: EngramTable) -> tuple[torch.Tensor, torch.Tensor]:
    return table._zero_parts(n)


def _nonfinite_at(t: torch.Tensor) -> np.ndarray:
    """Features of a 1-D CPU tensor that are non-finite by ``nonfinite.NONFINITE_MASK``."""
    view, mask = NONFINITE_MASK[t.dtype]
    elems = t.contiguous().view(torch.uint8).numpy().view(view)
    return np.flatnonzero((elems & view(mask)) == mask)


def _features_text(at: np.ndarray) -> str:
    shown = ", ".join(str(int(i)) for i in at[:8])
    return f"[{shown}]" if len(at) <= 8 else f"[{shown}, ...] ({len(at)} of them)"


def _pair_bits(table: EngramTable, row: int, spec: tuple) -> tuple[torch.Tensor, torch.Tensor]:
    d, nb = table.head_dim, table.head_dim // FP8_BLOCK_SIZE
    w, s = spec
    if table.stored_format != "fp8":
        raise RowEditError(
            f"edit of row {row} of {table.label}: a pair of stored fp8 bits fits fp8 tables only; this table "
            f"stores {table.stored_format}: give 'zero', a source row or a float row tensor [{d}]"
        )
    want = f"a pair of stored bits (e4m3 tensor [{d}], e8m0 tensor [{nb}])"
    if not isinstance(w, torch.Tensor) or not isinstance(s, torch.Tensor):
        raise RowEditError(
            f"edit of row {row} of {table.label}: expected {want}, got ({type(w).__name__}, {type(s).__name__})"
        )
    if w.dtype != torch.float8_e4m3fn or s.dtype != torch.float8_e8m0fnu or w.shape != (d,) or s.shape != (nb,):
        raise RowEditError(
            f"edit of row {row} of {table.label}: expected {want}, "
            f"got ({w.dtype} {list(w.shape)}, {s.dtype} {list(s.shape)})"
        )
    w, s = w.detach().cpu(), s.detach().cpu()
    for t, what in ((w, "weight"), (s, "scale")):
        bad = _nonfinite_at(t)
        if len(bad):
            raise RowEditError(
                f"edit of row {row} of {table.label}: stored {what} bits are non-finite ({describe(t.dtype)}) "
                f"at features {_features_text(bad)}; expected finite bits, as the checkpoint stores them"
            )
    return w, s


def _as_float_tensor(spec) -> torch.Tensor | None:
    """A non-tensor row spec (a list, a NumPy array) as a tensor of its own float dtype (a list of
    Python floats stays float64, so a value past float32's range is named as such); None if it is
    not an array of floats."""
    try:
        a = np.asarray(spec)
    except (TypeError, ValueError, OverflowError):
        return None
    if a.dtype.kind != "f":
        return None
    if a.dtype not in (np.float16, np.float32, np.float64):
        a = a.astype(np.float64)
    return torch.from_numpy(np.ascontiguousarray(a))


def _new_row_bits(table: EngramTable, row: int, spec) -> tuple[torch.Tensor, torch.Tensor]:
    d = table.head_dim
    want = f"a finite float tensor [{d}] (finite once converted to float32)"
    t = spec if isinstance(spec, torch.Tensor) else _as_float_tensor(spec)
    if t is None:
        raise RowEditError(
            f"edit of row {row} of {table.label}: spec must be {EXPECTED_SPEC}, got {type(spec).__name__} {_shown(spec)}"
        )
    if not t.is_floating_point() or t.shape != (d,):
        raise RowEditError(
            f"edit of row {row} of {table.label}: a new row must be {want}, got {t.dtype} {list(t.shape)}"
        )
    x = t.detach().cpu().float()
    bad = _nonfinite_at(x)
    if len(bad):
        overflow = t.dtype == torch.float64 and bool(torch.isfinite(t.detach().cpu()[bad]).all())
        why = "values beyond float32's range (+-3.4e38)" if overflow else "NaN or Inf"
        raise RowEditError(
            f"edit of row {row} of {table.label}: a new row must be {want}, got {t.dtype} with {why} "
            f"at features {_features_text(bad)}"
        )
    w, s = table._encode(x.reshape(1, d))
    return w[0], s[0]


def _spec_bits(table: EngramTable, row: int, spec, stored) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight e4m3 [D], scale e8m0 [D/32])`` of one spec; ``stored(r)`` reads the row as the table reads it now."""
    if isinstance(spec, str):
        if spec != ZERO:
            raise RowEditError(f"edit of row {row} of {table.label}: spec {spec!r} unknown; expected {EXPECTED_SPEC}")
        w, s = _zero_bits(1, table)
        return w[0], s[0]
    if _is_int(spec):
        return stored(_check_row(table, spec, f"edit of row {row}: source row"))
    if isinstance(spec, tuple) and len(spec) == 2:
        return _pair_bits(table, row, spec)
    return _new_row_bits(table, row, spec)


def resolve_edits(table: EngramTable, edits) -> RowOverlay:
    """The :class:`RowOverlay` of ``edits`` (see the module docstring) on ``table``."""
    if not isinstance(table, EngramTable):
        raise RowEditError(
            f"edits need an EngramTable (in memory, lazy, procedural or GGUF), got {type(table).__name__}"
        )
    if isinstance(edits, range):
        if edits.step != 1 or (len(edits) and (edits.start < 0 or edits.stop > table.num_rows)):
            raise RowEditError(
                f"a zeroed range must have step 1 inside 0..{table.num_rows - 1} of {table.label}, got {edits}"
            )
        ranges = [(edits.start, edits.stop)] if len(edits) else []
        return RowOverlay(np.empty(0, np.int64), *_zero_bits(0, table), ranges=ranges, zero=_zero_bits(1, table))
    if not isinstance(edits, Mapping):
        rows = _zeroed_rows(table, edits)
        return RowOverlay(rows, *_zero_bits(len(rows), table))
    rows = sorted(_check_row(table, r, "edited row") for r in edits)
    if len(set(rows)) != len(rows):
        raise RowEditError(f"edits of {table.label} name a row twice (as keys of different types): {rows}")

    def stored(r: int) -> tuple[torch.Tensor, torch.Tensor]:
        w, s = table.gather_stored(torch.tensor([r]))
        return w[0].cpu(), s[0].cpu()

    by_row = {int(r): spec for r, spec in edits.items()}
    bits = [_spec_bits(table, r, by_row[r], stored) for r in rows]
    return RowOverlay(np.asarray(rows, dtype=np.int64), *_stack(bits, table))


def _stack(bits: list, table: EngramTable) -> tuple[torch.Tensor, torch.Tensor]:
    if not bits:
        return _zero_bits(0, table)
    return (
        torch.stack([w.view(torch.uint8) for w, _ in bits]).view(bits[0][0].dtype),
        torch.stack([s.view(torch.uint8) for _, s in bits]).view(bits[0][1].dtype),
    )


class _EditStack:
    """The open edits of one table in entry order, and the table's own gather as it was found."""

    def __init__(self, table: EngramTable):
        self.had_own = "_gather_unique" in vars(table)
        self.found = table._gather_unique
        self.overlays: list[RowOverlay] = []

    def gather(self, ids: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        w, s = self.found(ids)
        ids = np.asarray(ids, dtype=np.int64)
        for overlay in self.overlays:
            w, s = overlay.apply(ids, w, s)
        return w, s


def _push(table: EngramTable, overlay: RowOverlay) -> None:
    stack = vars(table).get(STACK_ATTR)
    if stack is None:
        stack = _EditStack(table)
        setattr(table, STACK_ATTR, stack)
        table._gather_unique = stack.gather
    stack.overlays.append(overlay)


def _pop(table: EngramTable, overlay: RowOverlay) -> None:
    stack: _EditStack = vars(table)[STACK_ATTR]
    stack.overlays = [o for o in stack.overlays if o is not overlay]
    if stack.overlays:
        return
    if stack.had_own:
        table._gather_unique = stack.found
    else:
        del table._gather_unique
    delattr(table, STACK_ATTR)


@contextmanager
def edit_rows(table: EngramTable, edits) -> Iterator[RowOverlay]:
    """Within the block, gathers of ``table`` return the edited rows (module docstring); yields
    the :class:`RowOverlay`. Nothing is written; once every edit of the table is left, in any
    order, the table reads as stored again."""
    overlay = resolve_edits(table, edits)
    _push(table, overlay)
    try:
        yield overlay
    finally:
        _pop(table, overlay)


@contextmanager
def edit_tables(tables: Mapping[int, EngramTable], edits: Mapping[int, object]) -> Iterator[dict[int, RowOverlay]]:
    """Edits of several layers at once: ``tables`` {layer: table}, ``edits`` {layer: edits of
    :func:`edit_rows`}; yields {layer: RowOverlay}."""
    if not isinstance(edits, Mapping):
        raise RowEditError(f"edits of several layers must be a mapping {{layer: edits}}, got {type(edits).__name__}")
    bad = [k for k in edits if not _is_int(k)]
    if bad:
        raise RowEditError(f"edits name layer {_shown(bad[0])} ({type(bad[0]).__name__}); layers are int ids")
    unknown = sorted(int(k) for k in set(edits) - set(tables))
    if unknown:
        raise RowEditError(f"edits name layers {unknown}; the model's Engram layers are {sorted(tables)}")
    with ExitStack() as stack:
        yield {int(layer): stack.enter_context(edit_rows(tables[layer], e)) for layer, e in edits.items()}
