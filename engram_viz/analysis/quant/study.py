"""The quantisation study: every candidate table against the reference fp8 table, over a prompt set.

``quant_study(model, prompts, candidates, counts)`` runs the tiny LM once per prompt on its own
tables (the reference) and once per prompt and candidate (``candidates.py``), compares them
(``measure.py``) and returns a :class:`QuantStudy` of tidy frames:

- ``summary``: one row per candidate: bits per weight, the size of one V4.1-Flash table stored
  so (GB), the relative row error, key and value error, gate change (mean over streams and
  positions; p99 and max of the largest change per position), streams moved by more than 0.05
  and crossing 0.5, output change, next-token loss (reference and candidate) and KL;
- ``columns``: the relative row error per candidate, layer, order and head;
- ``by_category`` and ``by_group``: the loss, KL and gate statistics per prompt category and per
  read-count group (``analysis.gates.gate_memory``: how often the model read the 3-gram ending at
  a position in training: often / seldom / never, random-token controls apart);
- ``positions``: one row per candidate, prompt, layer and text position.

Loss and KL are counted once per position (the first layer's rows carry them for all layers).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.gates.gate_memory import memory_group, sequence_counts
from engram_viz.analysis.quant.candidates import FP8_BITS, Candidate, candidate, using_candidate
from engram_viz.analysis.quant.measure import capture_prompt, compare
from engram_viz.run.prompts import Prompt, build_prompt

GATE_STATS = {
    "gate_change_mean": ("gate_change_mean", "mean"),
    "gate_change_p99": ("gate_change", lambda s: float(np.percentile(s, 99)) if len(s) else np.nan),
    "gate_change_max": ("gate_change", "max"),
    "streams_moved": ("streams_moved", "sum"),
    "streams_crossed": ("streams_crossed", "sum"),
}
LOSS_STATS = {"loss_ref": ("loss_ref", "mean"), "loss": ("loss", "mean"), "kl": ("kl", "mean")}


@dataclass
class QuantStudy:
    summary: pd.DataFrame
    columns: pd.DataFrame
    by_category: pd.DataFrame
    by_group: pd.DataFrame
    positions: pd.DataFrame

    def tables(self) -> dict[str, pd.DataFrame]:
        """The tidy tables by file name (``quant_summary``, ...)."""
        return {
            "quant_summary": self.summary,
            "quant_row_error": self.columns,
            "quant_by_category": self.by_category,
            "quant_by_group": self.by_group,
        }


def _inputs(model: Any, prompts: Sequence[Prompt], counts: NgramCounts | None) -> list[dict]:
    tok = model.token_map
    out = []
    for p in prompts:
        built = build_prompt(p, config=model.config)
        text = np.asarray(built.token_mask, dtype=bool)
        if counts is not None:
            cnt = sequence_counts(tok[built.input_ids], text, counts, order=3)
            group = memory_group(cnt, np.full(len(cnt), p.category))
        else:
            group = np.full(len(text), "all", dtype=object)
        out.append({"prompt": p, "ids": built.input_ids, "text": text, "group": group})
    return out


def _aggregate(positions: pd.DataFrame, by: list[str], first_layer: int) -> pd.DataFrame:
    gates = positions.groupby(by, sort=False).agg(**GATE_STATS)
    once = positions[positions["layer"] == first_layer]
    losses = once.groupby(by, sort=False).agg(**LOSS_STATS, positions=("loss", "size"))
    out = gates.join(losses).reset_index()
    out["delta_loss"] = out["loss"] - out["loss_ref"]
    return out


def _summary(cands: list[Candidate], positions: pd.DataFrame, columns: pd.DataFrame, first: int) -> pd.DataFrame:
    base = _aggregate(positions, ["candidate"], first)
    rows = columns.groupby("candidate", sort=False)[["sq_err", "sq_ref"]].sum()
    extra = positions.groupby("candidate", sort=False).agg(
        key_error=("key_error", "mean"), value_error=("value_error", "mean"), out_change=("out_change", "mean")
    )
    meta = pd.DataFrame(
        {"bits_per_weight": [c.bits_per_weight for c in cands], "table_gb": [c.table_gb for c in cands]},
        index=pd.Index([c.name for c in cands], name="candidate"),
    )
    meta["row_error"] = np.sqrt(rows["sq_err"] / rows["sq_ref"])
    out = meta.join(extra).reset_index().merge(base, on="candidate")
    n_streams = positions.groupby("candidate", sort=False)["layer"].size().to_numpy()
    out["moved_fraction"] = out["streams_moved"] / (n_streams * int(positions.attrs.get("hc", 1)))
    return out


def reference_row(cands: list[Candidate]) -> dict:
    """What the reference itself costs: nothing (its bits per weight and table size, for the figure)."""
    return {
        "candidate": "fp8 (reference)",
        "bits_per_weight": FP8_BITS,
        "table_gb": Candidate("", FP8_BITS, None).table_gb,
    }


def quant_study(
    model: Any, prompts: Sequence[Prompt], candidates: Sequence[str | Path], counts: NgramCounts | None = None
) -> QuantStudy:
    """Run the study (module docstring) for ``model`` (a TinyEngramLM with its reference tables)."""
    layers = [int(k) for k in model.engrams]
    reference = {int(k): e.table for k, e in model.engrams.items()}
    inputs = _inputs(model, prompts, counts)
    refs = [capture_prompt(model, x["ids"], x["text"]) for x in inputs]
    cands = [candidate(c, reference) for c in candidates]
    col_rows, frames = [], []
    for cand in cands:
        with using_candidate(model.engrams, cand):
            for x, ref in zip(inputs, refs):
                cols, frame = compare(
                    ref, capture_prompt(model, x["ids"], x["text"]), layers, x["text"], model.config.engram_n_heads
                )
                col_rows += [c | {"candidate": cand.name} for c in cols]
                p = x["prompt"]
                frame.insert(0, "candidate", cand.name)
                frame.insert(1, "prompt", p.id)
                frame.insert(2, "category", p.category)
                frame["group"] = np.tile(x["group"][x["text"]], len(layers))
                frames.append(frame)
    positions = pd.concat(frames, ignore_index=True)
    positions.attrs["hc"] = model.config.hc_mult
    columns = pd.DataFrame(col_rows)
    by_col = columns.groupby(["candidate", "layer", "order", "head"], sort=False)[["sq_err", "sq_ref"]].sum()
    row_error = np.sqrt(by_col["sq_err"] / by_col["sq_ref"]).rename("row_error").reset_index()
    return QuantStudy(
        summary=_summary(cands, positions, columns, layers[0]),
        columns=row_error,
        by_category=_aggregate(positions, ["candidate", "category"], layers[0]),
        by_group=_aggregate(positions, ["candidate", "group"], layers[0]),
        positions=positions,
    )
