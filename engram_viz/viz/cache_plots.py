"""matplotlib figures of row caches: hit rate against cache size, one line per policy.

Takes the ``hit_rates`` frame of :func:`engram_viz.analysis.caches.simulate.simulate_trace` first
(layer, scope, mode, policy, cache_rows, cache_bytes, hit_rate, best_hit_rate), one panel per
Engram layer; Belady's optimum is drawn dashed (the offline bound no online policy passes), the
hit rate of an infinite cache (only first reads miss) dotted, and named sizes (the caches serving
ports ship) as vertical marks. A policy whose line is another's, point for point (LFU and SIEVE
on Engram traces), is drawn under it: the legend says so (``SIEVE (= LFU)``). Draws into ``ax`` when given, else into a new themed figure, and
returns its Axes either way.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engram_viz.errors import FrameError
from engram_viz.viz.figure_axes import AxesArg, drawn, legend, plot_axes
from engram_viz.viz.frames import pick_layers, require_columns
from engram_viz.viz.style import Theme

HIT_RATE_COLUMNS = ["layer", "scope", "mode", "policy", "cache_rows", "cache_bytes", "hit_rate", "best_hit_rate"]
BOUND = "Belady"


def hit_rate_vs_size(
    hit_rates: pd.DataFrame,
    *,
    layer: int | Sequence[int] | None = None,
    scope: str = "all",
    mode: str = "token",
    marks: Mapping[str, int] | None = None,
    ax: AxesArg = None,
    theme: str | Theme = "light",
    width: float = 7.0,
) -> np.ndarray | Axes | Sequence[Axes]:
    """Hit rate against cache size (bytes, log scale) for one ``scope`` and ``mode``, one line per
    policy, one panel per layer. ``marks``: label -> cache bytes, drawn as vertical lines."""
    require_columns(hit_rates, HIT_RATE_COLUMNS, "hit_rates")
    sel = hit_rates[(hit_rates["scope"] == scope) & (hit_rates["mode"] == mode)]
    if not len(sel):
        raise FrameError(
            f"hit_rates has no rows of scope {scope!r} and mode {mode!r}; it has scopes "
            f"{sorted(set(hit_rates['scope']))} and modes {sorted(set(hit_rates['mode']))}"
        )
    layers = pick_layers(sel, layer, "hit_rates")

    def make(fig: Figure):
        return fig.subplots(1, len(layers), squeeze=False, sharey=True)[0]

    with plot_axes(ax, theme, (width, 3.4), len(layers), make) as (fig, t, axes):
        handles, labels = [], []
        for panel, lay in zip(axes, layers):
            at = sel[sel["layer"] == lay]
            policies = list(dict.fromkeys(at["policy"]))
            seen: dict[str, list] = {}  # policy -> its (bytes, hit rate) points
            for k, policy in enumerate(policies):
                line = at[at["policy"] == policy].sort_values("cache_bytes")
                points = list(zip(line["cache_bytes"], line["hit_rate"]))
                same = [p for p, other in seen.items() if other == points]
                seen[policy] = points
                bound = policy == BOUND
                (h,) = panel.plot(
                    line["cache_bytes"],
                    line["hit_rate"],
                    marker="o",
                    markersize=3,
                    linestyle="--" if bound else "-",
                    color=t.foreground if bound else t.palette[k % len(t.palette)],
                    linewidth=1.6 if bound else 1.2,
                )
                if lay == layers[0]:
                    handles.append(h)
                    labels.append(f"{policy} (optimum)" if bound else f"{policy} (= {same[0]})" if same else policy)
            best = float(at["best_hit_rate"].iloc[0])
            panel.axhline(best, color=t.muted, linestyle=":", linewidth=1)
            panel.text(at["cache_bytes"].min(), best, " infinite cache", va="bottom", fontsize=7, color=t.muted)
            for label, size in (marks or {}).items():
                panel.axvline(size, color=t.grid, linewidth=1)
                panel.text(size, 0.02, f" {label}", rotation=90, fontsize=6.5, color=t.muted, va="bottom")
            panel.set_xscale("log")
            panel.set_xlabel("cache size (bytes a table)")
            panel.set_title(f"layer {lay}", loc="left")
            panel.set_ylim(0, 1)
        axes[0].set_ylabel(f"hit rate ({mode}, {scope} rows)")
        legend(fig, axes, ax is None, handles, labels, ncols=min(len(labels), 4))
    return drawn(axes[0] if len(axes) == 1 else np.asarray(axes, dtype=object), ax, hit_rates)
