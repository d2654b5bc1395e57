"""Gate versus memory: does a position's gate open more when its n-gram was seen in training?

For each text position the **training count** is how often the model read the ``order``-gram
ending there in training (:func:`read_counts`: the windows of every batch of its recipe, not the
whole training stream, most of which a short run never reads; an :class:`NgramCounts`; -1 where
the n-gram reaches before the sequence start or onto an image, "blocked"). Positions fall into
**memory groups**:

==========  =====================================================================================
``often``   the n-gram was seen at least ``OFTEN`` (20) times in training
``seldom``  seen 1 to ``OFTEN - 1`` times
``never``   never seen
``random``  any position of a random-token control (prompt category ``random_token``), whatever
            its count: the control the other groups are compared with
==========  =====================================================================================

:func:`gate_memory_summary` gives per Engram layer and group the mean gate (mean over the
streams) and, when a ``loss_saved`` column is present (next-token loss with the gates forced to 0
minus the loss with them open, nats), its mean; :func:`gate_count_curve` the mean gate per bin of
training count with the Spearman correlation of gate and log(1 + count) over the non-random text
positions; :func:`memory_targets` the issue's three checks per layer; :func:`gate_memory` all of
them over a Trace at once (the report's gate-versus-memory tables and notebook 02's).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from engram_viz._cache import cached
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.windows import sequence_blocked, sequence_windows, window_ngrams
from engram_viz.analysis.row_stats.trace_ngrams import trace_sequences
from engram_viz.config import EngramConfig
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import EngramVizError, InputError
from engram_viz.run.trace import Trace
from engram_viz.settings import cache_dir
from engram_viz.tiny.data import batch_offsets, build_corpus, windows_at
from engram_viz.tiny.position_scores import probe_windows, prompt_loss_saved

OFTEN = 20  # training count from which an n-gram is "seen often"
READ_CHUNK = 4096  # training windows counted at a time
GROUPS = ("often", "seldom", "never", "random")
RANDOM_CATEGORY = "random_token"
COUNT_BINS = (0, 1, 2, 5, 20, 100, 1000)  # left edges of the gate-vs-count bins
COUNT_BIN_LABELS = ("0", "1", "2-4", "5-19", "20-99", "100-999", ">=1000")


def sequence_counts(compressed: np.ndarray, text: np.ndarray, counts: NgramCounts, order: int = 3) -> np.ndarray:
    """Training count of the ``order``-gram ending at each position of one sequence (compressed ids
    ``[T]``, text mask ``[T]``, starting at position 0 like ``hash_prompt``): int64 ``[T]``, -1
    where the n-gram is blocked or the position is an image."""
    max_ngram = int(counts.config.engram_max_ngram_size)
    if not 2 <= order <= max_ngram:
        raise InputError(f"order must be in 2..{max_ngram}, got {order}")
    windows, mask = sequence_windows(compressed, counts.pad_id, max_ngram, text)
    blocked = sequence_blocked(compressed, max_ngram, text)[:, order - 1] | ~mask
    return np.where(blocked, -1, counts.count_of(window_ngrams(windows, order)))


def read_counts(config: EngramConfig, train: torch.Tensor, recipe: dict) -> NgramCounts:
    """N-gram counts (orders 2..max) of what a tiny LM read in training: the input part
    (``[:, :seq_len]``) of every window of every batch of ``recipe`` (seed, steps, batch, seq_len;
    ``tiny.data.batch_offsets``) over the raw training stream ``train``, each window counted as a
    fresh sequence from position 0, as the model hashed it. Unread parts of the stream count
    nothing; a stretch read twice counts twice."""
    seq_len = int(recipe["seq_len"])
    offsets = batch_offsets(len(train), seq_len, int(recipe["batch"]), int(recipe["steps"]), int(recipe["seed"]))
    token_map = get_tokenizer(config).token_map
    counts = NgramCounts(config)
    for chunk in offsets.reshape(-1).split(READ_CHUNK):
        counts.add_compressed(token_map[windows_at(train, chunk, seq_len)[:, :-1].numpy()])
    return counts


def training_recipe(training: dict | None, where: str) -> dict:
    """The recipe :func:`read_counts` needs (sources, seed, steps, batch, seq_len) from the
    ``training`` section of a tiny LM folder's ``config.json``; ``EngramVizError`` naming
    ``where`` when it is missing or incomplete."""
    try:
        s = training["settings"]
        recipe = {"sources": [str(x) for x in training["corpus"]["sources"]], "seed": int(training["seed"])}
        recipe |= {k: int(s[k]) for k in ("steps", "batch", "seq_len")}
    except (TypeError, KeyError, ValueError) as err:
        raise EngramVizError(
            f"{where}: no usable 'training' section (seed, settings.steps/batch/seq_len, corpus.sources; "
            f"missing or bad: {err}); the gate-versus-memory analysis needs the recipe the model was trained with"
        ) from None
    return recipe


def training_counts(config: EngramConfig, training: dict | None, where: str = "tiny LM") -> NgramCounts:
    """:func:`read_counts` of a tiny LM from its ``training`` section (:func:`training_recipe`),
    cached in ``cache_dir()/tiny-read-counts-<key>.npz`` (with its sha256 sidecar, ``_cache``);
    needs the sources' Debian packages the first time (``tiny.sources`` names them when missing)."""
    recipe = training_recipe(training, where) | {"max_ngram": int(config.engram_max_ngram_size)}
    key = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()
    path = cache_dir() / f"tiny-read-counts-{key[:16]}.npz"

    def build() -> NgramCounts:
        corpus = build_corpus(config, sources=tuple(recipe["sources"]))  # the split does not depend on the vocabulary
        return read_counts(config, corpus.train, recipe)

    return cached(path, lambda p: NgramCounts.load(p, config), build, NgramCounts.save, suffix=".npz")


