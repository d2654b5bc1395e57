"""The n-grams of a Trace: its text positions as an n-gram population, per-position corpus
frequency and collision exposure, and the windows one prompt's positions hash.

A Trace stores ``compressed_ids`` ``[B, T]`` as the hash cache sees them (DEAD = -1 at image
positions) and ``token_types`` (TEXT = -1); :func:`trace_sequences` cuts them into the per-prompt
sequences every consumer reads (padding dropped), so the image mask and the pad are decided once.
Windows and blocked slots come from ``windows`` (the one numpy statement of the blocked rule).

Collision exposure (:func:`collision_exposure`): for every position of a Trace, how many of its 24 rows
also hold a different n-gram of a population.

The population is the trace's own text positions (each prompt a sequence from position 0, image
positions left out and blocking, see ``trace_ngrams.trace_sequences``), plus a reference corpus
(a ``CollisionStats``) when given. :func:`gates_with_exposure` is the Trace's ``gates`` frame with
that ``exposure`` column::

    gates = gates_with_exposure(trace, pipe.config)  # or (trace, pipe.config, corpus_stats)
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.corpus.windows import DEAD, sequence_blocked, sequence_windows, window_ngrams
from engram_viz.analysis.row_stats.collisions import CollisionStats
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.token_text import joined_text
from engram_viz.errors import InputError
from engram_viz.run.trace import Trace


def trace_sequences(trace: Trace) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per prompt i: ``(compressed int64 [T_i]`` with DEAD at image positions, ``text bool [T_i]``
    True at text positions``)``, padding dropped (``T_i = lengths[i]``)."""
    out = []
    for i, n in enumerate(trace.lengths.tolist()):
        text = trace.token_types[i, :n].numpy() < 0
        out.append((np.where(text, trace.compressed_ids[i, :n].numpy(), DEAD).astype(np.int64), text))
    return out


def population_from_trace(trace: Trace, counts: NgramCounts) -> NgramCounts:
    """Add the n-grams of every text position of ``trace`` (each prompt a sequence from position
    0; image positions left out and blocking) to ``counts`` (e.g. ``RowUsage(cfg).counts``, shared
    with a ``CollisionStats``); returns ``counts``."""
    for compressed, text in trace_sequences(trace):
        counts.add_compressed(compressed, text)
    return counts


def ngram_frequency(trace: Trace, counts: NgramCounts, order: int = 3) -> pd.DataFrame:
    """For every text position of a trace, how often the ``order``-gram ending there occurs in a
    corpus (``counts``: an ``NgramCounts``, e.g. ``corpus_sample()[0].counts``): prompt, position,
    ngram_count; -1 where the n-gram is blocked (it reaches before the start or onto an image)."""
    max_ngram = int(counts.config.engram_max_ngram_size)
    if not 2 <= order <= max_ngram:
        raise InputError(f"order must be in 2..{max_ngram}, got {order}")
    recs = []
    for pid, (c, text) in zip(trace.prompt_ids, trace_sequences(trace)):
        windows, _ = sequence_windows(c, counts.pad_id, max_ngram, text)
        blocked = sequence_blocked(c, max_ngram, text)[:, order - 1]
        found = np.where(blocked, -1, counts.count_of(window_ngrams(windows, order)))
        recs.append(pd.DataFrame({"prompt": pid, "position": np.arange(len(c)), "ngram_count": found}))
    return pd.concat(recs, ignore_index=True)


def ngram_windows_table(trace: Trace, config: EngramConfig | str, prompt: str | int = 0) -> pd.DataFrame:
    """The n-gram windows one prompt's positions hash, one row per position: position, token,
    is_image, then for each order 2..max the n-gram it reads (its tokens' text, or 'BLOCKED' when
    a slot of it lies before the sequence start or on an image position). ``config`` (the one the
    trace ran with, e.g. ``pipeline.config``) gives the largest order."""
    max_ngram = load_config(config).engram_max_ngram_size
    i = trace.index(prompt) if isinstance(prompt, str) else int(prompt)
    c, text = trace_sequences(trace)[i]
    blocked = sequence_blocked(c, max_ngram, text)
    pieces = trace.pieces[i]
    rows = []
    for t in range(len(c)):
        rec = {"position": t, "token": pieces[t], "is_image": bool(not text[t])}
        for order in range(2, max_ngram + 1):
            rec[f"{order}-gram"] = "BLOCKED" if blocked[t, order - 1] else joined_text(pieces[t - order + 1 : t + 1])
        rows.append(rec)
    return pd.DataFrame(rows)


def collision_exposure(trace: Trace, config: EngramConfig, stats: CollisionStats | None = None) -> torch.Tensor:
    """int64 ``[B, T, n_layers]``: per position, how many of its 24 rows also hold a different n-gram
    of the population - the trace's own text positions, plus ``stats`` (a ``CollisionStats`` of a
    reference corpus) when given. 0 at image and padded positions."""
    population = CollisionStats(config)
    if stats is not None:
        population.merge(stats)
    sequences = trace_sequences(trace)
    for compressed, text in sequences:
        population.add_compressed(compressed, text)
    per_prompt = population.exposure_ragged([c for c, _ in sequences], [m for _, m in sequences])
    out = torch.zeros((trace.batch_size, trace.seq_len, len(trace.layer_ids)), dtype=torch.int64)
    for i, e in enumerate(per_prompt):
        out[i, : len(e)] = torch.from_numpy(np.asarray(e, dtype=np.int64))
    return out.masked_fill(~trace.valid.unsqueeze(-1), 0)


def gates_with_exposure(trace: Trace, config: EngramConfig, stats: CollisionStats | None = None) -> pd.DataFrame:
    """The Trace's ``gates`` frame with its ``exposure`` column: :func:`collision_exposure` of every
    position (against the trace's own text, plus ``stats`` when given), repeated over the streams."""
    return trace.to_frame("gates", exposure=collision_exposure(trace, config, stats))
