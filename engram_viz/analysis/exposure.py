"""Collision exposure: for every position of a Trace, how many of its 24 rows also hold a different
n-gram of a population.

The population is the trace's own text positions (each prompt a sequence from position 0, image
positions left out and blocking, see ``trace_ngrams.trace_sequences``), plus a reference corpus
(a ``CollisionStats``) when given. A Trace carries the result in ``trace.extras["exposure"]``,
which its ``gates`` frame turns into the ``exposure`` column::

    trace.extras["exposure"] = collision_exposure(trace, pipe.config)
"""

from __future__ import annotations

import numpy as np
import torch

from engram_viz.analysis.collisions import CollisionStats
from engram_viz.analysis.trace_ngrams import trace_sequences
from engram_viz.config import EngramConfig
from engram_viz.run.trace import Trace


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