def trace_memory_frame(
    trace: Trace, counts: NgramCounts, order: int = 3, loss_saved: np.ndarray | None = None
) -> pd.DataFrame:
    """One row per (text position, layer) of a Trace: prompt, category, position, token, layer,
    gate (mean over the streams), count (times the model read the ``order``-gram ending there in training), group,
    and ``loss_saved`` when given (``[B, T]``, nats: loss with the gates shut minus open)."""
    gates = trace.gates.float().mean(-1).numpy()  # [B, T, L]
    parts = []
    for i, (compressed, text) in enumerate(trace_sequences(trace)):
        n = len(compressed)
        cnt = sequence_counts(compressed, text, counts, order)
        for li, layer in enumerate(trace.layer_ids):
            part = {"prompt": trace.prompt_ids[i], "category": trace.categories[i], "position": np.arange(n)}
            part |= {"token": trace.pieces[i][:n], "layer": int(layer), "gate": gates[i, :n, li], "count": cnt}
            if loss_saved is not None:
                part["loss_saved"] = np.asarray(loss_saved[i, :n], dtype=float)
            parts.append(pd.DataFrame(part)[text])
    frame = pd.concat(parts, ignore_index=True)  # no text position (image-only prompts): an empty frame
    frame["group"] = memory_group(frame["count"].to_numpy(), frame["category"].to_numpy())
    return frame


def windows_memory_frame(
    model, windows, counts: NgramCounts, category: str, order: int = 3, probe: dict | None = None
) -> pd.DataFrame:
    """The frame of :func:`trace_memory_frame` for a tiny LM run over windows ``[N, T + 1]`` of raw
    ids (each a fresh prompt; ``tiny.probe.probe_windows``, or its result ``probe`` when already
    run), all of one ``category``; ``window`` replaces ``prompt``, ``loss_saved`` is the next-token
    loss saved by the open gates."""
    probe = probe_windows(model, windows) if probe is None else probe
    token_map = model.token_map
    saved = (probe["loss_shut"] - probe["loss_open"]).numpy()
    parts = []
    for i in range(len(windows)):
        compressed = token_map[windows[i, :-1].numpy()]
        cnt = sequence_counts(compressed, np.ones(len(compressed), bool), counts, order)
        for key in model.engrams:
            part = {"window": i, "category": category, "position": np.arange(len(cnt)), "layer": int(key)}
            part |= {"gate": probe[f"gate_L{key}"][i].numpy(), "count": cnt, "loss_saved": saved[i]}
            parts.append(pd.DataFrame(part))
    frame = pd.concat(parts, ignore_index=True)
    frame["group"] = memory_group(frame["count"].to_numpy(), frame["category"].to_numpy())
    return frame


