"""plotly figures for exploring in a notebook: hover shows token, position, stream, gate, the 24
row ids and the collision exposure of each cell. plotly is imported lazily (``notebook`` extra).
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np
import pandas as pd
from matplotlib import colormaps

from engram_viz.errors import FrameError
from engram_viz.viz.frames import (
    GATE_COLUMNS,
    gate_table,
    pick_layers,
    pick_one,
    reduce_streams,
    require_columns,
    row_ids_text,
    stream_columns,
)
from engram_viz.viz.gate_plots import diff_matrix
from engram_viz.viz.stamps import stamp
from engram_viz.viz.style import HEAT_CMAP, HTML_FONT_STACK, Theme, get_theme, text_color_on
from engram_viz.viz.token_heatmap import token_axis
from engram_viz.viz.token_labels import token_label


def _cividis(value: float):
    return colormaps[HEAT_CMAP](float(np.clip(value, 0.0, 1.0)))


def _plotly():
    try:
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots
    except ImportError as err:  # pragma: no cover - plotly is in the notebook extra
        raise ImportError("interactive figures need plotly: pip install 'engram-viz[notebook]'") from err
    return go, make_subplots


def _plotly_text(piece: str) -> str:
    """One token's label safe for plotly's pseudo-HTML text (so '<br>' in code shows as text)."""
    return html.escape(token_label(piece), quote=False)


def _heatmap_rows(
    tables: list[pd.DataFrame],
    layers: list[int],
    prompt,
    rows: pd.DataFrame | None,
    tokens: list[str],
    where: list[str],
) -> tuple[list, list[str], list]:
    """Per (layer, stream): the gates ``[C]`` of the columns (one per token, one per image span;
    None for a span), the row label and the hover data ``[C, 4]`` (token, exposure, the 24 row
    ids, the position(s)). ``tables``: one row per column (a span's first position)."""
    base = tables[0]
    n, image, positions = len(base), base["is_image"].to_numpy(), base.index.to_numpy()
    z, ylabels, custom = [], [], []
    for lay, table in zip(layers, tables):
        if len(table) != n:
            raise FrameError(
                f"prompt {prompt!r} has {len(table)} positions at layer {lay} but {n} at layer {layers[0]}"
            )
        exposure = table["exposure"].astype(int).astype(str).tolist() if "exposure" in table else ["n/a"] * n
        row_text = row_ids_text(rows, prompt, lay, sep="<br>")
        ids = [
            "gates 0 (masked)" if img else row_text.get(int(p), "row ids: pass rows=")
            for p, img in zip(positions, image)
        ]
        for s in stream_columns(table):
            values = table[s].to_numpy(dtype=float)
            z.append([None if img else float(v) for v, img in zip(values, image)])
            ylabels.append(f"L{lay} s{int(s)}")
            custom.append([[tok, f"{e}/24", r, w] for tok, e, r, w in zip(tokens, exposure, ids, where)])
    return z, ylabels, custom


def _token_strip(go, fig, base: pd.DataFrame, tokens: list[str], custom: list, layer: int, muted: str) -> None:
    """Row 1: one cell per column (token or image span) coloured by the mean gate, its label on it."""
    image, columns = base["is_image"].to_numpy(), np.arange(len(base))
    strip = reduce_streams(base, "mean")
    fig.add_trace(
        go.Heatmap(
            z=[[None if img else float(v) for v, img in zip(strip, image)]],
            x=columns,
            y=["tokens"],
            zmin=0,
            zmax=1,
            colorscale=HEAT_CMAP.capitalize(),
            showscale=False,
            xgap=1,
            hoverongaps=False,
            customdata=np.array([custom], dtype=object),
            hovertemplate="token %{customdata[0]}<br>%{customdata[3]}<br>mean gate (layer "
            f"{layer}) %{{z:.3f}}<br>collision exposure %{{customdata[1]}}<extra></extra>",
        ),
        row=1,
        col=1,
    )
    for c, tok, img, v in zip(columns, tokens, image, strip):
        fig.add_annotation(
            x=c,
            y="tokens",
            text=f"<i>{tok}</i>" if img else tok,
            textangle=-90,
            showarrow=False,
            xref="x",
            yref="y",
            font={"size": 11, "color": muted if img else text_color_on(_cividis(v))},
        )


def _themed(fig, t, title: str, width: int, height: int, bottom: int):
    """The theme's colours, font and margins on a plotly figure; returns it."""
    fig.update_layout(
        template=t.plotly_template,
        title={"text": title, "x": 0.01},
        width=width,
        height=height,
        paper_bgcolor=t.background,
        plot_bgcolor=t.image,
        font={"family": HTML_FONT_STACK, "color": t.foreground},
        margin={"l": 60, "r": 20, "t": 50, "b": bottom},
    )
    return fig


def gate_heatmap_interactive(
    gates: pd.DataFrame,
    prompt: str | None = None,
    *,
    layer: int | Sequence[int] | None = None,
    rows: pd.DataFrame | None = None,
    theme: str | Theme = "light",
    width: int | None = None,
    height: int | None = None,
):
    """A plotly figure: a token strip (coloured by the mean gate of the first layer drawn) above a
    (layer, stream) x token gate heatmap, an image span one labelled column. Hover: token,
    position, layer/stream, gate, collision exposure (when the frame has it) and the position's 24
    row ids (when ``rows`` is given).

    gates: prompt, position, token, is_image, layer, stream, gate [+ exposure];
    rows (optional): prompt, position, layer, order, head, row.
    """
    go, make_subplots = _plotly()
    require_columns(gates, GATE_COLUMNS, "gates")
    prompt = pick_one(gates, "prompt", prompt, "gates")
    layers = pick_layers(gates, layer, "gates")
    t = get_theme(theme)
    tables = [gate_table(gates, prompt, lay) for lay in layers]
    axis = token_axis(tables[0]["token"].tolist(), tables[0]["is_image"].to_numpy())  # an image span: one column
    first = [a for a, _ in axis.spans]
    positions = tables[0].index.to_numpy()
    where = [
        f"position {positions[a]}" if a == b else f"positions {positions[a]}-{positions[b]}" for a, b in axis.spans
    ]
    tables = [tb.iloc[first] for tb in tables]
    tokens = [html.escape(label, quote=False) for label in axis.labels]
    z, ylabels, custom = _heatmap_rows(tables, layers, prompt, rows, tokens, where)
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, row_heights=[0.3, 0.7], vertical_spacing=0.02)
    _token_strip(go, fig, tables[0], tokens, custom[0], layers[0], t.muted)
    fig.add_trace(
        go.Heatmap(
            z=z,
            x=np.arange(len(axis)),
            y=ylabels,
            zmin=0,
            zmax=1,
            colorscale=HEAT_CMAP.capitalize(),
            xgap=1,
            hoverongaps=False,
            customdata=np.array(custom, dtype=object),
            colorbar={"title": {"text": "gate"}, "len": 0.8, "y": 0.42},
            hovertemplate="token %{customdata[0]}<br>%{customdata[3]}<br>%{y}<br>gate %{z:.4f}"
            "<br>collision exposure %{customdata[1]}<br>%{customdata[2]}<extra></extra>",
        ),
        row=2,
        col=1,
    )
    fig.update_xaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(showgrid=False, zeroline=False)
    fig.update_yaxes(autorange="reversed", row=2, col=1)
    fig.update_yaxes(showticklabels=False, row=1, col=1)
    ticks = list(range(0, len(axis), max(1, len(axis) // 20)))
    fig.update_xaxes(title_text="token (an image span is one column)", row=2, col=1)
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[where[c].split()[-1] for c in ticks], row=2, col=1)
    fig = _themed(
        fig,
        t,
        f"{html.escape(str(prompt))}: gates per stream (image positions grey)",
        width or int(np.clip(160 + 26 * len(tokens), 600, 1800)),
        height or 250 + 30 * len(ylabels),
        bottom=40,
    )
    return stamp(fig, gates)


def gate_difference_interactive(
    diff: pd.DataFrame, *, theme: str | Theme = "light", width: int | None = None, height: int | None = None
):
    """A plotly heatmap of gate B - gate A per aligned token (x) and (layer, stream) (y); hover shows
    both tokens, their positions and the two gates. Diverging map scaled to the largest absolute
    difference (at least 0.05); tokens only in one prompt are gaps.

    diff: pair, kind, position_a, position_b, token_a, token_b, layer, stream, gate_a, gate_b, diff
    (``engram_viz.analysis.gates.comparison.gate_difference``).
    """
    go, _ = _plotly()
    matrix, rows, labels, scale = diff_matrix(diff)
    t = get_theme(theme)
    a, b = diff.attrs.get("prompts", ("A", "B"))
    first = diff.drop_duplicates("pair").set_index("pair").sort_index()
    info = [
        f"{b} {_plotly_text(tb) if pb >= 0 else '-'} (pos {pb if pb >= 0 else '-'}) / "
        f"{a} {_plotly_text(ta) if pa >= 0 else '-'} (pos {pa if pa >= 0 else '-'}), {kind}"
        for ta, tb, pa, pb, kind in zip(
            first["token_a"], first["token_b"], first["position_a"], first["position_b"], first["kind"]
        )
    ]
    z = [[None if not np.isfinite(v) else float(v) for v in row] for row in matrix]
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=list(range(len(labels))),
            y=rows,
            zmin=-scale,
            zmax=scale,
            colorscale="RdBu_r",  # ColorBrewer RdBu: colour-blind safe
            xgap=1,
            hoverongaps=False,
            customdata=np.array([info] * len(rows), dtype=object),
            colorbar={"title": {"text": f"{b} - {a}"}},
            hovertemplate="%{customdata}<br>%{y}<br>difference %{z:+.4f}<extra></extra>",
        )
    )
    fig.update_xaxes(
        tickmode="array",
        tickvals=list(range(len(labels))),
        ticktext=[_plotly_text(s) for s in labels],
        tickangle=-90,
        showgrid=False,
        zeroline=False,
    )
    fig.update_yaxes(autorange="reversed", showgrid=False, zeroline=False)
    fig = _themed(
        fig,
        t,
        f"gate {html.escape(str(b))} - gate {html.escape(str(a))} per aligned token",
        width or int(np.clip(160 + 18 * len(labels), 600, 1800)),
        height or 220 + 26 * len(rows),
        bottom=80,
    )
    return stamp(fig, diff)
