"""Write figures to disk, atomically: PDF / SVG / PNG (matplotlib), HTML (plotly with plotly.js
inlined, or the token-coloured text page) and PNG / SVG / PDF of plotly figures via kaleido 1.x.

Every file goes through the suite's one atomic writer (``engram_viz._files``): a temporary file in
the target folder moved into place, so an interrupted export never leaves a partial file (an older
file of the same name stays as it was). Plotly static export needs a Chrome/Chromium: kaleido's choreographer
finds Debian's ``/usr/bin/chromium`` on the PATH, or the one named by ``BROWSER_PATH``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import shutil
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib
from matplotlib.figure import Figure

from engram_viz._files import atomic_write_bytes, atomic_write_text, atomic_writer
from engram_viz.errors import BrowserNotFoundError, ExportError, InputError, InputTypeError
from engram_viz.viz.stamps import PROVENANCE, stamp_text
from engram_viz.viz.style import figure_of, paper_rc
from engram_viz.viz.tokens import TokenView

MATPLOTLIB_FORMATS = ("pdf", "svg", "png")
PLOTLY_FORMATS = ("html", "png", "svg", "pdf")
TOKEN_VIEW_FORMATS = ("html", "png", "pdf", "svg")
DEFAULT_FORMATS = {
    "matplotlib": ("pdf", "svg", "png"),
    "plotly": ("html", "png", "svg"),
    "token_view": ("html", "png", "pdf", "svg"),
    "html": ("html",),
}
_SUPPORTED = {
    "matplotlib": MATPLOTLIB_FORMATS,
    "plotly": PLOTLY_FORMATS,
    "token_view": TOKEN_VIEW_FORMATS,
    "html": ("html",),
}
# A remote script, stylesheet or font (http:, https: or protocol-relative //host).
_REMOTE = re.compile(
    r"""<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*["']?\s*(?:https?:)?//""", re.IGNORECASE
)
_EXPORT_ONLY_RC = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none", "svg.hashsalt": "engram-viz"}


def _metadata(fmt: str, provenance: str | None) -> dict[str, Any]:
    """The file's metadata: the provenance a stamp shows (PDF Subject, SVG Description, PNG
    Description), the creator, and no dates (files are reproducible)."""
    about = {"pdf": "Subject", "svg": "Description", "png": "Description"}[fmt]
    base: dict[str, Any] = {"pdf": {"CreationDate": None, "Creator": "engram-viz"}, "svg": {"Date": None}}.get(fmt, {})
    return base | ({about: provenance} if provenance else {})


def save_matplotlib(
    fig: Any, path: str | os.PathLike, *, dpi: float = 200, fmt: str | None = None, stamp: bool = True
) -> Path:
    """Save a matplotlib figure as PDF, SVG or PNG (format from ``fmt`` or the suffix); ``fig`` may
    be what a plot returned (an Axes or an array of them): their figure is saved.

    PDF embeds TrueType fonts (fonttype 42), SVG keeps text as text (fonttype 'none'), PNG is
    ``int(width_in * dpi) x int(height_in * dpi)`` pixels. Figures of ``engram_viz.viz`` are
    saved under their theme's settings; dates are left out so that files are reproducible. The
    provenance a figure is stamped with goes into the file's metadata; ``stamp=False`` leaves the
    stamp off the picture (the figure cropped to what is drawn), the metadata still says it.
    """
    fig, fmt = figure_of(fig), _format_of(path, fmt)
    if fmt not in MATPLOTLIB_FORMATS:
        raise InputError(f"a matplotlib figure exports as {list(MATPLOTLIB_FORMATS)}, not {fmt!r} ({path})")
    theme = getattr(fig, "engram_viz_theme", None)
    rc = paper_rc(theme) if theme else _EXPORT_ONLY_RC
    metadata = _metadata(fmt, getattr(fig, PROVENANCE, None))
    drawn = stamp_text(fig)
    hide = drawn is not None and not stamp and drawn.get_visible()
    crop = {"bbox_inches": "tight", "pad_inches": 0.03} if hide else {}
    try:
        if hide:
            drawn.set_visible(False)
        with matplotlib.rc_context(rc), atomic_writer(path, "wb") as fh:
            fig.savefig(fh, format=fmt, dpi=dpi, metadata=metadata, **crop)
    finally:
        if hide:
            drawn.set_visible(True)
    return Path(path)


