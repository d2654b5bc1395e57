"""Gate statistics per prompt category: the report's gate tables, over text positions only.

Both functions take the tidy gates frame of a Trace (``Trace.to_frames()["gates"]``: one row per
(prompt, position, layer, stream) with columns ``category``, ``position``, ``is_image``, ``layer``,
``stream``, ``gate``). Image positions are left out: their gate is 0 by construction.
"""

from __future__ import annotations

import pandas as pd


def gate_overview(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean gate per (category, layer), one column per stream and one over all streams (text positions).

    Columns: ``category``, ``layer``, ``positions`` (text positions of that category), ``stream {s}``
    for each stream s, ``all streams``; one row per (category, layer).
    """
    text = gates[~gates["is_image"]]
    piv = text.pivot_table(index=["category", "layer"], columns="stream", values="gate", aggfunc="mean")
    piv.columns = [f"stream {c}" for c in piv.columns]
    piv["all streams"] = text.groupby(["category", "layer"])["gate"].mean()
    piv.insert(0, "positions", text.groupby(["category", "layer"])["position"].size() // text["stream"].nunique())
    return piv.reset_index()


def gate_summary(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean, median and spread of gates per (category, layer, stream) over text positions.

    Columns: ``category``, ``layer``, ``stream``, ``positions``, ``mean``, ``median``, ``std``,
    ``min``, ``max``.
    """
    text = gates[~gates["is_image"]]
    g = text.groupby(["category", "layer", "stream"], sort=True)["gate"]
    out = g.agg(["count", "mean", "median", "std", "min", "max"]).reset_index()
    return out.rename(columns={"count": "positions"})
