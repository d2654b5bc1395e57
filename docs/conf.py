"""Sphinx configuration of the engram-viz site (``make docs``).

The source folder is the repository root (``sphinx-build -c docs . OUT``) so the site takes the
pages in ``docs/`` and the notebooks in ``notebooks/`` where they live; ``include_patterns`` keeps
everything else out. The API pages are generated from the docstrings
(autosummary, recursive), so a new module appears without an edit here.
"""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this tree's engram_viz, not an installed copy

project = "engram-viz"
author = "the engram-viz authors"
release = "0.1.0"

root_doc = "docs/index"
include_patterns = ["docs/**", "notebooks/*.ipynb"]
exclude_patterns = [
    ".venv*",
    ".git",
    "out",
    "build",
    "docs/_build",
    "docs/_templates",
    "docs/TEAM_NOTES.md",  # working notes of the developers, not user documentation
    "**/.ipynb_checkpoints",
]
templates_path = [str(ROOT / "docs" / "_templates")]  # absolute: autosummary reads it from the source folder

extensions = [
    "myst_nb",
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
]

# notebooks: the committed .ipynb files carry no outputs (kept small, paired with py:percent), so
# `make docs` executes each once on the embedded default and caches the result (jupyter-cache in
# the build folder: a notebook runs again only when its cells change); a failing cell fails the
# build. The CI test builds with `-D nb_execution_mode=off` (the acceptance tier executes them).
nb_execution_mode = "cache"
nb_execution_cache_path = os.environ.get("ENGRAM_VIZ_DOCS_CACHE", str(ROOT / "build" / "docs-cache" / "jupyter"))
nb_execution_timeout = 600
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_output_stderr = "remove"
os.environ.setdefault("ENGRAM_VIZ_FIGURES_DIR", str(Path(nb_execution_cache_path).parent / "figures"))
# the kernels run this tree's engram_viz (the one documented), whatever the environment installs
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
# a plotly output's JSON needs plotly.js from the network, which an offline page does not load: it is
# skipped and the PNG beside it in the same output shows (the notebooks' static fallback)
suppress_warnings = ["mystnb.unknown_mime_type"]
nb_ipywidgets_js: dict[str, dict[str, str]] = {}  # no widget manager from a CDN: the pages load nothing remote
myst_enable_extensions = ["colon_fence", "dollarmath"]
myst_heading_anchors = 3

# API: one page per module, generated from the docstrings (docs/api/generated, git-ignored)
autosummary_generate = True
autosummary_imported_members = False
autodoc_default_options = {"members": True, "undoc-members": True, "show-inheritance": True}
autodoc_member_order = "bysource"
toc_object_entries = False  # the sidebar lists pages, not every function (an O(pages x objects) navigation tree)
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_mock_imports: list[str] = []

# cross-references: nitpicky (-n) so a broken role fails the build; the targets of other
# projects come from their inventories only when one is cached offline (no network here)
nitpicky = True
EXTERNAL = r"(torch|numpy|np|pandas|pd|matplotlib|plt|pathlib|collections|os|io|typing|types|markupsafe|jinja2|ipywidgets|plotly|anywidget|dask|distributed|tokenizers|safetensors|pyarrow|json|argparse|re|datetime|enum|dataclasses|concurrent|multiprocessing|threading|subprocess|tempfile|huggingface_hub|tornado|gguf|libcachesim|PIL|numba)"
nitpick_ignore_regex = [
    # other projects' objects: their inventories need the network, so their names stay plain text
    ("py:.*", EXTERNAL + r"(\..*)?"),
    # builtins and typing names that Sphinx does not know without Python's inventory
    (
        "py:.*",
        r"(Path|Any|Callable|Iterable|Iterator|Sequence|Mapping|Literal|Self|NoReturn|Tensor|DataFrame|Axes|Figure|Module|Application)",
    ),
]


def _resolve_by_name(app, env, node, contnode):
    """A Python role whose target is not documented under the name written (a name imported into
    the module that uses it, a short name): resolved to the one documented object it can only mean,
    found by import identity, else by a unique dotted suffix."""
    if node.get("refdomain") != "py":
        return None
    py = env.get_domain("py")
    target = node["reftarget"].lstrip(".~")
    modname = node.get("py:module")
    candidates = [name for name in py.objects if name == target or name.endswith("." + target)]
    if len(candidates) > 1 and modname:
        obj = _imported(f"{modname}.{target}")
        candidates = [name for name in candidates if obj is not None and _imported(name) is obj] or candidates
    if len(candidates) == 1:
        return py.resolve_xref(env, node["refdoc"], app.builder, "obj", candidates[0], node, contnode)
    if candidates or not modname:
        return None
    # an object of the code without a page of its own (a module constant, a type alias, a private
    # helper): shown as code; a role naming nothing that imports still fails the build
    context = [f"{modname}.{node['py:class']}.{target}"] if node.get("py:class") else []
    found = any(_imported(name) is not None for name in [*context, f"{modname}.{target}", target])
    return contnode if found else None


def _imported(dotted: str):
    """The object a dotted name leads to (a module, then its attributes), or None."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:]:
            if not hasattr(obj, attr):
                return None
            obj = getattr(obj, attr)
        return obj if obj is not None else attr
    return None


def setup(app):
    app.connect("missing-reference", _resolve_by_name)


html_theme = "furo"
html_title = "engram-viz"
html_static_path: list[str] = []
