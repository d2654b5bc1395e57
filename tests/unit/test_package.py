"""The front door: ``import engram_viz as ev`` gives the dozen names a researcher needs, and
imports neither ipywidgets nor the widget until the widget is asked for."""

from __future__ import annotations

import subprocess
import sys

import pytest

import engram_viz as ev


def test_every_public_name_resolves():
    assert len(ev.__all__) == len(set(ev.__all__))
    for name in ev.__all__:
        assert getattr(ev, name) is not None, name
    assert set(ev.__all__) <= set(dir(ev))
    assert issubclass(ev.EngramVizError, Exception)
    assert ev.load_config("tiny").name == "tiny" and isinstance(ev.load_config("tiny"), ev.EngramConfig)


def test_import_needs_no_widget_stack():
    code = (
        "import sys\n"
        "import engram_viz as ev\n"
        "assert callable(ev.Pipeline) and callable(ev.write_report)\n"
        "print(sorted(m for m in ('ipywidgets', 'voila', 'plotly', 'engram_viz.apps.widget') if m in sys.modules))\n"
        "ev.PromptComparison\n"
        "print('engram_viz.apps.widget' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[]", "True"], proc.stdout


def test_unknown_attribute_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        ev.no_such_name  # noqa: B018


def test_front_door_reaches_explain_row_edits_and_figures():
    from engram_viz.analysis.explain.explanation import explain
    from engram_viz.viz.gate_plots import gate_heatmap
    from engram_viz.weights.row_edits import edit_rows

    assert ev.explain is explain and ev.edit_rows is edit_rows and ev.viz.gate_heatmap is gate_heatmap
    assert callable(ev.compare_edit) and callable(ev.gates_with_exposure) and callable(ev.viz.stamp)
    code = "import sys\nimport engram_viz as ev\nprint('engram_viz.apps.notebook' in sys.modules)\nev.notebook.setup\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False"]  # the notebook glue is imported on first use
