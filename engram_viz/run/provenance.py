"""Where a result comes from: which model and weights, which residual streams, which config, and
whether the weights are synthetic (the checkpoint's own flag, never a label sniffed for "SYNTHETIC").

Every frame of a Trace carries it in ``df.attrs["provenance"]`` (a plain dict, so it survives
filtering and is written into parquet metadata), and the figures drawn from such a frame label
themselves with it (``engram_viz.viz.stamps``).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, overload

import pandas as pd

from engram_viz.config import load_config

ATTR = "provenance"  # the key in DataFrame.attrs


@dataclass(frozen=True)
class Provenance:
    """Which model, weights and streams produced a result."""

    model: str  # the model and weights label (a checkpoint's label, or the layout for weight-free results)
    streams: str  # where the residual streams came from
    config: str  # the config's name
    synthetic: bool  # the weights are random (a synthetic checkpoint), not trained
    data: str = ""  # what was counted, for a weight-free result (a corpus sample)

    @property
    def label(self) -> str:
        """The model label without its folder path (and what was counted): what a figure is stamped with."""
        return short_label(self.model) + (f"; {self.data}" if self.data else "")

    def tag(self, df: pd.DataFrame) -> pd.DataFrame:
        """``df`` with this provenance in its ``attrs`` (the same frame, returned)."""
        df.attrs[ATTR] = asdict(self)
        return df


def short_label(label: str) -> str:
    """A model label without its folder path (``... at /root/.cache/...`` dropped)."""
    return re.sub(r"\s+(at|from)\s+/\S+$", "", str(label)).strip()


def layout_provenance(config: Any, data: str = "") -> Provenance:
    """The provenance of a weight-free result (hash ids, collisions, row usage): exact for the layout
    of ``config`` (an EngramConfig or a config name); ``data`` says what was counted."""
    config = config if hasattr(config, "name") else load_config(config)
    return Provenance(
        model=f"none needed: exact for the {config.name} layout and the V4 tokenizer (no weights are read)",
        streams=f"none (no forward); data: {data}",
        config=config.name,
        synthetic=False,
        data=data,
    )


@overload
def provenance_of(source: pd.DataFrame) -> Provenance | None: ...
@overload
def provenance_of(source: Any) -> Provenance: ...
def provenance_of(source: Any) -> Provenance | None:
    """The provenance of a Trace, a Pipeline, a frame carrying one in its ``attrs``, or a Provenance;
    None for a frame without one."""
    if isinstance(source, Provenance):
        return source
    if isinstance(source, pd.DataFrame):
        found = source.attrs.get(ATTR)
        return Provenance(**found) if isinstance(found, dict) else None
    meta = getattr(source, "meta", None) or {}
    checkpoint = getattr(source, "checkpoint", None)
    config = getattr(getattr(source, "config", None), "name", None) or meta.get("config", "?")
    synthetic = bool(meta.get("synthetic")) or bool(getattr(checkpoint, "synthetic", False))
    return Provenance(
        model=getattr(source, "model_label", "") or "",
        streams=getattr(source, "streams_label", "") or "",
        config=str(config),
        synthetic=synthetic,
    )
