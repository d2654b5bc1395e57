"""The tidy tables of a Trace: one row per observation, padded positions dropped.

- ``tokens``: one row per position: prompt, category, position (0-based within the prompt), token
  (decoded piece), raw_id, compressed_id, token_type, is_image;
- ``gates``: one row per (prompt, position, layer, stream): the token columns, layer, stream, gate
  (+ ``dot`` when every layer's dot was captured, + ``exposure`` when given or carried by the trace);
- ``rows``: one row per (prompt, position, layer, order, head): prompt, category, position, token,
  is_image, layer, order (2..max n-gram), head, column (0..23) and the row id.

:class:`TraceFrames` is the part of :class:`engram_viz.run.trace.Trace` that builds them; it reads
only the Trace's fields (``prompt_ids``, ``pieces``, ``input_ids`` ``[B, T]``, ``gates``
``[B, T, n_layers, hc]``, ``row_ids`` ``[B, T, n_layers, 24]``, ``extras``, ``meta`` ...).
Every frame carries the Trace's provenance in ``df.attrs["provenance"]`` (``run.provenance``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import pandas as pd
import torch

from engram_viz.errors import InputError, TraceError
from engram_viz.run.provenance import Provenance, provenance_of

_TABLES = ("tokens", "gates", "rows")


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
        batch_size: int
        seq_len: int

    def _positions(self) -> tuple[np.ndarray, np.ndarray]:
        b, t = np.nonzero(self.valid.numpy())
        return b, t

    def _pieces_flat(self) -> np.ndarray:
        return np.array([p for ps in self.pieces for p in ps], dtype=object)

    @property
    def provenance(self) -> Provenance:
        """Which model, weights and streams produced this Trace (every frame carries it in its attrs)."""
        return provenance_of(self)

    def with_extras(self, **extras: torch.Tensor) -> Any:
        """A new Trace carrying ``extras`` (e.g. ``exposure=`` ``[B, T, n_layers]``) beside its own;
        this one is left as it is."""
        return dataclasses.replace(cast(Any, self), extras={**self.extras, **extras})  # self: a Trace, a dataclass

    def to_frame(self, table: str = "gates", *, exposure: torch.Tensor | None = None) -> pd.DataFrame:
        """A tidy table: ``gates`` (prompt, position, token, is_image, layer, stream, gate, ...),
        ``rows`` (prompt, position, layer, order, head, row, ...) or ``tokens`` (one row per
        position). Positions are 0-based within each prompt; padded positions are dropped.
        ``exposure`` (``[B, T, n_layers]``, e.g. ``collision_exposure(trace, config)``) becomes the
        gates frame's ``exposure`` column. The frame carries the Trace's provenance in its attrs."""
        if exposure is not None and table != "gates":
            raise TraceError(f"exposure= is a column of the 'gates' table; got it for table {table!r}")
        if table == "gates":
            df = self._gates_frame(exposure)
        elif table == "rows":
            df = self._rows_frame()
        elif table == "tokens":
            df = self._tokens_frame()
        else:
            raise InputError(f"unknown table {table!r}; expected 'gates', 'rows' or 'tokens'")
        return self.provenance.tag(df)

    def to_frames(self, *, exposure: torch.Tensor | None = None) -> dict[str, pd.DataFrame]:
        """The ``tokens``, ``gates`` (with ``exposure`` as in :meth:`to_frame`) and ``rows`` tables."""
        return {name: self.to_frame(name, **({"exposure": exposure} if name == "gates" else {})) for name in _TABLES}

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

    def _gates_frame(self, exposure: torch.Tensor | None = None) -> pd.DataFrame:
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
        exposure = exposure if exposure is not None else self.extras.get("exposure")
        if exposure is not None:
            if tuple(exposure.shape) != (self.batch_size, self.seq_len, n_layers):
                raise TraceError(
                    f"exposure must be [B, T, n_layers] = {[self.batch_size, self.seq_len, n_layers]}, "
                    f"got {list(exposure.shape)}"
                )
            df["exposure"] = np.repeat(exposure.numpy()[b, t].reshape(-1), hc)
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
