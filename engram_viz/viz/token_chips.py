"""Token cells: the chips of token-coloured text (one per text token, one per image span), each
with the gate it is coloured by and its tooltip. The matplotlib figure (``token_figure``) and the
HTML page and notebook view (``tokens``) all draw these.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from engram_viz.viz.frames import (
    GATE_COLUMNS,
    gate_table,
    pick_layers,
    pick_prompts,
    reduce_streams,
    require_columns,
    row_ids_text,
    stream_columns,
)
from engram_viz.viz.token_labels import image_label, is_special, token_labels

ATTRIBUTION_COLUMNS = ("prompt", "position", "layer", "kind", "group", "stream", "dot_share")


@dataclass(frozen=True)
class TokenCell:
    """One chip of token-coloured text (an image span collapses into one chip)."""

    text: str  # as shown: controls made visible
    value: float  # the gate coloured (nan for image spans)
    tooltip: str
    is_image: bool
    line_break: bool  # the token ends with a newline: start a new line after it
    is_special: bool = False  # a special token (BOS ...), shown by its short label


def stream_label(stream: int | str) -> str:
    """'stream 2', or 'mean of streams' for a reduction over streams."""
    return f"stream {stream}" if not isinstance(stream, str) else f"{stream} of streams"


def view_setup(gates: pd.DataFrame, prompts, layer: int | None) -> tuple[list, int]:
    """The prompts to draw (checked) and the layer (the frame's first when None)."""
    require_columns(gates, GATE_COLUMNS, "gates")
    chosen = pick_prompts(gates, prompts, "gates")
    layers = pick_layers(gates, layer, "gates")
    return chosen, layers[0]


def order_shares_text(attribution: pd.DataFrame | None, prompt, layer: int, stream: int | str) -> dict[int, str]:
    """position -> one line with the n-gram orders' shares of the gate's ``dot`` at ``layer``, as
    percentages of their sum (signed: an order can pull the gate shut), for one stream or, for a
    reduction ('mean' / 'max' / 'min'), the shares averaged over the streams.

    ``attribution``: an explanation's groups frame (``Explanation.groups_frame``; columns
    prompt, position, layer, kind, group, stream, dot_share; the ``order`` rows are read)."""
    if attribution is None:
        return {}
    require_columns(attribution, ATTRIBUTION_COLUMNS, "attribution")
    at = attribution[
        (attribution["prompt"] == prompt) & (attribution["layer"] == layer) & (attribution["kind"] == "order")
    ]
    if not isinstance(stream, str):
        at = at[at["stream"] == stream]
    shares = at.groupby(["position", "group"])["dot_share"].mean().unstack("group").sort_index(axis=1)
    label = stream_label(stream if not isinstance(stream, str) else "mean")
    out: dict[int, str] = {}
    for position, row in zip(shares.index, shares.to_numpy(dtype=float)):
        total = row.sum()
        parts = (
            "  ".join(f"{int(o)}-gram {100 * v / total:+.0f}%" for o, v in zip(shares.columns, row)) if total else ""
        )
        out[int(position)] = f"order shares of dot ({label}): " + (parts or "none (dot 0)")
    return out


def token_cells(
    gates: pd.DataFrame,
    prompt,
    layer: int,
    stream: int | str = "mean",
    rows: pd.DataFrame | None = None,
    attribution: pd.DataFrame | None = None,
) -> list[TokenCell]:
    """The chips of one prompt at one layer. Needs gates columns prompt, position, token, is_image,
    layer, stream, gate (+ exposure, shown in tooltips when present); ``rows`` adds row ids to
    tooltips, ``attribution`` (a groups frame, :func:`order_shares_text`) the orders' shares."""
    table = gate_table(gates, prompt, layer)
    values = reduce_streams(table, stream)
    row_text = row_ids_text(rows, prompt, layer)
    share_text = order_shares_text(attribution, prompt, layer, stream)
    has_exposure = "exposure" in table.columns
    cells: list[TokenCell] = []
    positions = table.index.to_numpy()
    # plain arrays, read once (per-row pandas access is slow on long prompts)
    image = table["is_image"].to_numpy(dtype=bool)
    tokens = table["token"].tolist()
    streams = stream_columns(table)
    stream_values = table[streams].to_numpy(dtype=float)
    exposure = table["exposure"].to_numpy() if has_exposure else None
    labels, split_notes = token_labels(tokens)
    i = 0
    while i < len(table):
        if image[i]:
            j = i
            while j + 1 < len(table) and image[j + 1]:
                j += 1
            n = j - i + 1
            tip = f"image span: positions {positions[i]}-{positions[j]} ({n} tokens)\ngates 0 (masked)"
            cells.append(TokenCell(image_label(n), float("nan"), tip, True, False))
            i = j + 1
            continue
        position = int(positions[i])
        piece = tokens[i]
        summary = "  ".join(f"s{int(s)} {v:.3f}" for s, v in zip(streams, stream_values[i]))
        lines = [
            f"{piece!r}  position {position}",
            f"layer {layer} gates: {summary}",
        ]
        if has_exposure:
            lines.append(f"collision exposure {int(exposure[i])}/24 rows shared")
        if i in split_notes:
            lines.append(split_notes[i])
        if position in share_text:
            lines.append(share_text[position])
        if position in row_text:
            lines.append(row_text[position])
        cell = TokenCell(labels[i], float(values[i]), "\n".join(lines), False, piece.endswith("\n"), is_special(piece))
        cells.append(cell)
        i += 1
    return cells
