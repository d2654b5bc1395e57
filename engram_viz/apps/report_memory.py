"""The report's gate-versus-memory section (the first figure after provenance) for a tiny Engram LM.

Reads the tiny LM's training n-gram counts (``analysis.gate_memory.training_counts``; built from
the Debian sources once, then cached), the Trace's gates and, per position, the loss saved by the
open gates (``tiny.probe.prompt_loss_saved``). Gives the tables ``gate_memory`` (per layer and
memory group), ``gate_count_curve`` (per layer and training-count bin, with the Spearman
correlation), ``loss_by_category`` (mean loss saved per prompt category and memory group),
``memory_targets`` (the three targets per layer, for the trigram) and ``memory_targets_by_order``
(the same for each n-gram order ending at the position: which order's count the gate follows),
and the figure ``gate_vs_memory``. Weights other than a tiny LM have no training text here: nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.analysis.gates.gate_memory import (
    OFTEN,
    gate_count_curve,
    gate_memory_summary,
    memory_targets,
    trace_memory_frame,
    training_counts,
)
from engram_viz.errors import EngramVizError
from engram_viz.run.trace import Trace
from engram_viz.tiny.position_scores import prompt_loss_saved
from engram_viz.viz.memory_plots import gate_vs_memory


def trace_loss_saved(lm: Any, trace: Trace) -> np.ndarray:
    """``[B, T]`` loss saved by the open gates at each position of each prompt (NaN: none)."""
    out = np.full(tuple(trace.input_ids.shape), np.nan)
    for i, n in enumerate(trace.lengths.tolist()):
        mask = trace.token_types[i, :n] < 0
        out[i, :n] = prompt_loss_saved(lm, trace.input_ids[i, :n], mask).numpy()
    return out


def order_targets(trace: Trace, counts: Any, order: int) -> pd.DataFrame:
    """``memory_targets`` with positions grouped by the training count of their ``order``-gram, with
    a leading ``order`` column."""
    frame = trace_memory_frame(trace, counts, order=order)
    _, rho = gate_count_curve(frame)
    targets = memory_targets(gate_memory_summary(frame), rho)
    targets.insert(0, "order", order)
    return targets


def memory_section(
    trace: Trace, lm: Any, theme: str, say: Callable[[str], None]
) -> tuple[dict[str, pd.DataFrame], dict[str, tuple]]:
    """``(tables, figure specs)`` of the section; empty when ``lm`` is None or its training text
    is not installed (said through ``say``)."""
    if lm is None:
        return {}, {}
    try:
        counts = training_counts(lm.config, lm.provenance)
    except EngramVizError as err:
        say(f"gate-versus-memory section left out: {err}")
        return {}, {}
    frame = trace_memory_frame(trace, counts, loss_saved=trace_loss_saved(lm, trace))
    summary = gate_memory_summary(frame)
    curve, rho = gate_count_curve(frame)
    curve["spearman"] = curve["layer"].map(rho)
    by_cat = frame.groupby(["category", "group"]).agg(positions=("gate", "size"), loss_saved=("loss_saved", "mean"))
    by_cat = by_cat.reset_index()[lambda d: d["group"].isin(("often", "seldom", "never", "random"))]
    targets = memory_targets(summary, rho)
    by_order = pd.concat([order_targets(trace, counts, n) for n in lm.config.ngram_orders], ignore_index=True)
    spec = (
        lambda: gate_vs_memory(summary, curve, rho, theme=theme),
        "Gate versus memory: do gates open on n-grams the model read?",
        (
            "Left: mean gate (over streams) on text positions whose trigram the tiny LM read in "
            f"training at least {OFTEN} times, 1-{OFTEN - 1} times or never, and on random-token "
            "controls, per Engram layer. Right: mean gate per bin of that training count, with the "
            "Spearman correlation of gate and log(1 + count). Tables gate_memory, gate_count_curve, "
            "loss_by_category (loss saved by the open gates, nats, per prompt category and group); "
            "memory_targets_by_order groups the positions by their bigram, trigram and 4-gram instead."
        ),
    )
    tables = {"gate_memory": summary.astype({"group": str}), "gate_count_curve": curve.astype({"count_bin": str})}
    tables |= {"loss_by_category": by_cat.reset_index(drop=True), "memory_targets": targets}
    tables["memory_targets_by_order"] = by_order
    return tables, {"gate_vs_memory": spec}
