"""The report page: one self-contained HTML string (no scripts, no remote resources).

The report is a list of :class:`Section` (heading, intro, parts), declared by the job
(``apps.report_sections``); a part is a drawn :class:`Figure` (embedded as a PNG data URI, its
files linked relatively), a :class:`Table` (``viz.html_templates.table_html``) or :class:`Html`
(a rendered view, e.g. token-coloured text). :func:`render_html` lays out the provenance, every
section in order and the list of files, from ``templates/report.html.j2``, in the theme's colours.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from engram_viz.viz.html_templates import render, synthetic_warning, table_html
from engram_viz.viz.style import Theme, get_theme

TITLE = "engram-viz report"


@dataclass(frozen=True)
class Figure:
    """A drawn figure: its files (one of them a PNG, embedded in the page), title and caption."""

    name: str
    files: tuple[Path, ...]
    title: str
    caption: str


@dataclass(frozen=True, eq=False)
class Table:
    """A table of the page: the first ``max_rows`` rows of ``frame``, under an optional heading,
    with an optional note below it (what its columns mean)."""

    frame: pd.DataFrame
    heading: str = ""
    max_rows: int = 40
    note: str = ""


@dataclass(frozen=True)
class Html:
    """Rendered HTML (trusted: built by a view of this package), under an optional heading."""

    html: str
    heading: str = ""


@dataclass(frozen=True)
class Section:
    """One section of the report: ``<section id>``, a heading, an intro paragraph and its parts in
    order (:class:`Figure`, :class:`Table`, :class:`Html`; a job's own figure specs before drawing)."""

    id: str
    heading: str
    intro: str = ""
    parts: tuple[Any, ...] = ()


def _png_width(data: bytes) -> int:
    return int.from_bytes(data[16:20], "big")  # the IHDR chunk's width, right after the signature


def _figure_view(fig: Figure, out: Path, dpi: float) -> dict[str, Any]:
    png = next(p for p in fig.files if p.suffix == ".png")
    data = png.read_bytes()
    uri = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    links = [(p.relative_to(out).as_posix(), p.suffix[1:].upper()) for p in fig.files]
    width = round(_png_width(data) / dpi * 96)  # CSS px at the figure's size in inches: one font size on the page
    view = {"kind": "figure", "id": f"fig-{fig.name}", "heading": "", "title": fig.title, "caption": fig.caption}
    return view | {"label": fig.title, "uri": uri, "links": links, "width": width}


def _part_view(part: Figure | Table | Html, out: Path, section: str, k: int, dpi: float) -> dict[str, Any]:
    """What the template shows of one part (``k``-th of ``section``: its anchor when it has a heading)."""
    if isinstance(part, Figure):
        return _figure_view(part, out, dpi)
    anchor = f"{section}-{k}"
    if isinstance(part, Table):
        html = table_html(part.frame, part.max_rows)
        heading, note = part.heading.strip(), part.note
    elif isinstance(part, Html):
        html, heading, note = Markup(part.html), part.heading.strip(), ""
    else:
        raise TypeError(f"a report section part must be a Figure, Table or Html, got {type(part).__name__}")
    return {"kind": "html", "id": anchor, "heading": heading, "label": heading, "html": html, "note": note}


def _provenance_items(prov: dict[str, Any]) -> list[tuple[str, str]]:
    """Model, streams, config, prompts and run, as (term, text)."""
    config = f"{prov['config']} (dim {prov['dim']}, {prov['hc_mult']} streams, Engram layers {prov['layers']})"
    prompts = (
        f"{prov.get('prompt_set', 'custom')} set: {prov.get('prompts_source', prov['prompts_file'])} (copied to "
        f"{prov['prompts_file']}) - {prov['n_prompts']} prompts, "
        f"{prov['n_tokens']} positions ({prov['n_image_positions']} in image spans); "
        f"sha256 {prov['prompts_sha256'][:16]}"
    )
    run = (
        f"device {prov['device']}, wkv mode {prov['wkv_mode']}; engram-viz {prov['engram_viz']}, "
        f"torch {prov['torch']}, Python {prov['python']}; {prov['created']}"
    )
    return [
        ("Model and weights", prov["model"]),
        ("Residual streams", prov["streams"]),
        ("Config", config),
        ("Prompts", prompts),
        ("Run", run),
    ]


def render_html(
    prov: dict[str, Any], sections: list[Section], out: Path, theme: str | Theme = "light", dpi: float = 200
) -> str:
    """The report page (one string, no scripts, no remote resources).

    ``prov``: the provenance of the manifest; ``sections``: the report's sections in page order
    (one with no parts is left out), listed in a table of contents with their sub-headings, every
    heading an anchor; ``out``: the report folder (links are relative to it; its files are listed
    at the end); ``theme``: the page's colours; ``dpi``: the PNGs' resolution (figures show at
    their size in inches, so text has one size across figures).
    """
    t = get_theme(theme)
    shown = [
        {
            "id": s.id,
            "heading": s.heading,
            "intro": s.intro,
            "parts": [_part_view(p, out, s.id, k, dpi) for k, p in enumerate(s.parts)],
        }
        for s in sections
        if s.parts
    ]
    page = render(
        "report.html.j2",
        title=TITLE,
        t=t,
        prov=prov,
        items=_provenance_items(prov),
        synthetic=synthetic_warning(t) if prov.get("synthetic") else "",
        proxy_streams=prov.get("streams_mode") == "embedding",
        missing_glyphs=prov.get("missing_glyphs") or [],
        sections=shown,
        files=[p.relative_to(out).as_posix() for p in sorted(out.rglob("*")) if p.is_file()],
    )
    return str(page)