def memory_group(count: np.ndarray, category: np.ndarray | None = None, often: int = OFTEN) -> np.ndarray:
    """Group label of each position (see the module table); blocked positions get ``blocked``."""
    count = np.asarray(count)
    out = np.where(count >= often, "often", np.where(count > 0, "seldom", np.where(count == 0, "never", "blocked")))
    if category is not None:
        out = np.where(np.asarray(category) == RANDOM_CATEGORY, "random", out)
    return out.astype(object)


def count_bin(count: np.ndarray) -> np.ndarray:
    """Bin label (:data:`COUNT_BIN_LABELS`) of each training count (>= 0)."""
    idx = np.searchsorted(np.asarray(COUNT_BINS), np.asarray(count), side="right") - 1
    return np.asarray(COUNT_BIN_LABELS, dtype=object)[np.clip(idx, 0, len(COUNT_BINS) - 1)]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman rank correlation (average ranks for ties); NaN for fewer than 3 points."""
    if len(x) < 3:
        return float("nan")
    rx = pd.Series(np.asarray(x, float)).rank().to_numpy()
    ry = pd.Series(np.asarray(y, float)).rank().to_numpy()
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def gate_memory_summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per layer and memory group: n, mean / median / p10 / p90 gate, mean ``loss_saved`` (if the
    frame has it). ``frame``: one row per (position, layer) with columns layer, gate, group
    (blocked positions are left out)."""
    f = frame[frame["group"].isin(GROUPS)]
    agg = {"n": ("gate", "size"), "mean_gate": ("gate", "mean"), "median_gate": ("gate", "median")}
    agg |= {"p10_gate": ("gate", lambda g: g.quantile(0.1)), "p90_gate": ("gate", lambda g: g.quantile(0.9))}
    if "loss_saved" in f:
        agg["loss_saved"] = ("loss_saved", "mean")
    out = f.groupby(["layer", "group"], sort=False).agg(**agg).reset_index()
    out["group"] = pd.Categorical(out["group"], GROUPS, ordered=True)
    return out.sort_values(["layer", "group"]).reset_index(drop=True)


def gate_count_curve(frame: pd.DataFrame) -> tuple[pd.DataFrame, dict[int, float]]:
    """Mean gate per layer and training-count bin over the non-random text positions, and the
    Spearman correlation of gate with log(1 + count) per layer: ``(curve, {layer: rho})``.

    The curve: layer, count_bin (bins with no position are left out), n (positions), mean_gate,
    ci_low / ci_high (95% interval of the mean, normal approximation: mean +- 1.96 sd / sqrt(n);
    NaN for n < 2)."""
    f = frame[frame["group"].isin(("often", "seldom", "never"))].copy()
    f["count_bin"] = pd.Categorical(count_bin(f["count"].to_numpy()), COUNT_BIN_LABELS, ordered=True)
    curve = (
        f.groupby(["layer", "count_bin"], observed=True)
        .agg(n=("gate", "size"), mean_gate=("gate", "mean"), sd=("gate", "std"))
        .reset_index()
    )
    half = 1.96 * curve.pop("sd") / np.sqrt(curve["n"])  # NaN where n < 2 (no spread to estimate)
    curve["ci_low"], curve["ci_high"] = curve["mean_gate"] - half, curve["mean_gate"] + half
    curve["count_bin"] = curve["count_bin"].cat.remove_unused_categories()
    rho = {int(layer): spearman(np.log1p(g["count"]), g["gate"]) for layer, g in f.groupby("layer")}
    return curve, rho


