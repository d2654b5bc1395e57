"""One look for every figure: themes, fonts (with a CJK fallback), colour maps, frame checks.

Paper settings: TrueType fonts embedded in PDF (``pdf.fonttype = 42``), text kept as text in SVG
(``svg.fonttype = 'none'``), a font family list ``[DejaVu Sans, <CJK font>]`` so that matplotlib
falls back to the CJK font glyph by glyph (Chinese tokens render with real glyphs), and
colour-blind-safe colours: cividis for heatmaps, a single-hue ramp that fades into the background
for token text, the Okabe-Ito palette for streams and categories.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache, lru_cache

import matplotlib
import numpy as np
from cycler import cycler
from matplotlib import colormaps, font_manager
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import Colormap, LinearSegmentedColormap, to_rgb
from matplotlib.figure import Figure

from engram_viz.errors import CJKFontMissingError, CJKFontWarning, InputError

# Preferred CJK families, Simplified Chinese first (Debian: fonts-noto-cjk).
CJK_FAMILIES = (
    "Noto Sans CJK SC",
    "Noto Sans CJK JP",
    "Noto Sans CJK TC",
    "Noto Sans SC",
    "Source Han Sans SC",
    "Source Han Sans CN",
    "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei",
    "Droid Sans Fallback",
    "AR PL UMing CN",
)
LATIN_FAMILY = "DejaVu Sans"  # ships with matplotlib, so always present
# Okabe & Ito (2008): distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442")
HEAT_CMAP = "cividis"
IMAGE_LABEL = "[image]"


@dataclass(frozen=True)
class Theme:
    """Colours of one theme; ``token_ramp`` lists the stops of the token-text colour map."""

    name: str
    background: str
    foreground: str
    muted: str
    grid: str
    image: str  # fill of image (masked) positions
    token_ramp: tuple[str, ...]
    palette: tuple[str, ...]
    plotly_template: str
    panel: str  # fill of boxes on HTML pages (provenance, table headers)
    panel_border: str
    warn_background: str  # a warning box on HTML pages (synthetic weights, a prompt that cannot run)
    warn_border: str
    warn_text: str  # a one-line warning without a box
    positive: str  # a signed bar above zero (a row's share of the gate on HTML pages)
    negative: str  # a signed bar below zero

    @property
    def token_cmap(self) -> Colormap:
        return _ramp(self.name, self.token_ramp)

    @property
    def heat_cmap(self) -> Colormap:
        return colormaps[HEAT_CMAP].with_extremes(bad=self.image)


THEMES: dict[str, Theme] = {
    "light": Theme(
        name="light",
        background="#ffffff",
        foreground="#1a1a1a",
        muted="#6b6b6b",
        grid="#dddddd",
        image="#c8c8c8",
        token_ramp=("#ffffff", "#c6dbef", "#6baed6", "#2171b5", "#08306b"),
        palette=OKABE_ITO,
        plotly_template="plotly_white",
        panel="#f5f7fa",
        panel_border="#dfe3ea",
        warn_background="#fff4e5",
        warn_border="#f0b35b",
        warn_text="#8a4b00",
        positive="#2e86c1",
        negative="#c0392b",
    ),
    "dark": Theme(
        name="dark",
        background="#16181d",
        foreground="#e6e6e6",
        muted="#9a9a9a",
        grid="#3a3d45",
        image="#4a4d55",
        token_ramp=("#16181d", "#0b3a5e", "#1f6fa8", "#56b4e9", "#d8f0ff"),
        palette=("#56B4E9", "#E69F00", "#009E73", "#CC79A7", "#F0E442", "#D55E00", "#0072B2"),
        plotly_template="plotly_dark",
        panel="#1f2229",
        panel_border="#3a3d45",
        warn_background="#3a2c14",
        warn_border="#b07a2a",
        warn_text="#f0b35b",
        positive="#2e86c1",
        negative="#c0392b",
    ),
}


@cache
def _ramp(name: str, stops: tuple[str, ...]) -> Colormap:
    return LinearSegmentedColormap.from_list(f"engram_tokens_{name}", list(stops))


def get_theme(theme: str | Theme) -> Theme:
    """A ``Theme`` by name ('light' or 'dark'), or the one given."""
    if isinstance(theme, Theme):
        return theme
    if theme not in THEMES:
        raise InputError(f"theme {theme!r} is unknown; expected one of {sorted(THEMES)}")
    return THEMES[theme]


def _registered_cjk() -> str | None:
    names = {f.name for f in font_manager.fontManager.ttflist}
    return next((family for family in CJK_FAMILIES if family in names), None)


@lru_cache(maxsize=1)
def cjk_font() -> str | None:
    """Name of an installed CJK-capable font family, or None.

    Looks in matplotlib's font list first; a font installed after matplotlib built its cache
    (e.g. by ``.ci/system-deps.sh``) is found among the system font files and registered.
    """
    found = _registered_cjk()
    if found:
        return found
    keys = ("cjk", "sourcehansans", "wqy", "droidsansfallback", "uming")
    for path in font_manager.findSystemFonts():
        if any(k in path.lower().replace("-", "").replace("_", "") for k in keys):
            try:
                font_manager.fontManager.addfont(path)
            except (OSError, RuntimeError, ValueError):
                continue
    return _registered_cjk()


def require_cjk_font() -> str:
    """The CJK font family name; raises ``CJKFontMissingError`` with the fix when none is installed."""
    name = cjk_font()
    if name is None:
        raise CJKFontMissingError(
            "no CJK-capable font found (looked for " + ", ".join(CJK_FAMILIES[:3]) + ", ...); Chinese tokens "
            "would render as empty boxes. Install Debian's fonts-noto-cjk (./.ci/system-deps.sh)."
        )
    return name


_WARNED_NO_CJK = False


def font_families() -> list[str]:
    """Family fallback list for matplotlib: Latin first, then the CJK font (warns once if absent)."""
    global _WARNED_NO_CJK
    name = cjk_font()
    if name is None:
        if not _WARNED_NO_CJK:
            warnings.warn(
                "no CJK-capable font found; Chinese tokens will render as empty boxes. "
                "Install Debian's fonts-noto-cjk (./.ci/system-deps.sh).",
                CJKFontWarning,
                stacklevel=3,
            )
            _WARNED_NO_CJK = True
        return [LATIN_FAMILY]
    return [LATIN_FAMILY, name]


HTML_FONT_STACK = (
    'system-ui, -apple-system, "Segoe UI", "DejaVu Sans", "Noto Sans CJK SC", "Noto Sans SC", '
    '"Source Han Sans SC", "PingFang SC", "Microsoft YaHei", sans-serif'
)


def paper_rc(theme: str | Theme = "light") -> dict:
    """matplotlib rcParams for paper figures in a theme (apply with ``matplotlib.rc_context``)."""
    t = get_theme(theme)
    return {
        "pdf.fonttype": 42,
        "ps.fonttype": 42,
        "svg.fonttype": "none",
        "svg.hashsalt": "engram-viz",  # stable ids: SVGs of the same figure diff cleanly
        "font.family": font_families(),
        "font.size": 8.5,
        "axes.titlesize": 9.5,
        "axes.labelsize": 8.5,
        "xtick.labelsize": 7.5,
        "ytick.labelsize": 7.5,
        "legend.fontsize": 7.5,
        "legend.frameon": False,
        "axes.unicode_minus": False,
        "figure.facecolor": t.background,
        "axes.facecolor": t.background,
        "savefig.facecolor": "auto",
        "savefig.edgecolor": "auto",
        "text.color": t.foreground,
        "axes.labelcolor": t.foreground,
        "axes.titlecolor": t.foreground,
        "axes.edgecolor": t.muted,
        "xtick.color": t.muted,
        "ytick.color": t.muted,
        "xtick.labelcolor": t.foreground,
        "ytick.labelcolor": t.foreground,
        "grid.color": t.grid,
        "grid.linewidth": 0.5,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": cycler(color=list(t.palette)),
        "image.cmap": HEAT_CMAP,
        "figure.dpi": 100,
        "savefig.dpi": 200,
    }


def text_color_on(rgb: Sequence[float] | str) -> str:
    """Dark or light text, whichever reads better on background ``rgb`` (WCAG relative luminance)."""
    r, g, b = to_rgb(rgb)
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in (r, g, b)]
    luminance = 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    return "#111111" if luminance > 0.22 else "#f5f5f5"


@contextmanager
def themed_figure(theme: str | Theme, figsize: tuple[float, float], layout: str = "constrained"):
    """Yield ``(fig, theme)``: a pyplot-free ``Figure`` built under the theme's rcParams.

    On exit the figure is drawn once without rendering, so that ticks and labels pick up the
    theme's fonts and colours now (a notebook later draws outside the rc context), its layout is
    frozen (every later save gives the same bytes), and it is tagged with
    ``fig.engram_viz_theme`` so that ``engram_viz.viz.export`` saves it under the same settings.
    """
    t = get_theme(theme)
    with matplotlib.rc_context(paper_rc(t)):
        fig = Figure(figsize=figsize, layout=layout)
        FigureCanvasAgg(fig)
        yield fig, t
        fig.draw_without_rendering()
        fig.set_layout_engine("none")  # freeze the layout: later draws and saves are identical
    fig.engram_viz_theme = t.name


def figure_of(drawn: object) -> object:
    """The matplotlib figure of what a plot returned: an Axes, or an array or sequence of them (the
    figure of the first), reaches its ``.figure``; anything else (a Figure, a plotly figure, a
    TokenView) is returned as it is."""
    if isinstance(drawn, (list, tuple, np.ndarray)) and len(drawn):
        first = np.ravel(np.asarray(drawn, dtype=object))[0]
        return first.figure if isinstance(first, Axes) else drawn
    return drawn.figure if isinstance(drawn, Axes) else drawn
