"""The prompt comparison's ipywidgets: prompt boxes, the layer / stream / view / theme pickers, the
image inserter and the boxes its panels show in, laid out as one tree (``.widget``).

:class:`ComparisonControls` holds widgets only; :class:`~engram_viz.apps.widget.PromptComparison`
connects them to its state and redraws the panels. ipywidgets is imported when the controls are
built, so ``import engram_viz`` does not need it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from engram_viz.analysis.gates.comparison import STREAM_REDUCTIONS

VIEWS = ("tokens", "all gates")
SLOTS = "ABCDEFGH"


@functools.cache
def _prompt_box_class() -> type:
    """``ipywidgets.Textarea`` whose value the kernel does not echo back to the browser. A browser
    can send text holding a lone surrogate (invalid UTF-8, pasted from a broken source); the kernel
    cannot send it back (its messages are UTF-8 JSON), and ipywidgets' echo, sent before the value
    is set, would fail and drop the edit silently instead of letting the app say what is wrong."""
    import ipywidgets as W
    from traitlets import Unicode

    class PromptBox(W.Textarea):
        value = Unicode(help="String value").tag(sync=True, echo_update=False)

    return PromptBox


class ComparisonControls:
    """The widgets of a comparison of prompts run on Engram layers ``layer_ids`` with ``hc`` streams:
    ``boxes`` (one per prompt slot), ``layer``, ``stream``, ``view``, ``theme``, ``image_spec``,
    ``image_target``, ``image_button``, ``image_info``, ``add_button``, ``header``, ``status``;
    ``widget`` is the whole tree."""

    def __init__(self, layer_ids: Sequence[int], hc: int, *, continuous_update: bool = True):
        import ipywidgets as W

        self._W = self.W = W
        self._continuous = bool(continuous_update)
        self.boxes: list[Any] = []
        self.layer = W.Dropdown(description="layer", layout=W.Layout(width="150px"))
        self.layer.options = [(str(x), x) for x in layer_ids]
        self.stream = W.Dropdown(
            options=[(s, s) for s in STREAM_REDUCTIONS] + [(f"stream {s}", s) for s in range(hc)],
            description="stream",
            layout=W.Layout(width="190px"),
        )
        self.view = W.ToggleButtons(options=list(VIEWS), description="view", style={"button_width": "90px"})
        self.theme = W.Dropdown(options=["light", "dark"], description="theme", layout=W.Layout(width="160px"))
        self.image_spec = W.Text(
            value="16x12", description="image", placeholder="WxH or WxHpx", layout=W.Layout(width="210px")
        )
        self.image_target = W.Dropdown(description="into", layout=W.Layout(width="130px"))
        self.image_button = W.Button(description="insert image", icon="image", tooltip="append <image:WxH>")
        self.image_info = W.HTML()
        self.add_button = W.Button(description="add prompt", icon="plus")
        self.header = W.HTML()
        self.status = W.HTML()
        self._panels_box = W.HBox(layout=W.Layout(width="100%", align_items="flex-start"))
        self._diff_box = W.VBox(layout=W.Layout(width="100%"))
        self._prompt_row = W.HBox(layout=W.Layout(width="100%"))
        self.widget = W.VBox(
            [
                self.header,
                self._prompt_row,
                W.HBox([self.layer, self.stream, self.theme, self.add_button]),
                self.view,
                W.HBox([self.image_spec, self.image_target, self.image_button, self.image_info]),
                self.status,
                self._panels_box,
                self._diff_box,
            ],
            layout=W.Layout(width="100%"),
        )

    @property
    def slots(self) -> list[str]:
        """The slot name of each prompt box: 'A', 'B', ..."""
        return list(SLOTS[: len(self.boxes)])

    def add_box(self, text: str, on_change: Callable[[Any], None]) -> None:
        """One more prompt box holding ``text``; ``on_change`` observes its value."""
        W = self._W
        slot = SLOTS[len(self.boxes)]
        box = _prompt_box_class()(
            value=str(text),
            description=slot,
            placeholder=f"prompt {slot}: text, with <image:WxH> placeholders if you like",
            continuous_update=self._continuous,
            layout=W.Layout(width="auto", flex="1 1 0", height="90px"),
            style={"description_width": "18px"},
        )
        box.observe(on_change, names="value")
        self.boxes.append(box)
        self._prompt_row.children = tuple(self.boxes)
        self._set_targets()

    def keep_boxes(self, n: int) -> None:
        """Drop the prompt boxes after the first ``n``."""
        if len(self.boxes) > n:
            self.boxes = self.boxes[:n]
            self._prompt_row.children = tuple(self.boxes)
            self._set_targets()

    def _set_targets(self) -> None:
        """The 'into' dropdown lists the prompt slots and always has one selected (A by default)."""
        keep = self.image_target.value
        self.image_target.options = self.slots
        self.image_target.value = keep if keep in self.image_target.options else SLOTS[0]

    def show(self, panels: dict[str, str]) -> None:
        """Show the panels: 'header', one per slot side by side, then each 'diff <slot>-A' below."""
        W = self._W
        self.header.value = panels["header"]
        width = f"{100 / len(self.boxes):.2f}%"
        self._panels_box.children = tuple(
            W.HTML(value=panels[slot], layout=W.Layout(width=width, overflow="auto")) for slot in self.slots
        )
        self._diff_box.children = tuple(W.HTML(value=panels[k]) for k in panels if k.startswith("diff "))