def memory_targets(summary: pd.DataFrame, rho: dict[int, float]) -> pd.DataFrame:
    """Per layer: often - random, often - never (mean gates), Spearman, and whether random is the
    highest group; the issue's targets are >= 0.15, >= 0.10 and >= 0.3 on one layer."""
    rows = []
    for layer, g in summary.groupby("layer"):
        m = dict(zip(g["group"].astype(str), g["mean_gate"]))
        rows.append(
            {
                "layer": int(layer),
                "often_minus_random": m.get("often", np.nan) - m.get("random", np.nan),
                "often_minus_never": m.get("often", np.nan) - m.get("never", np.nan),
                "spearman": rho.get(int(layer), np.nan),
                "random_highest": bool(m.get("random", -1) >= max(m.values())),
            }
        )
    columns = ["layer", "often_minus_random", "often_minus_never", "spearman", "random_highest"]
    out = pd.DataFrame(rows, columns=columns)  # no rows (no unblocked text position): the columns still
    out["met"] = (out.often_minus_random >= 0.15) & (out.often_minus_never >= 0.10) & (out.spearman >= 0.3)
    return out


def trace_loss_saved(lm: Any, trace: Trace) -> np.ndarray:
    """``[B, T]`` loss saved by the open gates at each position of each prompt (NaN: none)."""
    out = np.full(tuple(trace.input_ids.shape), np.nan)
    for i, n in enumerate(trace.lengths.tolist()):
        mask = trace.token_types[i, :n] < 0
        out[i, :n] = prompt_loss_saved(lm, trace.input_ids[i, :n], mask).numpy()
    return out


def order_targets(trace: Trace, counts: NgramCounts, order: int) -> pd.DataFrame:
    """:func:`memory_targets` with positions grouped by the training count of their ``order``-gram,
    with a leading ``order`` column."""
    frame = trace_memory_frame(trace, counts, order=order)
    _, rho = gate_count_curve(frame)
    targets = memory_targets(gate_memory_summary(frame), rho)
    targets.insert(0, "order", order)
    return targets


@dataclass(frozen=True)
class GateMemory:
    """The gate-versus-memory analysis of one Trace of a tiny LM (:func:`gate_memory`)."""

    frame: pd.DataFrame  # trace_memory_frame with loss_saved: one row per (text position, layer)
    summary: pd.DataFrame  # gate_memory_summary: per layer and memory group
    curve: pd.DataFrame  # gate_count_curve, with the layer's Spearman correlation as a column
    rho: dict[int, float]  # layer -> Spearman correlation of gate and log(1 + count)
    by_category: pd.DataFrame  # positions and mean loss saved per prompt category and memory group
    targets: pd.DataFrame  # memory_targets for the trigram
    by_order: pd.DataFrame  # memory_targets for each n-gram order ending at the position

    def tables(self) -> dict[str, pd.DataFrame]:
        """The report's tables by name: gate_memory, gate_count_curve, loss_by_category,
        memory_targets, memory_targets_by_order."""
        return {
            "gate_memory": self.summary.astype({"group": str}),
            "gate_count_curve": self.curve.astype({"count_bin": str}),
            "loss_by_category": self.by_category,
            "memory_targets": self.targets,
            "memory_targets_by_order": self.by_order,
        }


def gate_memory(trace: Trace, lm: Any, counts: NgramCounts) -> GateMemory:
    """Gate versus memory over ``trace`` (run on the tiny LM ``lm``; ``counts``: what it read in
    training, :func:`training_counts`): the trigram's groups, curve and targets, the loss saved per
    category and group, and the targets of every n-gram order of the model."""
    frame = trace_memory_frame(trace, counts, loss_saved=trace_loss_saved(lm, trace))
    summary = gate_memory_summary(frame)
    curve, rho = gate_count_curve(frame)
    curve["spearman"] = curve["layer"].map(rho)
    by_cat = frame.groupby(["category", "group"]).agg(positions=("gate", "size"), loss_saved=("loss_saved", "mean"))
    by_cat = by_cat.reset_index()[lambda d: d["group"].isin(GROUPS)].reset_index(drop=True)
    by_order = pd.concat([order_targets(trace, counts, n) for n in lm.config.ngram_orders], ignore_index=True)
    return GateMemory(frame, summary, curve, rho, by_cat, memory_targets(summary, rho), by_order)
