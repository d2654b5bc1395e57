"""What the interactive views (``apps/gate_view.py``, drawn by ``apps/static/gate_view.js``) receive:
plain JSON-ready dicts built from a prompt's arrays, an explanation and the themes.

- :func:`prompt_payload`: one prompt's tokens (display labels, image flags), its gates
  ``[T, n_layers, hc]`` and row ids ``[T, n_layers, 24]`` flattened, rounded to 4 decimals (what
  the view colours, lists on hover and shows in the all-gates grid), or its error.
- :func:`explanation_payload`: one position's 24 rows at every layer: owner (order, head), row id,
  decoded n-gram, per-stream share of the gate's ``dot`` and gate with the row left out.
- :func:`header_payload`: which model, weights, streams and device made the view;
- :func:`theme_payload`: each theme's colours and colour-map stops, so that the browser colours
  tokens in the host's theme without asking the kernel.

Token labels come from ``viz.token_labels`` (special tokens as short labels, a character split over
byte-level tokens merged, with a note naming the bytes); image positions are flagged and the view
draws each image span as one labelled block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from engram_viz.analysis.explain.explanation import Explanation
from engram_viz.analysis.gates.comparison import PromptResult
from engram_viz.run.pipeline import Pipeline
from engram_viz.viz.style import THEMES
from engram_viz.viz.token_labels import token_label, token_labels

CMAP_STOPS = 11  # colour-map samples sent to the browser (it interpolates between them)
_DIGITS = 4


def _hex(rgba: np.ndarray) -> list[str]:
    rgb = np.clip(np.rint(np.asarray(rgba)[:, :3] * 255), 0, 255).astype(np.int64)
    return [f"#{r:02x}{g:02x}{b:02x}" for r, g, b in rgb]


def prompt_payload(result: PromptResult, slot: str, layer_ids: Sequence[int]) -> dict[str, Any]:
    """``{slot, error}`` for a prompt that cannot run, else ``{slot, n, labels, notes, pieces, image,
    gates, rows, n_cols}``: ``gates`` is ``[T * n_layers * hc]`` (position-major), ``rows`` is
    ``[T * n_layers * n_cols]``; ``labels`` are the display labels, ``notes`` (position -> text) say
    which bytes of a split character a token holds, ``pieces`` are the raw pieces."""
    if not result.ok:
        return {"slot": slot, "error": result.error}
    rows = result.trace.row_ids[0, : len(result.pieces)].numpy()  # [T, n_layers, n_cols]
    labels, notes = token_labels(result.pieces)
    return {
        "slot": slot,
        "error": None,
        "n": len(result.pieces),
        "layer_ids": [int(x) for x in layer_ids],
        "hc": int(result.gates.shape[2]),
        "n_cols": int(rows.shape[2]),
        "labels": labels,
        "notes": {str(k): v for k, v in notes.items()},
        "pieces": list(result.pieces),
        "image": [int(x) for x in result.is_image.tolist()],
        "gates": np.round(result.gates.astype(np.float64), _DIGITS).reshape(-1).tolist(),
        "rows": rows.astype(np.int64).reshape(-1).tolist(),
    }


def explanation_payload(ex: Explanation, slot: str, position: int) -> dict[str, Any]:
    """Position ``position``'s rows at every explained layer (module docstring): ``{slot, position,
    token, layers: {layer: {gate: [hc], rows: [{column, order, head, row, ngram, share: [hc],
    loo_gate: [hc]}]}}}``. ``share`` is the row's ``dot_share / dot`` per stream (0 where dot is 0)."""
    df = ex.rows_frame(position)
    dot = df["dot"].to_numpy()
    df = df.assign(share=np.where(dot != 0, df["dot_share"].to_numpy() / np.where(dot != 0, dot, 1.0), 0.0))
    layers: dict[str, Any] = {}
    for layer, part in df.groupby("layer", sort=False):
        part = part.sort_values(["column", "stream"])
        hc = int(part["stream"].nunique())
        n_cols = len(part) // hc
        share = part["share"].to_numpy().reshape(n_cols, hc)
        loo = part["loo_gate"].to_numpy().reshape(n_cols, hc)
        first = part[part["stream"] == part["stream"].min()]
        rows = [
            {
                "column": int(r.column),
                "order": int(r.order),
                "head": int(r.head),
                "row": int(r.row),
                "ngram": str(r.ngram),
                "share": np.round(share[k].astype(np.float64), _DIGITS).tolist(),
                "loo_gate": np.round(loo[k].astype(np.float64), _DIGITS).tolist(),
            }
            for k, r in enumerate(first.itertuples())
        ]
        gate = part.groupby("stream", sort=True)["gate"].first().to_numpy().astype(np.float64)
        layers[str(int(layer))] = {"gate": np.round(gate, _DIGITS).tolist(), "rows": rows}
    return {
        "slot": slot,
        "position": int(position),
        "token": token_label(ex.pieces[position]),
        "layers": layers,
    }


def header_payload(pipeline: Pipeline) -> dict[str, str]:
    """Which model and weights, residual streams, config and device made the view."""
    return {
        "model": str(pipeline.model_label),
        "streams": pipeline.streams_label or f"{pipeline.streams_mode} streams",
        "config": pipeline.config.name,
        "device": str(pipeline.device),
    }


def theme_payload() -> dict[str, Any]:
    """Per theme: background, foreground, muted, panel, border, image fill, positive / negative and
    the token-text and heat maps (gates 0..1) as :data:`CMAP_STOPS` colour stops."""
    out = {}
    for name, t in THEMES.items():
        stops = np.linspace(0.0, 1.0, CMAP_STOPS)
        out[name] = {
            "background": t.background,
            "foreground": t.foreground,
            "muted": t.muted,
            "panel": t.panel,
            "border": t.panel_border,
            "image": t.image,
            "positive": t.positive,
            "negative": t.negative,
            "warn": t.warn_text,
            "token": _hex(t.token_cmap(stops)),
            "heat": _hex(t.heat_cmap(stops)),
        }
    return out
