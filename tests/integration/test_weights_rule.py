"""One rule picks the weights of every entry point: an explicit checkpoint, else
``$ENGRAM_VIZ_CHECKPOINT``, else the embedded default (``weights.resolve``). Each test points the
variable at a small synthetic folder (seed 7, the ``tiny`` preset, whose config differs from the
embedded default's) and checks that what ran is that folder, and that an explicit checkpoint wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engram_viz import settings
from engram_viz.apps import notebook as nb
from engram_viz.apps.app_server import ModelLoader
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.apps.widget import PromptComparison
from engram_viz.cli import main
from engram_viz.errors import EngramVizError
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.resolve import default_checkpoint, resolve_weights, weights_config, weights_source
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.tiny_folder import DEFAULT_DIR

TEXT = "Only Alexander the Great could tame the horse Bucephalus."


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("env") / "tiny-seed7", "tiny", seed=7, tokenizer=False)


@pytest.fixture()
def env(monkeypatch, folder) -> Path:
    """``$ENGRAM_VIZ_CHECKPOINT`` set to the synthetic folder."""
    monkeypatch.setenv(settings.CHECKPOINT, str(folder))
    return folder


def ran_on(label: str, folder: Path) -> bool:
    return str(folder) in label and "(seed 7;" in label


def test_the_rule_and_the_config_it_reads(env, monkeypatch, tmp_path):
    assert resolve_weights() == env and weights_config().name == "tiny"
    assert weights_source() == f"${settings.CHECKPOINT}={env}"
    assert resolve_weights(DEFAULT_DIR) == DEFAULT_DIR and weights_config(DEFAULT_DIR) == default_checkpoint().config
    monkeypatch.delenv(settings.CHECKPOINT)
    assert weights_config() == default_checkpoint().config != weights_config(env)
    assert weights_source() == "the embedded default weights"
    monkeypatch.setenv(settings.CHECKPOINT, str(tmp_path / "gone"))
    with pytest.raises(EngramVizError, match="gone does not exist"):
        weights_config()


def test_pipeline(env):
    pipe = Pipeline(device="cpu")
    assert ran_on(pipe.model_label, env) and pipe.config.name == "tiny" and pipe.lm is None
    explicit = Pipeline(DEFAULT_DIR, device="cpu")
    assert explicit.model_label == default_checkpoint().label and explicit.lm is not None
    assert Pipeline.from_checkpoint(DEFAULT_DIR, device="cpu").model_label == explicit.model_label
    synthetic = Pipeline.synthetic("tiny", 3, device="cpu")
    assert "SYNTHETIC tiny checkpoint (seed 3;" in synthetic.model_label and synthetic.streams_mode == "embedding"
    with pytest.raises(EngramVizError, match="expected a checkpoint folder or an opened Checkpoint, got None"):
        Pipeline.from_checkpoint(None)


def test_report(env, tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "mine", "text": TEXT}) + "\n", encoding="utf-8")
    out = tmp_path / "r"
    assert main(["report", "--prompts", str(prompts), "--out", str(out), "--device", "cpu", "--quiet"]) == 0
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    assert ran_on(prov["model"], env) and prov["config"] == "tiny"
    capsys.readouterr()
    missing = tmp_path / "missing"  # an explicit --checkpoint wins: the variable's folder is not used
    assert main(["report", "--checkpoint", str(missing), "--prompts", str(prompts), "--out", str(tmp_path / "x")]) == 2
    assert str(missing) in capsys.readouterr().err


def test_explain(env, capsys):
    assert main(["explain", TEXT, "--position", "3", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert ran_on(summary["model"], env) and len(summary["rows"]) == 2 * 24  # tiny: 2 Engram layers
    assert main(["explain", TEXT, "--position", "3", "--json", "--checkpoint", str(DEFAULT_DIR)]) == 0
    assert json.loads(capsys.readouterr().out)["model"] == default_checkpoint().label


def test_corpus_and_the_config_commands(env, tmp_path, tokenizer, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT + "\n\n" + TEXT + "\n", encoding="utf-8")
    assert main(["corpus", str(text), "--out", str(tmp_path / "c"), "--quiet"]) == 0
    assert json.loads((tmp_path / "c" / "summary.json").read_text())["config"] == "tiny"
    result = run_corpus([text], tmp_path / "lib", tokenizer=tokenizer, progress=False)
    assert result.stats.counts.config == weights_config(env)
    capsys.readouterr()
    assert main(["params", "--json"]) == 0 and json.loads(capsys.readouterr().out)["config"] == "tiny"
    assert main(["hash", TEXT]) == 0 and capsys.readouterr().out.startswith("config tiny:")
    default = default_checkpoint().config.name
    assert main(["params", "--json", "--config", str(DEFAULT_DIR / "config.json")]) == 0  # --config wins
    assert json.loads(capsys.readouterr().out)["config"] == default


def _loaded(checkpoint=None):
    """The app's model loader, run here (not in a thread): ready, or why not."""
    loader = ModelLoader(checkpoint, lambda line: None)
    loader.run()
    return loader


def test_app(env, monkeypatch, tmp_path):
    loader = _loaded()
    assert loader.ready and ran_on(loader.pipeline.model_label, env)  # the view's header names these weights
    monkeypatch.setenv(settings.CHECKPOINT, str(tmp_path / "gone"))
    message = _loaded().error
    assert "could not load the model from $ENGRAM_VIZ_CHECKPOINT=" in message and "gone" in message
    assert _loaded(str(DEFAULT_DIR)).pipeline.model_label == default_checkpoint().label


def test_widget(env):
    pytest.importorskip("ipywidgets")
    assert ran_on(PromptComparison().pipeline.model_label, env)
    assert PromptComparison(checkpoint=DEFAULT_DIR).pipeline.model_label == default_checkpoint().label


def test_notebook_glue(env):
    assert ran_on(nb.load_pipeline(device="cpu").model_label, env)
    assert nb.load_pipeline(DEFAULT_DIR, device="cpu").model_label == default_checkpoint().label
