"""engram-viz: look inside the Engram memory of DeepSeek-V4.1-Flash.

The front door, the names a researcher needs::

    import engram_viz as ev

    trace = ev.Pipeline().run(["The Great Wall of China.", "四大发明"])  # embedded default weights
    trace.to_frame("gates")                      # tidy: prompt, position, token, layer, stream, gate

- config: :func:`load_config` (``"v41-flash"``, ``"tiny"`` or a config.json) -> :class:`EngramConfig`
- running: :class:`Pipeline` (tokenizer, hashing, Engram layers, stream source) -> :class:`Trace`
- hooks and interventions: ``Pipeline.run(..., hooks={"engram.L1.gate": force_gate(0.0)})``,
  :func:`force_gate`, :func:`zero_ablate`; :func:`attach` instruments a model of your own
- weights: :func:`open_checkpoint` (a checkpoint folder, or ``"hf://owner/repo"`` on the Hugging Face
  Hub: only the shards a run reads are fetched), :func:`synthetic_checkpoint` (seeded
  random weights of a config)
- statistics: :class:`RowUsage` (which table rows are read) and :class:`CollisionStats` (hash
  collisions), over prompts or a corpus
- prompts: :func:`load_prompts`, :func:`prompt_set_for`, :func:`prompt_set_path`, ``PROMPT_SETS``
- gates: :func:`gate_overview`, :func:`stream_selectivity`, :func:`gates_with_exposure` (the gates
  frame with its collision ``exposure`` column), :func:`collision_exposure`, :func:`ngram_windows_table`,
  :func:`after_image_vs_fresh_start`; gate versus memory (tiny LM): :func:`training_counts`, :func:`gate_memory`
- pictures: :func:`picture_vs_placeholder` / :func:`prompt_vs_placeholder` (a real picture's prompt beside
  its placeholder twin, the gate difference of the text after it), :func:`picture_twins`, :func:`twin_summary`
- why this gate: :func:`explain` -> :class:`Explanation` (``rows_frame``, ``position_table``,
  ``groups_frame``), :func:`order_profile`
- row edits: :func:`edit_rows` / :func:`edit_tables` (overlays on a table's rows), :func:`compare_edit`
  -> :class:`EditEffect`, :func:`localise_entities`, :func:`row_lens`, :func:`position_lens`,
  :func:`collateral_ngrams`, :func:`collateral_reads`, :func:`collision_interference`, :class:`RowIndex`
- corpora and layout: :func:`corpus_sample`, :class:`NgramDecoder`, :class:`EngramLayout`, :func:`get_tokenizer`
- provenance: :class:`Provenance` (model, streams, config, synthetic), :func:`provenance_of`,
  :func:`layout_provenance`; every frame of a Trace carries it in ``df.attrs`` and figures stamp it
- figures: ``ev.viz`` (``ev.viz.gate_heatmap(gates)``, every plot of :mod:`engram_viz.viz`),
  :func:`save_figure` (``ev.save_figure(ax, "fig.pdf", stamp=False)``: PDF, SVG, PNG or HTML)
- the report: :func:`write_report` (what ``engram-viz report`` writes)
- errors: :class:`EngramVizError`, the base of every error a user can cause
- the widget: :class:`PromptComparison` and :func:`app`, and the notebook glue ``ev.notebook``

Each name is imported on first use: ``import engram_viz`` loads neither torch, pandas, matplotlib
nor ipywidgets until a name needs them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what a type checker and an editor see; at run time each name is imported on first use
    from engram_viz import viz
    from engram_viz.analysis.corpus.corpus_sample import corpus_sample
    from engram_viz.analysis.corpus.ngram_text import NgramDecoder
    from engram_viz.analysis.edits.localisation import ENTITY_PROMPT, localise_entities
    from engram_viz.analysis.edits.row_lens import position_lens, row_lens
    from engram_viz.analysis.edits.shared_rows import collateral_ngrams, collateral_reads, collision_interference
    from engram_viz.analysis.explain.explanation import Explanation, explain, order_profile
    from engram_viz.analysis.gates.gate_memory import gate_memory, training_counts
    from engram_viz.analysis.gates.image_boundary import after_image_vs_fresh_start
    from engram_viz.analysis.gates.picture_twin import (
        picture_twins,
        picture_vs_placeholder,
        prompt_vs_placeholder,
        twin_summary,
    )
    from engram_viz.analysis.gates.summary import gate_overview, stream_selectivity
    from engram_viz.analysis.row_stats.collisions import CollisionStats
    from engram_viz.analysis.row_stats.row_index import RowIndex
    from engram_viz.analysis.row_stats.trace_ngrams import collision_exposure, gates_with_exposure, ngram_windows_table
    from engram_viz.analysis.row_stats.usage import RowUsage
    from engram_viz.apps.report_job import write_report
    from engram_viz.apps.widget import PromptComparison, app
    from engram_viz.config import EngramConfig, load_config
    from engram_viz.core.layout import EngramLayout
    from engram_viz.core.tokenizer import get_tokenizer
    from engram_viz.errors import EngramVizError
    from engram_viz.run.attach import attach
    from engram_viz.run.capture import force_gate, zero_ablate
    from engram_viz.run.counterfactual import EditEffect, compare_edit
    from engram_viz.run.pipeline import Pipeline
    from engram_viz.run.prompts import PROMPT_SETS, load_prompts, prompt_set_for, prompt_set_path
    from engram_viz.run.provenance import Provenance, layout_provenance, provenance_of
    from engram_viz.run.trace import Trace
    from engram_viz.viz.export import save_figure
    from engram_viz.weights.checkpoint import open_checkpoint
    from engram_viz.weights.row_edits import RowOverlay, edit_rows, edit_tables
    from engram_viz.weights.synthetic import synthetic_checkpoint

# Each public name -> the module that defines it, imported on first access (PEP 562): ``import
# engram_viz`` (and so the ``engram-viz`` command's parser) costs no torch, pandas or matplotlib
# until a name is used; the widget stack (ipywidgets) stays optional the same way.
_NAMES = {
    "corpus_sample": "engram_viz.analysis.corpus.corpus_sample",
    "NgramDecoder": "engram_viz.analysis.corpus.ngram_text",
    "ENTITY_PROMPT": "engram_viz.analysis.edits.localisation",
    "localise_entities": "engram_viz.analysis.edits.localisation",
    "position_lens": "engram_viz.analysis.edits.row_lens",
    "row_lens": "engram_viz.analysis.edits.row_lens",
    "collateral_ngrams": "engram_viz.analysis.edits.shared_rows",
    "collateral_reads": "engram_viz.analysis.edits.shared_rows",
    "collision_interference": "engram_viz.analysis.edits.shared_rows",
    "Explanation": "engram_viz.analysis.explain.explanation",
    "explain": "engram_viz.analysis.explain.explanation",
    "order_profile": "engram_viz.analysis.explain.explanation",
    "gate_memory": "engram_viz.analysis.gates.gate_memory",
    "training_counts": "engram_viz.analysis.gates.gate_memory",
    "after_image_vs_fresh_start": "engram_viz.analysis.gates.image_boundary",
    "picture_twins": "engram_viz.analysis.gates.picture_twin",
    "picture_vs_placeholder": "engram_viz.analysis.gates.picture_twin",
    "prompt_vs_placeholder": "engram_viz.analysis.gates.picture_twin",
    "twin_summary": "engram_viz.analysis.gates.picture_twin",
    "gate_overview": "engram_viz.analysis.gates.summary",
    "stream_selectivity": "engram_viz.analysis.gates.summary",
    "CollisionStats": "engram_viz.analysis.row_stats.collisions",
    "RowIndex": "engram_viz.analysis.row_stats.row_index",
    "collision_exposure": "engram_viz.analysis.row_stats.trace_ngrams",
    "gates_with_exposure": "engram_viz.analysis.row_stats.trace_ngrams",
    "ngram_windows_table": "engram_viz.analysis.row_stats.trace_ngrams",
    "RowUsage": "engram_viz.analysis.row_stats.usage",
    "write_report": "engram_viz.apps.report_job",
    "EngramConfig": "engram_viz.config",
    "load_config": "engram_viz.config",
    "EngramLayout": "engram_viz.core.layout",
    "get_tokenizer": "engram_viz.core.tokenizer",
    "EngramVizError": "engram_viz.errors",
    "attach": "engram_viz.run.attach",
    "force_gate": "engram_viz.run.capture",
    "zero_ablate": "engram_viz.run.capture",
    "EditEffect": "engram_viz.run.counterfactual",
    "compare_edit": "engram_viz.run.counterfactual",
    "Pipeline": "engram_viz.run.pipeline",
    "PROMPT_SETS": "engram_viz.run.prompts",
    "load_prompts": "engram_viz.run.prompts",
    "prompt_set_for": "engram_viz.run.prompts",
    "prompt_set_path": "engram_viz.run.prompts",
    "Provenance": "engram_viz.run.provenance",
    "layout_provenance": "engram_viz.run.provenance",
    "provenance_of": "engram_viz.run.provenance",
    "Trace": "engram_viz.run.trace",
    "save_figure": "engram_viz.viz.export",
    "open_checkpoint": "engram_viz.weights.checkpoint",
    "RowOverlay": "engram_viz.weights.row_edits",
    "edit_rows": "engram_viz.weights.row_edits",
    "edit_tables": "engram_viz.weights.row_edits",
    "synthetic_checkpoint": "engram_viz.weights.synthetic",
    "PromptComparison": "engram_viz.apps.widget",
    "app": "engram_viz.apps.widget",
}
_MODULES = {"viz": "engram_viz.viz", "notebook": "engram_viz.apps.notebook"}  # figures; the notebooks' glue

__all__ = [
    "ENTITY_PROMPT",
    "PROMPT_SETS",
    "CollisionStats",
    "EditEffect",
    "EngramConfig",
    "EngramLayout",
    "EngramVizError",
    "Explanation",
    "NgramDecoder",
    "Pipeline",
    "PromptComparison",
    "Provenance",
    "RowIndex",
    "RowOverlay",
    "RowUsage",
    "Trace",
    "after_image_vs_fresh_start",
    "app",
    "attach",
    "collateral_ngrams",
    "collateral_reads",
    "collision_exposure",
    "collision_interference",
    "compare_edit",
    "corpus_sample",
    "edit_rows",
    "edit_tables",
    "explain",
    "force_gate",
    "gate_memory",
    "gate_overview",
    "gates_with_exposure",
    "get_tokenizer",
    "layout_provenance",
    "load_config",
    "load_prompts",
    "localise_entities",
    "ngram_windows_table",
    "notebook",
    "open_checkpoint",
    "order_profile",
    "picture_twins",
    "picture_vs_placeholder",
    "position_lens",
    "prompt_set_for",
    "prompt_set_path",
    "prompt_vs_placeholder",
    "provenance_of",
    "row_lens",
    "save_figure",
    "stream_selectivity",
    "synthetic_checkpoint",
    "training_counts",
    "twin_summary",
    "viz",
    "write_report",
    "zero_ablate",
]


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first access and kept."""
    if name in _MODULES:
        value = importlib.import_module(_MODULES[name])
    elif name in _NAMES:
        value = getattr(importlib.import_module(_NAMES[name]), name)
    else:
        raise AttributeError(f"module 'engram_viz' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