def check_offline_html(document: str, what: str = "HTML") -> None:
    """Raise ValueError if ``document`` loads a script, stylesheet, image or frame from the network."""
    found = _REMOTE.search(document)
    if found:
        raise InputError(f"{what} would load {found.group(0)!r}... from the network; expected a self-contained page")


def save_html(document: str, path: str | os.PathLike) -> Path:
    """Write a self-contained HTML document (checked: nothing loaded from the network)."""
    if not isinstance(document, str):
        raise InputTypeError(f"an HTML document must be a str, got {type(document).__name__}")
    check_offline_html(document, f"HTML for {path}")
    return atomic_write_text(path, document)


def plotly_html(fig) -> str:
    """A complete HTML page of a plotly figure with plotly.js inlined (no CDN, no MathJax)."""
    div_id = "engram-viz-" + hashlib.sha1(fig.to_json().encode("utf-8")).hexdigest()[:12]  # stable diffs
    return fig.to_html(
        full_html=True,
        include_plotlyjs=True,
        include_mathjax=False,
        div_id=div_id,
        config={"displaylogo": False, "responsive": True},
    )


def _choreographer_browser() -> str | None:
    try:
        from choreographer.browsers.chromium import Chromium

        found = Chromium.find_browser(skip_local=False)
    except Exception:  # noqa: BLE001 - an internal of choreographer; the caller falls back to the PATH
        return None
    return str(found) if found else None


def chromium_path() -> str | None:
    """The Chrome/Chromium kaleido would use (``BROWSER_PATH``, the PATH, typical places, a
    browser fetched by ``plotly_get_chrome``), or None."""
    found = _choreographer_browser()
    if found:
        return found
    env = os.environ.get("BROWSER_PATH")
    if env and os.access(env, os.X_OK):
        return env
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _figure_size(fig, width: int | None, height: int | None) -> tuple[int, int]:
    w = width or fig.layout.width or 900
    h = height or fig.layout.height or 600
    return int(w), int(h)


def render_plotly(
    fig, formats: Sequence[str], *, width: int | None = None, height: int | None = None, scale: float = 1.0
) -> list[bytes]:
    """Bytes of a plotly figure in each of ``formats`` ('png', 'svg', 'pdf'), rendered by kaleido in
    one browser session (MathJax off, plotly.js from the local plotly package: no network)."""
    for fmt in formats:
        if fmt not in ("png", "svg", "pdf"):
            raise InputError(f"plotly static export makes png, svg or pdf, not {fmt!r}")
    try:
        import kaleido
    except ImportError as err:
        raise ExportError("plotly static export needs kaleido>=1: pip install 'engram-viz[notebook]'") from err
    if chromium_path() is None:
        raise BrowserNotFoundError(
            "plotly PNG/SVG/PDF export needs Chrome or Chromium and none was found: install Debian's chromium "
            "(./.ci/system-deps.sh) or point BROWSER_PATH at a Chrome executable"
        )
    w, h = _figure_size(fig, width, height)
    specs = [{"format": fmt, "width": w, "height": h, "scale": scale} for fmt in formats]

    async def render() -> list[bytes]:
        async with kaleido.Kaleido(n=1, mathjax=False) as k:
            return [await k.calc_fig(fig, opts=spec) for spec in specs]

    # A thread of its own, so that this also works under a running event loop (Jupyter).
    result: dict[str, Any] = {}

    def run() -> None:
        try:
            result["out"] = asyncio.run(render())
        except BaseException as err:  # noqa: BLE001 - handed to the caller below
            result["err"] = err

    worker = threading.Thread(target=run, name="engram-viz-kaleido")
    worker.start()
    worker.join()
    if "err" in result:
        raise ExportError(f"kaleido failed to render {', '.join(formats)}: {result['err']}") from result["err"]
    return result["out"]


def save_plotly_image(
    fig,
    path: str | os.PathLike,
    *,
    width: int | None = None,
    height: int | None = None,
    scale: float = 1.0,
    fmt: str | None = None,
) -> Path:
    """Save a plotly figure as PNG, SVG or PDF via kaleido; PNG is ``width*scale x height*scale``
    pixels (``width`` / ``height`` default to the figure's layout, else 900 x 600)."""
    fmt = _format_of(path, fmt)
    (data,) = render_plotly(fig, [fmt], width=width, height=height, scale=scale)
    return atomic_write_bytes(path, data)


def _format_of(path: str | os.PathLike, fmt: str | None) -> str:
    fmt = (fmt or Path(path).suffix.lstrip(".")).lower()
    if not fmt:
        raise InputError(f"cannot tell the format of {str(path)!r}: give it a suffix (.pdf, .svg, .png, .html)")
    return fmt


