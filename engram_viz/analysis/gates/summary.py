"""Gate statistics over text positions: the report's gate tables per prompt category, and stream
selectivity (which residual stream's gate separates multi-token patterns from controls).

Each function takes the tidy gates frame of a Trace (``Trace.to_frames()["gates"]``: one row per
(prompt, position, layer, stream) with columns ``category``, ``position``, ``is_image``, ``layer``,
``stream``, ``gate``). Image positions are left out: their gate is 0 by construction.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from engram_viz.errors import FrameError

# These tables summarise text positions only: a prompt category named after what the prompts hold
# besides text is named for the text that is summarised (image positions' gates are 0 and left out).
TEXT_CATEGORY_NAMES = {"image": "text before/after an image"}


def _text_positions(gates: pd.DataFrame) -> pd.DataFrame:
    text = gates[~gates["is_image"]]
    return text.assign(category=text["category"].replace(TEXT_CATEGORY_NAMES)) if "category" in text else text


def gate_overview(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean gate per (category, layer), one column per stream and one over all streams (text positions).

    Columns: ``category``, ``layer``, ``positions`` (text positions of that category), ``stream {s}``
    for each stream s, ``all streams``; one row per (category, layer). Category ``image`` reads
    ``text before/after an image`` (:data:`TEXT_CATEGORY_NAMES`).
    """
    text = _text_positions(gates)
    piv = text.pivot_table(index=["category", "layer"], columns="stream", values="gate", aggfunc="mean")
    piv.columns = [f"stream {c}" for c in piv.columns]
    piv["all streams"] = text.groupby(["category", "layer"])["gate"].mean()
    piv.insert(0, "positions", text.groupby(["category", "layer"])["position"].size() // text["stream"].nunique())
    return piv.reset_index()


def gate_summary(gates: pd.DataFrame) -> pd.DataFrame:
    """Mean, median and spread of gates per (category, layer, stream) over text positions.

    Columns: ``category``, ``layer``, ``stream``, ``positions``, ``mean``, ``median``, ``std``,
    ``min``, ``max``; categories named as in :func:`gate_overview`.
    """
    text = _text_positions(gates)
    g = text.groupby(["category", "layer", "stream"], sort=True)["gate"]
    out = g.agg(["count", "mean", "median", "std", "min", "max"]).reset_index()
    return out.rename(columns={"count": "positions"})


PATTERN_CATEGORIES = ("english_entities", "chinese_entities", "idioms")
CONTROL_CATEGORIES = ("random_token",)


def stream_selectivity(
    gates: pd.DataFrame,
    patterns: Sequence[str] = PATTERN_CATEGORIES,
    controls: Sequence[str] = CONTROL_CATEGORIES,
    *,
    label: str | None = None,
) -> pd.DataFrame:
    """Per (layer, stream): how well the gate separates multi-token-pattern positions from controls.

    Two definitions: by prompt category (default: text positions of the ``patterns`` categories -
    named entities, idioms - against those of the random-token controls), or, with ``label``, by a
    boolean column of the frame (True = pattern, False = control, missing = left out; e.g. from
    ``ngram_frequency``: the n-gram ending at the position is frequent in a corpus vs never seen).

    Returns layer, stream, mean_pattern, mean_control, difference, auc (probability that a random
    pattern position has a higher gate than a random control position; 0.5 = no separation),
    pattern_positions, control_positions and rank (1 = most selective), sorted by auc descending.
    """
    text = gates[~gates["is_image"].astype(bool)]
    if label is not None:
        if label not in text.columns:
            raise FrameError(f"the gates frame has no column {label!r}; it has {list(text.columns)}")
        flag = text[label]
        pos, neg = text[flag.eq(True)], text[flag.eq(False)]
        what = f"{label} True and False"
    else:
        pos = text[text["category"].isin(patterns)]
        neg = text[text["category"].isin(controls)]
        what = f"both {list(patterns)} and {list(controls)} prompts"
    if pos.empty or neg.empty:
        raise FrameError(
            f"stream_selectivity needs text positions of {what}; "
            f"the frame has categories {sorted(pd.unique(gates['category']))}"
        )
    rows = []
    for (layer, stream), p in pos.groupby(["layer", "stream"]):
        n = neg[(neg["layer"] == layer) & (neg["stream"] == stream)]["gate"].to_numpy(dtype=float)
        x = p["gate"].to_numpy(dtype=float)
        ranks = pd.Series(np.concatenate([x, n])).rank().to_numpy()  # Mann-Whitney U via ranks (ties averaged)
        auc = (ranks[: len(x)].sum() - len(x) * (len(x) + 1) / 2) / (len(x) * len(n))
        rows.append(
            {
                "layer": int(layer),
                "stream": int(stream),
                "mean_pattern": float(x.mean()),
                "mean_control": float(n.mean()),
                "difference": float(x.mean() - n.mean()),
                "auc": float(auc),
                "pattern_positions": len(x),
                "control_positions": len(n),
            }
        )
    out = pd.DataFrame(rows).sort_values("auc", ascending=False, ignore_index=True)
    out["rank"] = np.arange(1, len(out) + 1)
    return out
