"""The interactive gate view: one anywidget component (``GateView``) that JupyterLab, Jupyter
Notebook, VS Code, Colab, marimo and the ``engram-viz app`` page all render from the same ES module
(``apps/static/gate_view.js`` and ``gate_view.css``, shipped in the package: ``apps.view_files``).

The widget holds state only; :class:`~engram_viz.apps.widget.PromptComparison` fills it and
answers its requests. What the browser shows, from the synced traits:

- ``prompts`` (editable boxes when ``editable``), ``layer`` / ``stream`` / ``view`` pickers,
  ``theme`` ('auto' follows the host page: JupyterLab's light or dark theme, marimo's, VS Code's,
  or the page's own background; the browser reports what it found in ``host_theme``);
- ``panels``: one per prompt (``viz.view_payload.prompt_payload``): token text coloured by the gate
  at the chosen layer and stream, or the all-gates grid; hovering a token lists its per-stream gates
  at every layer and its row ids; clicking it sets ``selected`` ({slot, position});
- ``diffs``: each prompt against A, as HTML from ``viz.comparison_html`` (in the effective theme);
- ``explanation`` (``viz.view_payload.explanation_payload``): the clicked token's 24 rows, each with
  an 'ablate' button that sets ``ablate_request``; ``ablation`` carries the answer (the gate change
  at that token, shown beside the button, and the difference view of the whole prompt);
- a picture upload (a file chooser and the 'into' slot) that sets ``picture_upload``; the picture
  becomes an ``<image:...>`` span of that prompt (``apps.picture_upload``), or ``image_info`` says why not;
- an export menu that sets ``export_request`` ({format: html | png | pdf | json, nonce}); the answer
  comes back in ``export_file`` ({name, mime, data (base64), nonce}) and the browser saves it.

Requests carry a ``nonce`` so that asking twice for the same thing is two requests.
"""

from __future__ import annotations

import anywidget
import traitlets as tl

from engram_viz.apps.view_files import CSS, ESM

EXPORT_FORMATS = ("html", "png", "pdf", "json")
THEME_CHOICES = ("auto", "light", "dark")


class GateView(anywidget.AnyWidget):
    """The view's synced state (module docstring); build it through ``PromptComparison``."""

    _esm = ESM
    _css = CSS

    # not echoed to the browser: a lone surrogate it sent could not go back (the kernel speaks UTF-8 JSON)
    prompts = tl.List(tl.Unicode()).tag(sync=True, echo_update=False)
    editable = tl.Bool(True).tag(sync=True)
    max_prompts = tl.Int(8).tag(sync=True)
    layer_ids = tl.List(tl.Int()).tag(sync=True)
    hc = tl.Int(4).tag(sync=True)
    layer = tl.Int(0).tag(sync=True)
    stream = tl.Unicode("mean").tag(sync=True)  # 'mean' / 'max' / 'min' or a stream index as text
    view = tl.Unicode("tokens").tag(sync=True)  # 'tokens' or 'all gates'
    theme = tl.Unicode("auto").tag(sync=True)
    host_theme = tl.Unicode("light").tag(sync=True)  # what the browser found on the host page
    themes = tl.Dict().tag(sync=True)  # viz.view_payload.theme_payload()
    header = tl.Dict().tag(sync=True)  # model, weights, streams, config, layers, device
    panels = tl.List(tl.Dict()).tag(sync=True)
    diffs = tl.Dict().tag(sync=True)  # 'diff B-A' -> HTML
    status = tl.Unicode("").tag(sync=True)
    busy = tl.Bool(False).tag(sync=True)
    selected = tl.Dict().tag(sync=True)  # {slot, position} or {}
    explanation = tl.Dict().tag(sync=True)
    ablate_request = tl.Dict().tag(sync=True)  # {slot, position, layer, column, nonce}
    ablation = tl.Dict().tag(sync=True)
    export_request = tl.Dict().tag(sync=True)  # {format, nonce}
    export_file = tl.Dict().tag(sync=True)  # {name, mime, data, nonce, error}
    image_spec = tl.Unicode("16x12").tag(sync=True)
    image_info = tl.Unicode("").tag(sync=True)
    picture_upload = tl.Dict().tag(sync=True, echo_update=False)  # {slot, name, data (base64), nonce}: a picture
    max_upload_bytes = tl.Int(0).tag(sync=True)  # the browser refuses larger files before sending them

    @property
    def effective_theme(self) -> str:
        """'light' or 'dark': ``theme``, or the host's when ``theme`` is 'auto'."""
        return self.host_theme if self.theme == "auto" else self.theme

    def settings(self) -> dict:
        """The view's settings as plain data (what 'export JSON' saves and the app's URL carries)."""
        return {
            "prompts": list(self.prompts),
            "layer": int(self.layer),
            "stream": self.stream,
            "view": self.view,
            "theme": self.theme,
            "selected": dict(self.selected),
            "ablated": {k: v for k, v in self.ablate_request.items() if k != "nonce"},
        }
