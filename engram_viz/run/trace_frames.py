"""The tidy tables of a Trace: one row per observation, padded positions dropped.

- ``tokens``: one row per position: prompt, category, position (0-based within the prompt), token
  (decoded piece), raw_id, compressed_id, token_type, is_image;
- ``gates``: one row per (prompt, position, layer, stream): the token columns, layer, stream, gate
  (+ ``dot`` when every layer's dot was captured, + ``exposure`` when the trace carries it);
- ``rows``: one row per (prompt, position, layer, order, head): prompt, category, position, token,
  is_image, layer, order (2..max n-gram), head, column (0..23) and the row id.

:class:`TraceFrames` is the part of :class:`engram_viz.run.trace.Trace` that builds them; it reads
only the Trace's fields (``prompt_ids``, ``pieces``, ``input_ids`` ``[B, T]``, ``gates``
``[B, T, n_layers, hc]``, ``row_ids`` ``[B, T, n_layers, 24]``, ``extras``, ``meta`` ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
import torch


class TraceFrames:
    """Tidy-table views of a Trace (mixed into :class:`engram_viz.run.trace.Trace`)."""

    if TYPE_CHECKING:  # the Trace fields and views these tables read; Trace defines them
        layer_ids: tuple[int, ...]
        prompt_ids: list[str]
        categories: list[str]
        input_ids: torch.Tensor
        compressed_ids: torch.Tensor
        token_types: torch.Tensor
        pieces: list[list[str]]
        extras: dict[str, torch.Tensor]
        meta: dict[str, Any]
        valid: torch.Tensor
        is_image: torch.Tensor
        row_ids: torch.Tensor
        gates: torch.Tensor
        captured: Callable[[str], dict[int, torch.Tensor]]

    def _positions(self) -> tuple[np.ndarray, np.ndarray]:
        b, t = np.nonzero(self.valid.numpy())
        return b, t

    def _pieces_flat(self) -> np.ndarray:
        return np.array([p for ps in self.pieces for p in ps], dtype=object)

    def to_frame(self, table: str = "gates") -> pd.DataFrame:
        """A tidy table: ``gates`` (prompt, position, token, is_image, layer, stream, gate, ...),
        ``rows`` (prompt, position, layer, order, head, row, ...) or ``tokens`` (one row per
        position). Positions are 0-based within each prompt; padded positions are dropped."""
        if table == "gates":
            return self._gates_frame()
        if table == "rows":
            return self._rows_frame()
        if table == "tokens":
            return self._tokens_frame()
        raise ValueError(f"unknown table {table!r}; expected 'gates', 'rows' or 'tokens'")

    def to_frames(self) -> dict[str, pd.DataFrame]:
        return {name: self.to_frame(name) for name in ("tokens", "gates", "rows")}

    def _tokens_frame(self) -> pd.DataFrame:
        b, t = self._positions()
        df = pd.DataFrame(
            {
                "prompt": pd.Categorical(np.asarray(self.prompt_ids, dtype=object)[b], categories=self.prompt_ids),
                "category": np.asarray(self.categories, dtype=object)[b],
                "position": t.astype(np.int64),
                "token": self._pieces_flat(),
                "raw_id": self.input_ids.numpy()[b, t],
                "compressed_id": self.compressed_ids.numpy()[b, t],
                "token_type": self.token_types.numpy()[b, t],
                "is_image": self.is_image.numpy()[b, t],
            }
        )
        df["prompt"] = df["prompt"].astype(str)
        return df

    def _gates_frame(self) -> pd.DataFrame:
        tok = self._tokens_frame()
        b, t = self._positions()
        gates = self.gates.float().numpy()[b, t]  # [N, L, hc]
        n, n_layers, hc = gates.shape
        rep = n_layers * hc
        df = tok.loc[np.repeat(np.arange(n), rep)].reset_index(drop=True)
        df.insert(df.columns.get_loc("is_image") + 1, "layer", np.tile(np.repeat(self.layer_ids, hc), n))
        df.insert(df.columns.get_loc("layer") + 1, "stream", np.tile(np.arange(hc), n * n_layers))
        df["gate"] = gates.reshape(-1)
        dots = self.captured("dot")
        if len(dots) == n_layers:
            df["dot"] = torch.stack([dots[x] for x in self.layer_ids], 2).float().numpy()[b, t].reshape(-1)
        if "exposure" in self.extras:
            df["exposure"] = np.repeat(self.extras["exposure"].numpy()[b, t].reshape(-1), hc)
        return df

    def _rows_frame(self) -> pd.DataFrame:
        tok = self._tokens_frame()[["prompt", "category", "position", "token", "is_image"]]
        b, t = self._positions()
        rows = self.row_ids.numpy()[b, t]  # [N, L, 24]
        n, n_layers, cols = rows.shape
        n_heads = int(self.meta.get("n_heads", cols // 3))
        df = tok.loc[np.repeat(np.arange(n), n_layers * cols)].reset_index(drop=True)
        col = np.tile(np.arange(cols), n * n_layers)
        df["layer"] = np.tile(np.repeat(self.layer_ids, cols), n)
        df["order"] = col // n_heads + 2
        df["head"] = col % n_heads
        df["column"] = col
        df["row"] = rows.reshape(-1)
        return df
