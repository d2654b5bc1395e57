"""Non-finite weights (NaN/Inf) are refused: the bit rule per dtype, small tensors when a checkpoint
opens, table and embedding rows when gathered (only the rows read, named by id), and
``engram-viz inspect`` (small tensors always, whole tensors with ``--verify``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from weights_kit import poke

from engram_viz.cli import main
from engram_viz.errors import EngramVizError
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.inspect import inspect_checkpoint
from engram_viz.weights.nonfinite import NONFINITE_MASK, NonFiniteError, check_finite, nonfinite_rows
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.tables import InMemoryTable

T1, S1 = "layers.1.engram.embed.weight", "layers.1.engram.embed.scale"
BF16_NAN, BF16_INF = b"\xc0\x7f", b"\x80\x7f"  # 0x7FC0, 0x7F80 little-endian


@pytest.fixture()
def ckpt_dir(damaged_hf) -> Path:
    return damaged_hf


@pytest.mark.parametrize("dtype", list(NONFINITE_MASK))
def test_bit_rule_agrees_with_torch_on_every_pattern(dtype):
    """Every bit pattern of the 1- and 2-byte dtypes (a sample for the wider ones): the mask rule
    flags exactly the values torch decodes as NaN or Inf."""
    size = torch.empty(0, dtype=dtype).element_size()
    if size <= 2:
        bits = np.arange(256**size, dtype=np.uint16 if size == 2 else np.uint8)
    else:
        rng = np.random.default_rng(0)
        bits = rng.integers(0, 256, size=(4096, size), dtype=np.uint8).reshape(-1)
    raw = bits.view(np.uint8).reshape(-1, size)  # one element per row
    want = ~torch.isfinite(torch.from_numpy(raw.copy()).reshape(-1).view(dtype).double()).numpy()
    got = np.zeros(len(raw), dtype=bool)
    got[nonfinite_rows(raw, dtype)] = True
    assert np.array_equal(got, want)
    if dtype == torch.float8_e4m3fn:
        assert sorted(np.flatnonzero(got).tolist()) == [0x7F, 0xFF]
    if dtype == torch.float8_e8m0fnu:
        assert np.flatnonzero(got).tolist() == [0xFF]


def test_table_rows_are_checked_when_gathered(ckpt_dir):
    """A NaN scale (e8m0 0xFF) in row 123 and NaN weights (e4m3 0x7F / 0xFF) in rows 5 and 7: the
    checkpoint still opens (tables are lazy), rows without them read, any gather that reads them
    raises naming the file, the tensor and the rows."""
    scale_file = poke(ckpt_dir, S1, 123, b"\xff")
    poke(ckpt_dir, T1, 5, b"\x7f", col_byte=3)
    poke(ckpt_dir, T1, 7, b"\xff", col_byte=31)
    table = open_checkpoint(ckpt_dir).layers[1].table
    assert table(torch.tensor([[1, 2, 122, 124]])).isfinite().all()
    with pytest.raises(NonFiniteError, match=r"tensor 'layers\.1\.engram\.embed\.scale'.*0xFF.*rows \[123\]") as e:
        table(torch.tensor([[1, 123, 123]]))
    assert str(scale_file) in str(e.value) and isinstance(e.value, EngramVizError)
    for call in (table, table.gather_fp8):
        with pytest.raises(NonFiniteError, match=r"embed\.weight'.*0x7F/0xFF.*rows \[5, 7\]"):
            call(torch.tensor([7, 9, 5]))


@pytest.mark.parametrize(
    "name,values,what",
    [
        ("layers.3.engram.wkv.weight", b"\x7f", "0x7F/0xFF"),
        ("layers.3.engram.wkv.scale", b"\xff", "0xFF"),
        ("layers.1.engram.q_weight", BF16_NAN, "NaN or Inf"),
        ("layers.1.engram.k_weight", BF16_INF, "NaN or Inf"),
    ],
)
def test_small_tensors_are_checked_when_opened(ckpt_dir, name, values, what):
    path = poke(ckpt_dir, name, 1, values, col_byte=2)
    with pytest.raises(NonFiniteError, match=rf"tensor '{name}': non-finite weights \(.*{what}.*rows \[1\]") as e:
        open_checkpoint(ckpt_dir)
    assert str(path) in str(e.value)
    report = inspect_checkpoint(ckpt_dir)  # inspect reads the small tensors too (no --verify needed)
    assert report["valid"] is False and name in report["error"]


def test_embedding_rows_are_checked_when_read(ckpt_dir):
    poke(ckpt_dir, "embed.weight", 42, BF16_NAN, col_byte=10)
    embed = open_checkpoint(ckpt_dir).embed
    assert embed.rows(torch.tensor([1, 41, 43])).isfinite().all()
    with pytest.raises(NonFiniteError, match=r"tensor 'embed\.weight'.*rows \[42\]"):
        embed.rows(torch.tensor([[3, 42]]))


def test_in_memory_tables_are_checked_too():
    w = torch.zeros(10, 32, dtype=torch.uint8)
    s = torch.full((10, 1), 127, dtype=torch.uint8)
    w[4, 0], s[8, 0] = 0xFF, 0xFF
    table = InMemoryTable(w.view(torch.float8_e4m3fn), s.view(torch.float8_e8m0fnu), label="my table")
    assert table(torch.tensor([0, 1, 9])).isfinite().all()
    with pytest.raises(NonFiniteError, match=r"my table: weight: .*rows \[4\]"):
        table(torch.tensor([4, 4, 0]))
    with pytest.raises(NonFiniteError, match=r"my table: scale: .*rows \[8\]"):
        table.gather_fp8(torch.tensor([8]))
    with pytest.raises(NonFiniteError, match=r"x: non-finite .* rows \[0, 2\]"):
        check_finite(torch.tensor([[float("nan"), 1.0], [2.0, 3.0], [1.0, float("inf")]]), "x")


def test_inspect_verify_scans_whole_tensors(ckpt_dir, capsys):
    """Plain inspect stays header + small-tensor fast and says ok; ``--verify`` reads every byte and
    reports each bad tensor with its rows; the exit code is 1 as for any failed check."""
    poke(ckpt_dir, S1, 50_000, b"\xff")
    poke(ckpt_dir, "layers.3.engram.embed.weight", 9, b"\x7f\x7f")
    poke(ckpt_dir, "layers.3.engram.embed.weight", 54_000, b"\xff")
    assert inspect_checkpoint(ckpt_dir)["valid"] is True
    report = inspect_checkpoint(ckpt_dir, verify=True, progress=False)
    assert report["valid"] is False and report["verify"]["tensors"] == 13
    bad = {b["name"]: b for b in report["verify"]["bad"]}
    assert set(bad) == {S1, "layers.3.engram.embed.weight"}
    assert (bad[S1]["nonfinite_values"], bad[S1]["first_rows"]) == (1, [50_000])
    t3 = bad["layers.3.engram.embed.weight"]
    assert (t3["nonfinite_values"], t3["rows"], t3["first_rows"]) == (3, 2, [9, 54_000])
    assert len(report["problems"]) == 2 and all(".safetensors: tensor 'layers." in p for p in report["problems"])

    with pytest.raises(SystemExit) as info:
        main(["inspect", str(ckpt_dir), "--verify"])
    out, err = capsys.readouterr()
    assert info.value.code == 1
    assert "verify: 13 tensors" in out and "2 tensors hold NaN/Inf" in out and "FAILED" in out
    assert "first rows [9, 54000]" in out and "Traceback" not in err
    assert main(["inspect", str(ckpt_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["verify"] is None


def test_verify_clean_checkpoint_mp_layout(tmp_path, capsys):
    mp = write_synthetic_checkpoint(tmp_path / "mp", "tiny", world_size=2, tokenizer=False)
    report = inspect_checkpoint(mp, verify=True, progress=False)
    assert report["valid"] is True and report["verify"]["bad"] == []
    assert report["verify"]["bytes"] == report["engram_bytes"]
    poke(mp, S1, 3, b"\xff")  # part 0 holds rows 0..25073, part 1 the rest
    poke(mp, S1, 2, b"\xff", part=1)
    (bad,) = inspect_checkpoint(mp, verify=True, progress=False)["verify"]["bad"]
    assert bad["files"] == ["model0-mp2.safetensors", "model1-mp2.safetensors"]
    assert bad["first_rows"] == [3, 25_076]
    table = open_checkpoint(mp).layers[1].table
    with pytest.raises(
        NonFiniteError, match=r"model1-mp2\.safetensors: tensor '.*embed\.scale' \(part 1 of 2.*\[25076\]"
    ):
        table(torch.tensor([25_076, 9]))
