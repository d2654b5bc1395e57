"""engram_viz.analysis.quant and `engram-viz quant-report`: candidate tables against the tiny LM's fp8 tables.
A type applied on the fly equals the same type written to a GGUF file (one code path); the row error equals an
independent computation (gguf's quantise and dequantise of the rows the prompts read); Engram off is the end point."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, quants

from engram_viz.analysis.quant.candidates import candidate
from engram_viz.analysis.quant.study import quant_study
from engram_viz.apps.report_sections import _quant_section
from engram_viz.cli import main
from engram_viz.errors import CheckpointError
from engram_viz.run.prompts import Prompt, build_prompt
from engram_viz.tiny.files import load_tiny_model
from engram_viz.weights.gguf_export import export_gguf
from engram_viz.weights.tiny_folder import DEFAULT_DIR

PROMPTS = [
    Prompt("a", "english_entities", "Alexander the Great crossed the Mediterranean Sea."),
    Prompt("b", "chinese", "天下大事，必作于细。"),
]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    path = export_gguf(DEFAULT_DIR, tmp_path_factory.mktemp("q") / "tiny_q4.gguf", "Q4_0")
    model = load_tiny_model()
    return quant_study(model, PROMPTS, ["Q8_0", "Q4_0", str(path), "off"]), model


def test_on_the_fly_equals_the_gguf_file(study):
    s = study[0].summary.set_index("candidate")
    numbers = s.select_dtypes("number").columns
    assert s.loc["Q4_0", numbers].equals(s.loc["tiny_q4.gguf", numbers])
    assert s.loc["Q4_0", "bits_per_weight"] == 4.5 and s.loc["Q8_0", "bits_per_weight"] == 8.5


def test_quality_falls_with_bits_and_engram_off_is_the_end_point(study):
    s = study[0].summary.set_index("candidate")
    assert 0 < s.loc["Q8_0", "row_error"] < s.loc["Q4_0", "row_error"] < s.loc["Engram off", "row_error"] == 1
    assert s.loc["Q8_0", "kl"] < s.loc["Q4_0", "kl"] < s.loc["Engram off", "kl"]
    assert s.loc["Engram off", "value_error"] == 1 and s.loc["Engram off", "table_gb"] == 0
    assert (s["kl"] >= -1e-7).all() and (s["positions"] == s.loc["Q8_0", "positions"]).all()
    assert set(study[0].by_category["category"]) == {"english_entities", "chinese"}


def test_row_error_equals_an_independent_computation(study):
    """Per (layer, order, head): gguf quantises and dequantises the fp8 rows the prompts read, rounded to bf16."""
    result, model = study
    got = result.columns[result.columns["candidate"] == "Q4_0"].set_index(["layer", "order", "head"])["row_error"]
    err = {}
    for p in PROMPTS:
        built = build_prompt(p, config=model.config)
        ids = model.hash_ids(torch.from_numpy(built.input_ids)[None])[0]  # [T, n_layers, 24]
        for li, (key, e) in enumerate(model.engrams.items()):
            ref = e.table(ids[:, li]).float().numpy()  # [T, 24, 32]
            flat = ref.reshape(-1, 32)
            q = quants.dequantize(quants.quantize(flat, GGMLQuantizationType.Q4_0), GGMLQuantizationType.Q4_0)
            q = torch.from_numpy(q).to(torch.bfloat16).float().numpy().reshape(ref.shape)
            for c in range(24):
                a, b = err.get((int(key), c), (0.0, 0.0))
                err[(int(key), c)] = (a + float(((q[:, c] - ref[:, c]) ** 2).sum()), b + float((ref[:, c] ** 2).sum()))
    for (layer, c), (sq_err, sq_ref) in err.items():
        assert got.loc[(layer, c // 8 + 2, c % 8)] == pytest.approx(np.sqrt(sq_err / sq_ref), rel=1e-5)


def test_the_report_section_and_its_figure(study):
    section = _quant_section(study[0], "light")
    figure, table = section.parts
    assert section.id == "quant" and table.frame["candidate"].tolist() == ["Q8_0", "Q4_0", "tiny_q4.gguf", "Engram off"]
    left, right = figure.draw()
    assert left.get_yscale() == "log" and len(right.get_legend().get_texts()) == 4


def test_unknown_candidates_are_refused():
    table = load_tiny_model().engrams["1"].table
    with pytest.raises(CheckpointError, match="unknown GGML type 'Q9_9'; expected one of F32, F16, Q4_0"):
        candidate("Q9_9", {1: table})
    with pytest.raises(CheckpointError, match="candidate Q4_K: the gguf package has no quantiser for GGML type Q4_K"):
        candidate("Q4_K", {1: table})
    with pytest.raises(CheckpointError, match="a row of 32 values is not a whole number of TQ1_0 blocks of 256"):
        candidate("TQ1_0", {1: table})


def test_quant_report_command(tmp_path, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "category": "x", "text": PROMPTS[0].text}) + "\n")
    out = tmp_path / "out"
    assert (
        main(["quant-report", "--candidates", "Q8_0,off", "--prompts", str(prompts), "--out", str(out), "--quiet"]) == 0
    )
    text = capsys.readouterr().out
    assert "Q8_0" in text and "Engram off" in text
    names = {p.name for p in out.iterdir()}
    assert {
        "quant_summary.csv",
        "quant_by_group.parquet",
        "quant_quality.png",
        "quant_quality.svg",
        "summary.json",
    } <= names
    assert main(["quant-report", "--candidates", "Q4_K", "--prompts", str(prompts), "--out", str(tmp_path / "o2")]) == 2
    assert "no quantiser for GGML type Q4_K" in capsys.readouterr().err and not (tmp_path / "o2").exists()
