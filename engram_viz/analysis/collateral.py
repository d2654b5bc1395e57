"""Collateral of an edit: the other n-grams that share an edited row, and how they move.

A row is shared by every n-gram hashed into it (a collision bucket), so editing one memory edits
theirs too. :func:`collateral_ngrams` lists, from a corpus :class:`~engram_viz.analysis.row_index.RowIndex`,
every corpus n-gram in the edited rows; :func:`collateral_reads` takes a re-run
(``run.counterfactual.EditEffect``) and keeps the edited rows read by n-grams other than the edit's
own targets, with the change they saw at that position (gate, value, loss).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from engram_viz.analysis.row_index import RowIndex
from engram_viz.run.counterfactual import EditEffect


def collateral_ngrams(index: RowIndex, rows: dict[int, object], decoder=None) -> pd.DataFrame:
    """Every corpus n-gram kept by ``index`` in the rows ``{layer: rows}``: layer, row, order, head,
    n_ngrams, collision, ngram, count (and text with a ``decoder``), most frequent first per row."""
    parts = [index.row_frame(layer, np.asarray(list(r), dtype=np.int64), decoder) for layer, r in rows.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def collateral_reads(
    effect: EditEffect, own: pd.DataFrame | None = None, own_prompt: str | None = None
) -> pd.DataFrame:
    """Edited rows read at positions that are not the edit's own targets: ``effect.reads`` without
    the (position, layer, order, head) reads of ``own`` (e.g. ``EntityRows.ngrams``) in prompt
    ``own_prompt``, joined with that position's d_gate_max, value_change and (whole models) d_loss."""
    reads = effect.reads
    if own is not None and own_prompt is not None:
        keys = ["position", "layer", "order", "head"]
        mine = own[keys].assign(prompt=own_prompt, _own=True)
        reads = reads.merge(mine, on=["prompt", *keys], how="left")
        reads = reads[reads["_own"].isna()].drop(columns="_own")
    cols = ["prompt", "position", "layer", "token", "d_gate_max", "value_change"]
    out = reads.merge(effect.positions[cols], on=["prompt", "position", "layer"], how="left")
    if effect.loss is not None:
        out = out.merge(effect.loss[["prompt", "position", "d_loss"]], on=["prompt", "position"], how="left")
    return out.reset_index(drop=True)
