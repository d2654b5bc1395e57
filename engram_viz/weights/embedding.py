"""The token embedding ``embed.weight``: bf16 rows ``[vocab_size, dim]`` read by raw token id."""

from __future__ import annotations

import torch

from engram_viz.errors import CheckpointError
from engram_viz.weights.rows import RowSource


class TokenEmbedding:
    """Rows of the token embedding ``embed.weight`` (bf16 ``[vocab_size, dim]``) by raw token id.

    ``rows(raw_ids [...])`` -> bf16 ``[..., dim]`` on the ids' device; backed by any ``RowSource``
    (lazy from safetensors, in memory) or procedural (``ProceduralEmbedding``).
    """

    def __init__(self, source: RowSource, label: str | None = None, synthetic: bool = False):
        if source.dtype != torch.bfloat16:
            raise CheckpointError(f"{source.label}: token embedding must be bfloat16 (BF16), got {source.dtype}")
        self.source = source
        self.num_rows, self.dim = source.num_rows, source.cols
        self.label = label or source.label
        self.synthetic = synthetic

    def rows(self, raw_ids) -> torch.Tensor:
        """Raw token ids ``[...]`` -> bf16 ``[..., dim]``; an id outside the vocabulary raises ``RowIdError``."""
        return self.source.gather(raw_ids, f"token embedding ({self.label})")

    __call__ = rows

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.num_rows:,} x {self.dim}, {self.label})"
