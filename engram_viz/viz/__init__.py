"""Figures of the suite, one style, light and dark themes.

Paper figures (matplotlib: ``gate_plots``, ``collision_plots``, ``usage_plots``, ``token_figure``),
each taking a tidy frame with the library's own column names first; all but the token text accept
``ax=`` (draw into the given axes, else into a new themed figure) and return their Axes either way
(a multi-panel plot an array of them; ``ax.figure`` is the figure). The token text is laid out over
a whole figure and returns that ``Figure``:

- ``token_text_figure(gates, ...)``      token-coloured text (Engram paper Figure 7 style)
- ``gate_heatmap(gates, ...)``           stream x position gates of one prompt
- ``gate_distributions(gates, by=...)``  gates per category / prompt, per stream and layer
- ``exposure_beside_gates(gates, ...)``  collision exposure under the gate heatmap
- ``gate_difference_heatmap(diff)``      gate of prompt B minus prompt A per aligned token
- ``collisions_vs_expected(collisions)`` observed vs uniform-hash colliding buckets per head
- ``heads_shared_vs_expected(heads)``   n-grams sharing a bucket on k of 8 heads vs a uniform hash
- ``coverage_per_column(coverage)``      rows touched / prime per (order, head)
- ``row_rank_frequency(usage)``          hits of the r-th most used row, log-log
- ``touched_rows_map(usage, layout)``    touched rows over a layer's address space, binned
- ``hit_rate_vs_size(hit_rates)``        row-cache hit rate against size, a line per policy
- ``quality_vs_bits(summary)``           KL and gate change p99 against bits per weight, per GGUF type
- ``picture_twin_plot(twins)``           gate difference after a real picture vs its placeholder twin

Exploring (plotly): ``gate_heatmap_interactive(gates, rows=...)``, ``gate_difference_interactive(diff)``. Token-coloured HTML with
tooltips: ``token_html(gates)``; ``token_view(gates)`` shows in a notebook as HTML plus a PNG.
Why this gate and row edits: ``attribution_bars(groups, position)``, ``attribution_bars_interactive``,
``order_profile_plot(profile)``, ``loss_change_by_token(loss, prompt)``,
``gate_change_vs_colliding_heads(orders)``; gate versus memory: ``gate_vs_memory(summary, curve, rho)``.
Every figure drawn from a frame that carries provenance (every frame of a Trace) is stamped with it
(``stamps.stamp``). Save any of them with ``engram_viz.viz.export.export_all(ax, stem)`` (an Axes
writes its figure).
"""

from engram_viz.viz.attribution_plots import attribution_bars, attribution_bars_interactive, order_profile_plot
from engram_viz.viz.cache_plots import hit_rate_vs_size
from engram_viz.viz.collision_plots import collisions_vs_expected, heads_shared_vs_expected
from engram_viz.viz.edit_plots import gate_change_vs_colliding_heads, loss_change_by_token
from engram_viz.viz.gate_plots import exposure_beside_gates, gate_difference_heatmap, gate_distributions, gate_heatmap
from engram_viz.viz.memory_plots import gate_vs_memory
from engram_viz.viz.picture_plots import picture_twin_plot
from engram_viz.viz.plotly_figures import gate_difference_interactive, gate_heatmap_interactive
from engram_viz.viz.quant_plots import quality_vs_bits
from engram_viz.viz.stamps import ProvenanceBox, stamp
from engram_viz.viz.style import (
    THEMES,
    CJKFontMissingError,
    CJKFontWarning,
    Theme,
    cjk_font,
    get_theme,
    paper_rc,
    require_cjk_font,
)
from engram_viz.viz.token_chips import token_cells
from engram_viz.viz.token_figure import token_text_figure
from engram_viz.viz.tokens import TokenView, token_html, token_view
from engram_viz.viz.usage_plots import coverage_per_column, row_rank_frequency, touched_rows_map

__all__ = [
    "THEMES",
    "CJKFontMissingError",
    "CJKFontWarning",
    "ProvenanceBox",
    "Theme",
    "TokenView",
    "attribution_bars",
    "attribution_bars_interactive",
    "cjk_font",
    "collisions_vs_expected",
    "coverage_per_column",
    "exposure_beside_gates",
    "gate_change_vs_colliding_heads",
    "gate_difference_heatmap",
    "gate_difference_interactive",
    "gate_distributions",
    "gate_heatmap",
    "gate_heatmap_interactive",
    "gate_vs_memory",
    "get_theme",
    "heads_shared_vs_expected",
    "hit_rate_vs_size",
    "loss_change_by_token",
    "order_profile_plot",
    "paper_rc",
    "picture_twin_plot",
    "quality_vs_bits",
    "require_cjk_font",
    "row_rank_frequency",
    "stamp",
    "token_cells",
    "token_html",
    "token_text_figure",
    "token_view",
    "touched_rows_map",
]
