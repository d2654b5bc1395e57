"""engram_viz.apps.notebook: the helpers the notebooks share (weights from the environment, provenance,
display with a static fallback, checked export)."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess

import numpy as np
import pytest

from engram_viz import settings
from engram_viz.apps import notebook as nb
from engram_viz.run.provenance import short_label
from engram_viz.viz.stamps import stamp


def texts(fig) -> list[str]:
    """The figure's texts with the stamp's wrapping undone (a long stamp wraps to the figure's width)."""
    return [" ".join(t.get_text().split("\n")) for t in fig.texts]


def test_load_pipeline_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.CHECKPOINT, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        nb.load_pipeline()


def test_provenance_says_model_streams_and_synthetic(pipe, trace):
    box = nb.provenance(trace)
    html = box._repr_html_()
    assert trace.model_label.split(" at ")[0] in html and "Residual streams" in html
    assert ("Synthetic weights" in html) == ("SYNTHETIC" in trace.model_label)
    assert "model and weights:" in repr(nb.provenance(pipe))
    layout = nb.layout_provenance("v41-flash", "60,000 tokens")
    assert "no weights" in layout._repr_html_() and "v41-flash" in repr(layout)


def test_short_label_drops_the_folder():
    assert short_label("SYNTHETIC tiny checkpoint (seed 0) at /root/.cache/x/y") == "SYNTHETIC tiny checkpoint (seed 0)"
    assert short_label("tiny Engram LM") == "tiny Engram LM"


def test_stamp_and_show_carry_the_label_and_a_png(trace):
    from engram_viz.viz import gate_heatmap, gate_heatmap_interactive, token_view

    gates = trace.to_frame("gates")
    ax = stamp(gate_heatmap(gates, "en"), trace.model_label)  # an Axes: its figure is stamped
    assert short_label(trace.model_label) in texts(ax.figure)
    view = stamp(token_view(gates, "en", title="t"), "model X at /some/where")
    assert view.title == "t \u2014 model X"
    inter = stamp(gate_heatmap_interactive(gates, "en"), trace.model_label)
    assert inter.layout.title.subtitle.text
    bundle = nb.show(inter, ax)._repr_mimebundle_()  # the PNG of the Axes' figure
    assert "application/vnd.plotly.v1+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    json.dumps(bundle)  # what a kernel sends must be JSON
    assert "<script" not in json.dumps(bundle)
    with pytest.raises(TypeError, match="cannot stamp"):
        stamp(object(), "x")


def test_figures_dir_by_default_is_git_ignored_never_the_tracked_readme_figures(monkeypatch):
    monkeypatch.delenv(settings.FIGURES_DIR, raising=False)
    path = nb.figures_dir()
    assert path == nb.REPO / "out" / "figures" and path.is_dir()
    if (nb.REPO / ".git").exists() and shutil.which("git"):
        ignored = subprocess.run(
            ["git", "check-ignore", "-q", str(path / "readme_tokens.png")], check=False, cwd=nb.REPO
        )
        assert ignored.returncode == 0


def test_figures_dir_and_corpus_tokens_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(settings.FIGURES_DIR, str(tmp_path / "f"))
    assert nb.figures_dir() == tmp_path / "f" and (tmp_path / "f").is_dir()
    monkeypatch.setenv(settings.CORPUS_TOKENS, "1234")
    assert settings.corpus_tokens(60_000) == 1234
    for bad in ("lots", "0"):
        monkeypatch.setenv(settings.CORPUS_TOKENS, bad)
        with pytest.raises(ValueError, match="positive integer"):
            settings.corpus_tokens(60_000)


def test_export_figures_writes_checked_files(tmp_path, trace):
    from engram_viz.viz import gate_heatmap, token_view

    gates = trace.to_frame("gates")
    files = nb.export_figures(
        {"heat": gate_heatmap(gates, "en"), "tokens": token_view(gates, ["en", "zh"])}, tmp_path, dpi=80
    )
    assert set(files["format"]) == {"pdf", "svg", "png", "html"}
    assert (files["check"] == "ok").all() and (files["bytes"] > 0).all()
    (tmp_path / "broken.pdf").write_bytes(b"not a pdf")
    (tmp_path / "broken.svg").write_text("<svg")
    (tmp_path / "remote.html").write_text('<script src="https://cdn.example/x.js"></script>')
    assert nb.check_file(tmp_path / "broken.pdf") != "ok"
    assert nb.check_file(tmp_path / "broken.svg").startswith("SVG does not parse")
    assert "network" in nb.check_file(tmp_path / "remote.html")
    assert np.all(files["path"].map(lambda p: str(p).startswith(str(tmp_path))))


def test_figures_from_a_trace_frame_stamp_themselves(trace):
    from engram_viz.viz import gate_heatmap, gate_heatmap_interactive, token_text_figure, token_view

    gates = trace.to_frame("gates")
    label = short_label(trace.model_label)
    fig = gate_heatmap(gates, "en").figure
    assert texts(fig).count(label) == 1
    stamp(fig, "other model at /x")  # stamping again replaces the line
    assert label not in texts(fig) and "other model" in texts(fig)
    assert label in texts(token_text_figure(gates, "en"))
    assert token_view(gates, "en", title="t").title == f"t \u2014 {label}"
    assert gate_heatmap_interactive(gates, "en").layout.title.subtitle.text
    bare = gates.copy()
    bare.attrs.clear()
    assert label not in texts(gate_heatmap(bare, "en").figure)  # no provenance, no stamp
