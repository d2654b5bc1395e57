"""HTML from templates: one Jinja2 environment over ``viz/templates/*.html.j2``, autoescape on.

Every HTML view renders through :func:`render`. Values are escaped as ``html.escape`` does (quotes
included), unless they are already markup (``markupsafe.Markup``, e.g. a rendered sub-view).
:func:`table_html` is the one DataFrame-to-HTML table and :func:`synthetic_warning` the one
"synthetic weights" warning; their colours come from the theme (``viz.style.THEMES``).
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup

from engram_viz._files import flatten_tuples
from engram_viz.viz.style import HTML_FONT_STACK, Theme, get_theme

TEMPLATES = Path(__file__).with_name("templates")


def _escaped(value: Any) -> Markup:
    """Each ``{{ value }}``: markup as it is, anything else escaped like ``html.escape``."""
    return value if isinstance(value, Markup) else Markup(html.escape(str(value)))


_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(TEMPLATES),
    autoescape=True,
    finalize=_escaped,
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
)
_ENV.globals["font_stack"] = HTML_FONT_STACK  # escaped where it lands, e.g. in a style attribute
_ENV.globals["css_font_stack"] = Markup(HTML_FONT_STACK)  # inside a <style> element, as it is


def render(name: str, **context: Any) -> Markup:
    """Template ``name`` (a file in ``viz/templates``) rendered with ``context``."""
    return Markup(_ENV.get_template(name).render(**context))


def _cell(value: Any, floatfmt: str) -> str:
    if isinstance(value, Markup):  # a cell that is already HTML (a bar, a link)
        return value
    if isinstance(value, float | np.floating):
        return "NaN" if np.isnan(value) else floatfmt.format(value)
    return str(value)


def table_html(
    df: pd.DataFrame,
    max_rows: int = 40,
    floatfmt: str = "{:.4g}",
    *,
    css_class: str = "ev",
    style: str = "",
    row_attrs: dict[str, Sequence[Any]] | None = None,
) -> Markup:
    """The first ``max_rows`` rows of ``df`` as an HTML table (class ``css_class``, inline ``style``
    when given, no index; floats as ``floatfmt``, ``Markup`` cells as they are), with a note when rows
    were left out. ``row_attrs``: attribute name -> one value per row of ``df``, set on each ``<tr>``."""
    shown = flatten_tuples(df.head(max_rows))
    rows = [[_cell(v, floatfmt) for v in row] for row in shown.itertuples(index=False, name=None)]
    attrs = [[(name, values[i]) for name, values in (row_attrs or {}).items()] for i in range(len(rows))]
    columns = [str(c) for c in shown.columns]
    return render(
        "table.html.j2",
        columns=columns,
        rows=zip(attrs, rows),
        n=len(df),
        max_rows=max_rows,
        css_class=css_class,
        style=style,
    )


def synthetic_warning(theme: str | Theme = "light", boxed: bool = True) -> Markup:
    """The warning every view of synthetic weights carries: a box (``boxed``) or one coloured line."""
    return render("synthetic_warning.html.j2", t=get_theme(theme), boxed=boxed)


class _Macros:
    """The macros of one template as functions returning plain ``str`` HTML (so that ``+`` with a
    ``str`` never escapes either side); HTML passed back into a macro goes in as ``Markup``."""

    def __init__(self, name: str):
        self._module = _ENV.get_template(name).module

    def __getattr__(self, name: str) -> Any:
        macro = getattr(self._module, name)
        return lambda *args, **kwargs: str(macro(*args, **kwargs))


@lru_cache
def macros(name: str) -> Any:
    """The macros of template ``name``: ``macros(name).panel(...)`` -> HTML (a ``str``)."""
    return _Macros(name)