def _is_plotly(fig) -> bool:
    return type(fig).__module__.startswith("plotly") and hasattr(fig, "to_plotly_json")


def figure_kind(fig) -> str:
    """'matplotlib' (a Figure, or the Axes a plot returned), 'plotly', 'token_view' or 'html' (a str
    holding an HTML document)."""
    fig = figure_of(fig)
    if isinstance(fig, Figure):
        return "matplotlib"
    if isinstance(fig, TokenView):
        return "token_view"
    if isinstance(fig, str):
        return "html"
    if _is_plotly(fig):
        return "plotly"
    raise InputTypeError(
        f"cannot export a {type(fig).__module__}.{type(fig).__name__}; expected a matplotlib Figure, a plotly "
        "Figure, a TokenView or an HTML str"
    )


def save_figure(
    fig,
    path: str | os.PathLike,
    *,
    dpi: float = 200,
    width: int | None = None,
    height: int | None = None,
    scale: float = 1.0,
    stamp: bool = True,
) -> Path:
    """Save any supported figure to ``path``, the format taken from the suffix (a plot's Axes saves
    its figure): ``ev.save_figure(ax, "fig.pdf")``. ``dpi`` applies to matplotlib output,
    ``width`` / ``height`` / ``scale`` to plotly static output; ``stamp=False`` leaves a matplotlib
    figure's provenance stamp off the picture and in the file's metadata only."""
    fig = figure_of(fig)
    kind, fmt = figure_kind(fig), _format_of(path, None)
    if fmt not in _SUPPORTED[kind]:
        raise InputError(f"a {kind} figure exports as {list(_SUPPORTED[kind])}, not {fmt!r} ({path})")
    if kind == "matplotlib":
        return save_matplotlib(fig, path, dpi=dpi, stamp=stamp)
    if kind == "html":
        return save_html(fig, path)
    if kind == "token_view":
        if fmt == "html":
            return save_html(fig.html(full_page=True), path)
        return save_matplotlib(fig.figure(), path, dpi=dpi, stamp=stamp)
    if fmt == "html":
        return save_html(plotly_html(fig), path)
    return save_plotly_image(fig, path, width=width, height=height, scale=scale)


def export_all(
    fig,
    stem: str | os.PathLike,
    formats: Sequence[str] | None = None,
    *,
    dpi: float = 200,
    width: int | None = None,
    height: int | None = None,
    scale: float = 1.0,
    stamp: bool = True,
) -> list[Path]:
    """Write ``fig`` as ``stem.<format>`` for each format and return the paths in that order; a
    plot's Axes (or its array of Axes) writes its figure: ``export_all(ax, stem)``.

    Default formats: matplotlib pdf, svg, png; plotly html, png, svg; TokenView html, png, pdf,
    svg. ``stamp=False`` as in :func:`save_figure`. Each file is written atomically; plotly static
    formats share one browser session. Raises
    before writing anything when a format is not supported for the figure.
    """
    fig = figure_of(fig)
    kind = figure_kind(fig)
    wanted = [f.lower().lstrip(".") for f in (formats or DEFAULT_FORMATS[kind])]
    bad = [f for f in wanted if f not in _SUPPORTED[kind]]
    if bad:
        raise InputError(f"a {kind} figure exports as {list(_SUPPORTED[kind])}, not {bad}")
    if len(set(wanted)) != len(wanted):
        raise InputError(f"formats repeat: {wanted}")
    stem = Path(stem)
    if stem.suffix.lstrip(".").lower() in {*MATPLOTLIB_FORMATS, *PLOTLY_FORMATS}:
        stem = stem.with_suffix("")  # 'fig.png' as a stem means 'fig'
    paths = {fmt: stem.with_name(f"{stem.name}.{fmt}") for fmt in wanted}
    static = [f for f in wanted if kind == "plotly" and f != "html"]
    rendered = dict(zip(static, render_plotly(fig, static, width=width, height=height, scale=scale))) if static else {}
    figure = fig.figure() if kind == "token_view" and set(wanted) - {"html"} else None
    for fmt in wanted:
        if fmt in rendered:
            atomic_write_bytes(paths[fmt], rendered[fmt])
        elif figure is not None and fmt != "html":
            save_matplotlib(figure, paths[fmt], dpi=dpi, stamp=stamp)
        else:
            save_figure(fig, paths[fmt], dpi=dpi, width=width, height=height, scale=scale, stamp=stamp)
    return [paths[f] for f in wanted]
