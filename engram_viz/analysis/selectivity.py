"""Stream selectivity: which residual stream's gate separates multi-token patterns from controls."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

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
            raise ValueError(f"the gates frame has no column {label!r}; it has {list(text.columns)}")
        flag = text[label]
        pos, neg = text[flag.eq(True)], text[flag.eq(False)]
        what = f"{label} True and False"
    else:
        pos = text[text["category"].isin(patterns)]
        neg = text[text["category"].isin(controls)]
        what = f"both {list(patterns)} and {list(controls)} prompts"
    if pos.empty or neg.empty:
        raise ValueError(
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
