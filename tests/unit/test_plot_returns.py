"""Every public matplotlib plot of engram_viz.viz returns its Axes, whether it made its figure or was
given ``ax=``: one Axes for a one-panel plot, an array of Axes for a multi-panel one (the caller's
``ax`` itself when given); ``.figure`` reaches the figure. Small hand-made frames, no model."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pandas as pd
import pytest
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from engram_viz import viz
from engram_viz.analysis.explain.explanation import GROUP_COLUMNS
from engram_viz.viz.export import export_all
from engram_viz.viz.frames import COLLISION_COLUMNS, COVERAGE_COLUMNS
from engram_viz.viz.stamps import stamp

pytestmark = pytest.mark.unit

LAYERS, ORDERS, HEADS, PRIME = (1, 3), (2, 3, 4), 8, 101


def _gates() -> pd.DataFrame:
    recs = []
    for pid, tokens in (("a", ["x", " y", " z"]), ("b", ["u", "<image>", " v"])):
        for pos, tok in enumerate(tokens):
            for layer, stream in itertools.product(LAYERS, range(4)):
                gate = 0.0 if tok == "<image>" else 0.1 * (pos + stream)
                recs.append((pid, pos, tok, tok == "<image>", layer, stream, gate, pos, "cat-" + pid))
    cols = ["prompt", "position", "token", "is_image", "layer", "stream", "gate", "exposure", "category"]
    return pd.DataFrame(recs, columns=cols)


def _columns() -> list[tuple[int, int, int]]:
    return list(itertools.product(LAYERS, ORDERS, range(HEADS)))


def _frames() -> types.SimpleNamespace:
    gates = _gates()
    collisions = pd.DataFrame(
        [(lay, o, h, PRIME, 10, 9, 1, 9.6, 0.4) for lay, o, h in _columns()],
        columns=list(COLLISION_COLUMNS),
    )
    coverage = pd.DataFrame(
        [(lay, o, h, PRIME, 5, 5 / PRIME) for lay, o, h in _columns()], columns=list(COVERAGE_COLUMNS)
    )
    heads = pd.DataFrame(
        [(lay, o, k, 10.0 / (k + 1), 9.0 / (k + 1)) for lay, o, k in itertools.product(LAYERS, ORDERS, range(9))],
        columns=["layer", "order", "heads_shared", "ngrams", "expected_ngrams"],
    )
    diff = pd.DataFrame(
        [
            (p, "match", "a", "b", lay, s, 0.1 * p - 0.05 * s)
            for p, lay, s in itertools.product(range(3), LAYERS, range(4))
        ],
        columns=["pair", "kind", "token_a", "token_b", "layer", "stream", "diff"],
    )
    groups = pd.DataFrame(
        [
            ("p", 3, " Great", 1, kind, g, s, 0.7, 0.2 * g - s, 1.0, 0.5, 0.6, 0.1 * g if kind == "order" else np.nan)
            for kind, gs in (("order", ORDERS), ("head", range(HEADS)))
            for g, s in itertools.product(gs, range(4))
        ],
        columns=list(GROUP_COLUMNS),
    )
    profile = pd.DataFrame(
        [("p", i, c, 1, o, 0.1 * o) for i, c in enumerate(["entity", "function"]) for o in ORDERS],
        columns=["prompt", "position", "token_class", "layer", "order", "shapley"],
    )
    summary = pd.DataFrame(
        [(lay, g, 5, 0.2 + 0.1 * i) for lay in LAYERS for i, g in enumerate(["often", "seldom", "never", "random"])],
        columns=["layer", "group", "n", "mean_gate"],
    )
    curve = pd.DataFrame(
        [(lay, b, 3, 0.2 + 0.1 * i) for lay in LAYERS for i, b in enumerate(["0", "1-4", "5+"])],
        columns=["layer", "count_bin", "n", "mean_gate"],
    )
    loss = pd.DataFrame(
        {"prompt": "p", "position": [0, 1], "next_token": ["a", " b"], "loss": [1.0, 2.0]}
        | {"loss_ablated": [1.5, 2.5], "loss_engram_off": [1.2, 2.2]}
    )
    orders = pd.DataFrame({"layer": 1, "order": [2, 3, 4], "n_colliding": [0, 3, 8], "d_gate": [0.0, 0.1, 0.3]})
    usage = pd.DataFrame({"layer": [1, 1, 3], "row": [0, 5, 7], "hits": [2, 1, 4]})
    hit_rates = pd.DataFrame(
        [
            (lay, "all", "token", p, r, 264 * r, h, 0.5)
            for lay in LAYERS
            for p, h in (("LRU", 0.2), ("Belady", 0.3))
            for r in (10, 100)
        ],
        columns=["layer", "scope", "mode", "policy", "cache_rows", "cache_bytes", "hit_rate", "best_hit_rate"],
    )
    quality = pd.DataFrame(
        [("fp8", 8.25, 98.0, 0.0, 0.0), ("Q4_0", 4.5, 53.5, 2e-3, 0.04)],
        columns=["candidate", "bits_per_weight", "table_gb", "kl", "gate_change_p99"],
    )
    twins = pd.DataFrame(
        [
            ("p", pos, f"t{pos}", lay, s, 0.1 * pos - 0.05 * s)
            for pos, lay, s in itertools.product((5, 6), LAYERS, range(4))
        ],
        columns=["prompt", "position", "token", "layer", "stream", "difference"],
    )
    return types.SimpleNamespace(**locals())


# name: (how to draw it into ``ax``, panels drawn)
PLOTS = {
    "gate_heatmap": (lambda f, ax: viz.gate_heatmap(f.gates, "a", ax=ax), 1),
    "gate_distributions": (lambda f, ax: viz.gate_distributions(f.gates, ax=ax), len(LAYERS)),
    "exposure_beside_gates": (lambda f, ax: viz.exposure_beside_gates(f.gates, "b", ax=ax), 2 * len(LAYERS)),
    "gate_difference_heatmap": (lambda f, ax: viz.gate_difference_heatmap(f.diff, ax=ax), 1),
    "collisions_vs_expected": (lambda f, ax: viz.collisions_vs_expected(f.collisions, ax=ax), len(LAYERS)),
    "heads_shared_vs_expected": (
        lambda f, ax: viz.heads_shared_vs_expected(f.heads, ax=ax),
        len(LAYERS) * len(ORDERS),
    ),
    "coverage_per_column": (lambda f, ax: viz.coverage_per_column(f.coverage, ax=ax), len(LAYERS)),
    "row_rank_frequency": (lambda f, ax: viz.row_rank_frequency(f.usage, ax=ax), 1),
    "touched_rows_map": (lambda f, ax: viz.touched_rows_map(f.usage, "tiny", bins=16, ax=ax), len(LAYERS)),
    "attribution_bars": (lambda f, ax: viz.attribution_bars(f.groups, 3, ax=ax), 2),
    "order_profile_plot": (lambda f, ax: viz.order_profile_plot(f.profile, ax=ax), 1),
    "gate_vs_memory": (lambda f, ax: viz.gate_vs_memory(f.summary, f.curve, {1: 0.5, 3: 0.2}, ax=ax), 2),
    "loss_change_by_token": (lambda f, ax: viz.loss_change_by_token(f.loss, "p", ax=ax), 1),
    "gate_change_vs_colliding_heads": (lambda f, ax: viz.gate_change_vs_colliding_heads(f.orders, ax=ax), 1),
    "picture_twin_plot": (lambda f, ax: viz.picture_twin_plot(f.twins, ax=ax), len(LAYERS)),
    "quality_vs_bits": (lambda f, ax: viz.quality_vs_bits(f.quality, ax=ax), 2),
    "hit_rate_vs_size": (lambda f, ax: viz.hit_rate_vs_size(f.hit_rates, marks={"16,384 rows": 264 * 16384}, ax=ax), 2),
}


@pytest.fixture(scope="module")
def frames() -> types.SimpleNamespace:
    return _frames()


def test_every_public_matplotlib_plot_is_covered():
    """Each plot of ``viz.__all__`` drawn from a ``*_plots`` module, but the plotly ones."""
    public = {
        name
        for name in viz.__all__
        if getattr(getattr(viz, name), "__module__", "").endswith("_plots") and not name.endswith("_interactive")
    }
    assert public == set(PLOTS)


@pytest.mark.parametrize("name", sorted(PLOTS))
def test_plot_returns_its_axes_with_and_without_ax(frames, name):
    draw, n = PLOTS[name]
    made = draw(frames, None)
    if n == 1:
        assert isinstance(made, Axes), type(made)
    else:
        assert isinstance(made, np.ndarray) and made.size == n and all(isinstance(a, Axes) for a in made.flat)
    fig = made.figure if n == 1 else made.flat[0].figure
    assert isinstance(fig, Figure) and fig.engram_viz_theme == "light"
    assert all(a.figure is fig for a in np.ravel(made))
    given = Figure().subplots(n, 1) if n > 1 else Figure().add_subplot()
    assert draw(frames, given) is given


def test_an_axes_exports_and_stamps_its_figure(frames, tmp_path):
    ax = viz.gate_heatmap(frames.gates, "a")
    assert stamp(ax, "a model") is ax
    assert "a model" in [t.get_text() for t in ax.figure.texts]
    axes = viz.gate_vs_memory(frames.summary, frames.curve, {1: 0.5})
    assert stamp(axes, "another") is axes and "another" in [t.get_text() for t in axes[0].figure.texts]
    (png,) = export_all(axes, tmp_path / "memory", ["png"], dpi=30)
    (again,) = export_all(axes[0].figure, tmp_path / "memory_fig", ["png"], dpi=30)
    assert png.read_bytes() == again.read_bytes()
