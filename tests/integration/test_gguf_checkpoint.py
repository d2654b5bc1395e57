"""engram_viz.weights.gguf_checkpoint / gguf_constants / gguf_export, engram_viz.tiny.gguf_model: GGUF files
opened as checkpoints: the constants checked against the layout and the token map (a mismatch refused with the
key and the first differing value), bad files refused (truncated, a tensor missing, a wrong shape, an unknown
type, a short table), a fork's names, and the tiny LM run from a GGUF file of its tables."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType
from gguf_kit import write_engram_gguf

from engram_viz.analysis.explain.explanation import explain
from engram_viz.cli import main
from engram_viz.core.schema import gguf_names
from engram_viz.errors import CheckpointError, InputError
from engram_viz.run.counterfactual import compare_edit
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.gguf_checkpoint import open_gguf_checkpoint
from engram_viz.weights.gguf_export import export_gguf
from engram_viz.weights.gguf_file import open_gguf
from engram_viz.weights.gguf_inspect import inspect_gguf
from engram_viz.weights.gguf_table import GGUFTable
from engram_viz.weights.resolve import open_weights, weights_config
from engram_viz.weights.tiny_folder import DEFAULT_DIR

T = GGMLQuantizationType
# Q8_0 tables move no gate of the tiny LM by MOVED (0.05) or more (measured over the default prompts: max 0.0497,
# p99 0.0042); each change is within the signed square root's own bound sqrt(2 |d dot|) / 4 (sigmoid's slope is at
# most 1/4, and |sign(a) sqrt|a| - sign(b) sqrt|b|| <= sqrt(2 |a - b|)): large only where the dot is near 0
Q8_0_GATE_BOUND = 0.05
PROMPTS = [
    "Alexander the Great crossed the Mediterranean Sea.",
    "In the beginning God created the heaven and the earth.",
]


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write_engram_gguf(tmp_path_factory.mktemp("g") / "tiny.gguf", token_map=True)


def test_a_gguf_checkpoint_opens_with_its_constants_checked(good):
    ckpt = open_weights(good)
    assert ckpt.config.name == "tiny" and ckpt.layout == "gguf" and weights_config(good).name == "tiny"
    table = ckpt.layer(3).table
    assert isinstance(table, GGUFTable) and table.num_rows == 54840 and table.qtype == T.Q8_0
    assert ckpt.layer(1).wkv_scale is None and ckpt.layer(1).q_weight.dtype == torch.bfloat16
    assert ckpt.embed.rows(torch.tensor([5, 129279])).shape == (2, 64)
    assert "Q8_0 tables" in ckpt.label


@pytest.mark.parametrize(
    ("role", "index", "value", "key"),
    [
        ("primes", 5, 7, r"deepseek41\.engram\.primes\[5\] is 7; the suite's layout of config 'tiny' has \d+"),
        ("multipliers", 2, 3, r"multipliers\[2\] is 3;"),
        ("offsets", 1, 0, r"offsets\[1\] is 0;"),
        ("pad_id", 0, 5, r"pad_id\[0\] is 5; .* has 2"),
        ("layer_ids", 1, 14, r"layer_ids\[1\] is 14; .* has 3"),
        ("token_map", 100, 0, r"token_map\[100\] is 0; the suite's token map has \d+"),
    ],
)
def test_a_constant_that_disagrees_is_refused_naming_key_and_value(tmp_path, role, index, value, key):
    path = write_engram_gguf(tmp_path / "bad.gguf", token_map=role == "token_map", wrong={role: (index, value)})
    with pytest.raises(CheckpointError, match=key) as info:
        open_gguf_checkpoint(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("knobs", "match"),
    [
        (
            {"drop": ("blk.3.engram_wkv.weight",)},
            r"tensor 'blk\.3\.engram_wkv\.weight' not found \(wkv of layer 3 needs",
        ),
        ({"drop": ("blk.1.engram_embd.weight",)}, r"tensor 'blk\.1\.engram_embd\.weight' not found"),
        (
            {"shapes": {"blk.1.engram_q.weight": (4, 63)}},
            r"engram_q\.weight' \(F32 \[4, 63\]\): q_weight must have shape \[4, 64\]",
        ),
        ({"short_rows": 1}, r"the table of layer 1 must be \[50,148, 32\]"),
    ],
)
def test_bad_tensors_are_refused(tmp_path, knobs, match):
    path = write_engram_gguf(tmp_path / "bad.gguf", **knobs)
    with pytest.raises(CheckpointError, match=match):
        open_gguf_checkpoint(path)


def test_a_truncated_file_and_an_unknown_type_are_refused(tmp_path, good):
    data = good.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError, match=r"tensor 'token_embd\.weight' .* the file has [\d,]+ \(truncated\)"):
        open_gguf(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:300])
    with pytest.raises(CheckpointError, match="not a readable GGUF file: the header runs past the end"):
        open_gguf(head)
    name = b"blk.1.engram_embd.weight"
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name) + 4 + 2 * 8  # its type, after 2 dims
    assert struct.unpack_from("<I", data, at)[0] == T.Q8_0
    odd = tmp_path / "odd.gguf"
    odd.write_bytes(data[:at] + struct.pack("<I", 99) + data[at + 4 :])
    with pytest.raises(CheckpointError, match=r"tensor 'blk\.1\.engram_embd\.weight' has unknown GGML type 99"):
        open_gguf(odd)
    not_gguf = tmp_path / "x.gguf"
    not_gguf.write_bytes(b"PK\x03\x04" + bytes(100))
    with pytest.raises(CheckpointError, match="does not start with the GGUF magic"):
        open_gguf(not_gguf)


def test_a_forks_names_through_the_name_map(tmp_path):
    fork = {"table_weight": "model.layers.{layer}.engram.table"}
    path = write_engram_gguf(tmp_path / "fork.gguf", names=fork)
    with pytest.raises(CheckpointError, match=r"tensor 'blk\.1\.engram_embd\.weight' not found"):
        open_gguf_checkpoint(path)
    assert open_gguf_checkpoint(path, names=fork).layer(1).table.num_rows == 50148
    with pytest.raises(InputError, match="unknown role 'tabel'"):
        gguf_names({"tabel": "x"})


@pytest.fixture(scope="module")
def tiny_ggufs(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    return {q: export_gguf(DEFAULT_DIR, out / f"tiny_{q}.gguf", q) for q in ("Q8_0", "BF16")}


def test_the_tiny_lm_from_a_gguf_file_matches_its_folder(tiny_ggufs):
    """BF16 holds fp8 values exactly: the same gates; Q8_0: the same row ids, gates within the bound."""
    folder = Pipeline(DEFAULT_DIR).run(PROMPTS, names=["engram.*.dot"])
    for q, path in tiny_ggufs.items():
        pipe = Pipeline(path)
        assert pipe.streams_mode == "model" and f"{q} tables" in pipe.model_label
        trace = pipe.run(PROMPTS, names=["engram.*.dot"])
        assert torch.equal(trace.row_ids, folder.row_ids)
        change = (trace.gates - folder.gates).abs()
        assert change.max() == 0 if q == "BF16" else 0 < change.max() < Q8_0_GATE_BOUND
        for layer, dot in trace.captured("dot").items():
            bound = (2 * (dot - folder.captured("dot")[layer]).abs()).sqrt() / 4
            assert (change[:, :, trace.layer_ids.index(layer)] <= bound + 1e-6).all()


def test_the_exported_constants_and_tensors(tiny_ggufs):
    f = open_gguf(tiny_ggufs["Q8_0"])
    assert f.arch == "deepseek41" and f.value("deepseek41.engram.primes").dtype == np.uint64
    assert f.value("deepseek41.engram.token_map").shape == (129280,)
    assert f.tensors["blk.1.engram_embd.weight"].shape == (242682, 32)
    assert f.tensors["tiny.embed.raw_ids"].qtype == T.I64


def test_inspect_a_gguf_file(tmp_path, good, capsys):
    assert main(["inspect", str(good)]) == 0
    text = capsys.readouterr().out
    assert "blk.1.engram_embd.weight" in text and "Q8_0" in text and "check against config tiny: ok" in text
    bad = write_engram_gguf(tmp_path / "bad.gguf", wrong={"primes": (0, 11)})
    report = inspect_gguf(bad)
    assert report["valid"] is False and "primes[0] is 11" in report["error"] and report["layout"] == "gguf"


def test_export_gguf_command_refuses_a_type_without_quantiser(tmp_path, capsys):
    out = tmp_path / "x.gguf"
    assert main(["export-gguf", "--type", "Q4_K", "--out", str(out)]) == 2
    assert "no quantiser for GGML type Q4_K" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())  # nothing written, no temporary left
    assert main(["export-gguf", "--type", "Q9", "--out", str(out)]) == 2
    assert "unknown GGML type 'Q9'" in capsys.readouterr().err


def test_explain_and_row_edits_through_a_pipeline_on_a_gguf_file(tiny_ggufs):
    pipe = Pipeline(tiny_ggufs["Q8_0"])
    trace = pipe.run([PROMPTS[0]])
    ex = explain(pipe, PROMPTS[0])
    torch.testing.assert_close(ex.layers[1].gate[3], trace.gates[0, 3, 0], atol=1e-6, rtol=0)
    row = int(trace.row_ids[0, 3, 0, 5])
    effect = compare_edit(pipe, [PROMPTS[0]], {1: [row]})
    assert effect.reads["row"].tolist() == [row] and effect.loss is not None
    assert effect.positions.query("layer == 1 and position == 3")["d_gate_max"].item() > 0
