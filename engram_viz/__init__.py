"""engram-viz: look inside the Engram memory of DeepSeek-V4.1-Flash.

The front door, the names a researcher needs::

    import engram_viz as ev

    trace = ev.Pipeline().run(["The Great Wall of China.", "四大发明"])  # embedded default weights
    trace.to_frame("gates")                      # tidy: prompt, position, token, layer, stream, gate

- config: :func:`load_config` (``"v41-flash"``, ``"tiny"`` or a config.json) -> :class:`EngramConfig`
- running: :class:`Pipeline` (tokenizer, hashing, Engram layers, stream source) -> :class:`Trace`
- hooks and interventions: ``Pipeline.run(..., hooks={"engram.L1.gate": force_gate(0.0)})``,
  :func:`force_gate`, :func:`zero_ablate`; :func:`attach` instruments a model of your own
- weights: :func:`open_checkpoint` (a checkpoint folder), :func:`synthetic_checkpoint` (seeded
  random weights of a config)
- statistics: :class:`RowUsage` (which table rows are read) and :class:`CollisionStats` (hash
  collisions), over prompts or a corpus
- the report: :func:`write_report` (what ``engram-viz report`` writes)
- errors: :class:`EngramVizError`, the base of every error a user can cause
- the widget: :class:`PromptComparison` and :func:`app` (imported on first use: ``import
  engram_viz`` needs no ipywidgets)
"""

from __future__ import annotations

import importlib
from typing import Any

from engram_viz.analysis.row_stats.collisions import CollisionStats
from engram_viz.analysis.row_stats.usage import RowUsage
from engram_viz.apps.report_job import write_report
from engram_viz.config import EngramConfig, load_config
from engram_viz.errors import EngramVizError
from engram_viz.run.attach import attach
from engram_viz.run.capture import force_gate, zero_ablate
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.trace import Trace
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import synthetic_checkpoint

_LAZY = {"PromptComparison": "engram_viz.apps.widget", "app": "engram_viz.apps.widget"}

__all__ = [
    "CollisionStats",
    "EngramConfig",
    "EngramVizError",
    "Pipeline",
    "PromptComparison",
    "RowUsage",
    "Trace",
    "app",
    "attach",
    "force_gate",
    "load_config",
    "open_checkpoint",
    "synthetic_checkpoint",
    "write_report",
    "zero_ablate",
]


def __getattr__(name: str) -> Any:
    """The widget names, imported on first access (the widget stack is optional)."""
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'engram_viz' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
