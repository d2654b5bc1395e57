"""Reading the tidy frames the capture layer writes: checks, selections and per-position tables.

Frames (one row per observation):

- gates: prompt, position, token, is_image, layer, stream, gate [+ exposure, category]
- rows: prompt, position, layer, order, head, row
- usage: layer, row, hits
- coverage: layer, order, head, prime, rows_touched, coverage (``RowUsage.coverage()``)
- collisions: layer, order, head, prime, distinct_ngrams, occupied, shared_buckets, expected_occupied,
  expected_shared_buckets (``CollisionStats.columns()``)
- heads_shared: layer, order, heads_shared, ngrams, expected_ngrams (``CollisionStats.heads_shared()``)

The names are the library's own (``Trace.to_frame``, ``engram_viz.analysis``), so its frames go
straight into the plots; frames may carry more columns than these.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd

from engram_viz.errors import FrameError, InputTypeError

GATE_COLUMNS = ("prompt", "position", "token", "is_image", "layer", "stream", "gate")
ROW_COLUMNS = ("prompt", "position", "layer", "order", "head", "row")
USAGE_COLUMNS = ("layer", "row", "hits")
COVERAGE_COLUMNS = ("layer", "order", "head", "prime", "rows_touched", "coverage")
COLLISION_COLUMNS = (
    "layer",
    "order",
    "head",
    "prime",
    "distinct_ngrams",
    "occupied",
    "shared_buckets",
    "expected_occupied",
    "expected_shared_buckets",
)
HEADS_SHARED_COLUMNS = ("layer", "order", "heads_shared", "ngrams", "expected_ngrams")


def require_columns(frame: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    """Raise a ValueError naming the frame and its missing columns (TypeError if not a frame)."""
    if not isinstance(frame, pd.DataFrame):
        raise InputTypeError(f"the {what} frame must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in columns if c not in frame.columns]
    if missing:
        raise FrameError(f"the {what} frame lacks column(s) {missing}; it has {list(frame.columns)}")
    if frame.empty:
        raise FrameError(f"the {what} frame is empty")


def _shown(values: Sequence) -> str:
    return ", ".join(repr(v) for v in list(values)[:5]) + (", ..." if len(values) > 5 else "")


def pick_one(frame: pd.DataFrame, column: str, value, what: str):
    """``value`` if present in ``frame[column]``; the only value there if None; else a clear error."""
    values = list(pd.unique(frame[column]))
    if value is None:
        if len(values) != 1:
            raise FrameError(
                f"the {what} frame holds {len(values)} values of {column!r} ({_shown(values)}); pass {column}="
            )
        return values[0]
    if value not in values:
        raise FrameError(f"{column} {value!r} is not in the {what} frame; expected one of: {_shown(values)}")
    return value


def pick_prompts(frame: pd.DataFrame, prompts: str | Sequence[str] | None, what: str) -> list:
    """Prompts to draw in the order given (all of the frame's, in order of appearance, when None)."""
    present = list(pd.unique(frame["prompt"]))
    if prompts is None:
        return present
    wanted = [prompts] if isinstance(prompts, str) else list(prompts)
    unknown = [p for p in wanted if p not in present]
    if unknown or not wanted:
        raise FrameError(
            f"prompt(s) {unknown or wanted!r} not in the {what} frame; expected some of: {_shown(present)}"
        )
    return wanted


def pick_layers(frame: pd.DataFrame, layer: int | Sequence[int] | None, what: str) -> list[int]:
    """Layers to draw: all of the frame's (sorted) when None, else those asked for (checked)."""
    present = sorted(int(v) for v in pd.unique(frame["layer"]))
    if layer is None:
        return present
    wanted = [int(layer)] if np.isscalar(layer) else [int(v) for v in layer]
    unknown = [v for v in wanted if v not in present]
    if unknown or not wanted:
        raise FrameError(f"layer(s) {unknown or wanted} not in the {what} frame; expected some of {present}")
    return wanted


def gate_table(gates: pd.DataFrame, prompt, layer: int) -> pd.DataFrame:
    """One row per position of ``prompt`` at ``layer``: token, is_image, [exposure], and one column
    per stream (``0..hc_mult-1``) holding that stream's gate. Sorted by position."""
    sub = gates[(gates["prompt"] == prompt) & (gates["layer"] == layer)]
    if sub.empty:
        raise FrameError(f"the gates frame has no rows for prompt {prompt!r} at layer {layer}")
    dup = sub.duplicated(["position", "stream"])
    if dup.any():
        pos, stream = sub.loc[dup, ["position", "stream"]].iloc[0]
        raise FrameError(
            f"the gates frame repeats (prompt {prompt!r}, layer {layer}, position {pos}, stream {stream}); "
            "expected one gate per (prompt, position, layer, stream)"
        )
    wide = sub.pivot(index="position", columns="stream", values="gate").sort_index(axis=1)
    keep = [c for c in ("token", "is_image", "exposure") if c in sub.columns]
    meta = sub.groupby("position", sort=True)[keep].first()
    meta["is_image"] = meta["is_image"].astype(bool)
    meta["token"] = meta["token"].astype(str)
    return meta.join(wide).sort_index()


def stream_columns(table: pd.DataFrame) -> list:
    """The stream columns of a ``gate_table`` (the integer-named ones)."""
    return [c for c in table.columns if isinstance(c, (int, np.integer))]


def reduce_streams(table: pd.DataFrame, stream: int | str) -> np.ndarray:
    """float ``[T]``: one stream's gate, or their 'mean' / 'max' / 'min', per position."""
    streams = stream_columns(table)
    values = table[streams].to_numpy(dtype=float)
    if isinstance(stream, str):
        ops = {"mean": np.mean, "max": np.max, "min": np.min}
        if stream not in ops:
            raise FrameError(f"stream {stream!r} is unknown; expected an int in {streams} or one of {sorted(ops)}")
        return ops[stream](values, axis=1)
    if stream not in streams:
        raise FrameError(
            f"stream {stream!r} is not in the gates frame; expected one of {streams} or 'mean'/'max'/'min'"
        )
    return values[:, streams.index(stream)]


def row_ids_text(rows: pd.DataFrame | None, prompt, layer: int, sep: str = "\n") -> dict[int, str]:
    """position -> the 24 row ids of that position at ``layer``, one line per n-gram order."""
    if rows is None:
        return {}
    require_columns(rows, ROW_COLUMNS, "rows")
    sub = rows[(rows["prompt"] == prompt) & (rows["layer"] == layer)].sort_values(["position", "order", "head"])
    out: dict[int, str] = {}
    for position, at in sub.groupby("position", sort=False):
        lines = [
            f"{order}-gram rows " + " ".join(str(int(r)) for r in grp["row"])
            for order, grp in at.groupby("order", sort=True)
        ]
        out[int(position)] = sep.join(lines)
    return out


def as_usage_frame(usage) -> pd.DataFrame:
    """A usage frame (layer, row, hits) from a frame, or from an accumulator with ``row_hits(layer)``
    and ``layout.layer_ids`` (e.g. ``engram_viz.analysis.row_stats.usage.RowUsage``)."""
    if isinstance(usage, pd.DataFrame):
        return usage
    if hasattr(usage, "row_hits") and hasattr(getattr(usage, "layout", None), "layer_ids"):
        parts = []
        for layer in usage.layout.layer_ids:
            rows, hits = usage.row_hits(layer)
            parts.append(pd.DataFrame({"layer": layer, "row": np.asarray(rows, np.int64), "hits": np.asarray(hits)}))
        return pd.concat(parts, ignore_index=True)
    raise InputTypeError(f"usage must be a DataFrame (layer, row, hits) or a RowUsage, got {type(usage).__name__}")
