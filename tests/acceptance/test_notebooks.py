"""Every notebook runs top to bottom on the embedded default, without GPU or network, and its
outputs load nothing from the network. The committed .ipynb files stay paired with their
jupytext ``py:percent`` sources and carry no (or only small) outputs."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
REMOTE_SCRIPT = re.compile(r"<script[^>]*\bsrc\s*=\s*[\"']?\s*(?:https?:)?//", re.IGNORECASE)
CELL_TIMEOUT_S = 600
COMMITTED_MAX_BYTES = 200_000


def _strings(obj) -> list[str]:
    """Every string inside a notebook output (data of every mime type, text, tracebacks)."""
    if isinstance(obj, str):
        return [obj]
    if isinstance(obj, dict):
        return [s for v in obj.values() for s in _strings(v)]
    if isinstance(obj, list):
        return [s for v in obj for s in _strings(v)]
    return []


def test_the_notebooks_are_all_there_and_paired():
    names = [p.stem for p in NOTEBOOKS]
    assert names == [
        "01_quickstart",
        "02_gates_across_prompts",
        "03_hash_collisions",
        "04_row_usage",
        "05_image_spans",
        "06_prompt_comparison",
        "07_paper_figures",
        "08_why_this_gate",
        "09_edit_a_memory",
        "10_quantised_tables",
        "11_row_caches",
    ]
    for nb in NOTEBOOKS:
        assert nb.with_suffix(".py").is_file(), f"{nb.name} has no py:percent pair"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_notebook_is_paired_and_small(path):
    import jupytext
    import nbformat

    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    assert nb.metadata["jupytext"]["formats"] == "ipynb,py:percent"
    assert nb.metadata["kernelspec"]["name"] == "python3"
    py = jupytext.read(path.with_suffix(".py"))
    src = [(c.cell_type, c.source) for c in nb.cells]
    assert src == [(c.cell_type, c.source) for c in py.cells], f"{path.name} and its .py differ: run jupytext --sync"
    assert path.stat().st_size < COMMITTED_MAX_BYTES
    text = path.read_text(encoding="utf-8")
    assert not REMOTE_SCRIPT.search(text)


def test_python3_kernel_is_this_environment():
    """nbclient starts the kernel named python3; it must run this interpreter (the project venv)."""
    import ipykernel  # noqa: F401 - the kernel package is installed here
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.manager import KernelManager

    spec = KernelSpecManager().get_kernel_spec("python3")
    assert spec.language == "python"
    cmd = KernelManager(kernel_name="python3").format_kernel_cmd()
    assert os.path.realpath(cmd[0]) == os.path.realpath(sys.executable), cmd


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_top_to_bottom_offline(path, tmp_path, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.delenv("ENGRAM_VIZ_CHECKPOINT", raising=False)  # the embedded default
    monkeypatch.setenv("ENGRAM_VIZ_FIGURES_DIR", str(tmp_path / "figures"))  # never the repository's
    monkeypatch.setenv("ENGRAM_VIZ_CORPUS_TOKENS", os.environ.get("ENGRAM_VIZ_CORPUS_TOKENS", "30000"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # CPU, as on a laptop
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    before = sorted(p.name for p in (ROOT / "figures").glob("*")) if (ROOT / "figures").is_dir() else []

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
    )
    t0 = time.perf_counter()
    client.execute()
    elapsed = time.perf_counter() - t0
    print(f"{path.name}: {elapsed:.1f} s")

    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert outputs, f"{path.name} produced no output"
    errors = [o for o in outputs if o.get("output_type") == "error"]
    assert not errors, errors
    for s in _strings(outputs):
        assert not REMOTE_SCRIPT.search(s), f"{path.name}: an output loads a script from the network"
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert images, f"{path.name} shows no figure"
    bare = [o for o in outputs if o.get("data", {}).get("text/plain", "").startswith("<Figure size")]
    assert not [o for o in bare if "image/png" not in o["data"]], f"{path.name}: a figure shows as text only"
    axes = [o for o in outputs if re.match(r"(array\(|\[)*<Axes", o.get("data", {}).get("text/plain", ""))]
    assert not axes, f"{path.name}: a plot's Axes shows as text (end the cell with ax.figure)"
    text = json.dumps(outputs)
    assert "Model and weights" in text or "model and weights" in text, f"{path.name} never says which model ran"
    after = sorted(p.name for p in (ROOT / "figures").glob("*")) if (ROOT / "figures").is_dir() else []
    assert after == before, f"{path.name} wrote into the repository's figures/"
    if path.stem == "07_paper_figures":
        paper = tmp_path / "figures" / "paper"
        for suffix in ("pdf", "svg", "png"):
            assert list(paper.glob(f"*.{suffix}")), f"no {suffix} figure exported"
        assert "not ok" in text and ", 0 not ok" in text  # every exported file passed its check
        assert (tmp_path / "figures" / "readme_tokens.png").is_file()


def test_quickstart_runs_on_the_checkpoint_named_by_the_environment(tmp_path, monkeypatch):
    """ENGRAM_VIZ_CHECKPOINT switches the weights: here the synthetic Engram-only checkpoint (the
    shape a real V4.1-Flash checkpoint has: Engram layers fed by embedding streams)."""
    import nbformat
    from nbclient import NotebookClient

    from engram_viz.weights.synthetic import synthetic_checkpoint

    folder = synthetic_checkpoint("tiny", 0).path
    monkeypatch.setenv("ENGRAM_VIZ_CHECKPOINT", str(folder))
    monkeypatch.setenv("ENGRAM_VIZ_FIGURES_DIR", str(tmp_path / "figures"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    path = ROOT / "notebooks" / "01_quickstart.ipynb"
    nb = nbformat.read(path, as_version=4)
    NotebookClient(
        nb, kernel_name="python3", timeout=CELL_TIMEOUT_S, resources={"metadata": {"path": str(path.parent)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = json.dumps(outputs)
    assert f"checkpoint (seed 0; random weights, not trained) at {folder}" in text
    assert "Synthetic weights" in text and "embedding streams" in text
