"""engram_viz.weights.gguf_table / gguf_file / gguf_header: rows gathered lazily from real GGUF files (written
by gguf's own writer) equal gguf's own whole-tensor dequantisation, for every type gguf reads; the header parse
equals gguf's reader; row edits on a GGUF table; bounded memory on a full-size sparse table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFReader, GGUFWriter, quants
from gguf_kit import random_blocks, write_engram_gguf, write_table_gguf

from engram_viz.errors import CheckpointError, RowEditError
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.gguf_file import open_gguf
from engram_viz.weights.gguf_table import GGUFTable
from engram_viz.weights.row_edits import edit_rows
from engram_viz.weights.tiny_folder import DEFAULT_DIR

pytestmark = pytest.mark.unit

T = GGMLQuantizationType
QUANTISED = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "MXFP4", "BF16", "F16", "F32")  # gguf quantises these
NOT_QUANTISED = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ3_XXS", "IQ3_S")
NOT_QUANTISED += ("IQ1_S", "IQ1_M", "IQ4_NL", "IQ4_XS", "TQ1_0", "TQ2_0", "NVFP4")  # gguf dequantises these
NAME = "blk.1.engram_embd.weight"
IDS = torch.tensor([[0, 7, 7, 999], [3, 500, 0, 998]])


@pytest.fixture(scope="module")
def tiny_rows() -> np.ndarray:
    """The first 1,000 rows of the tiny LM's layer-1 table (float32 [1000, 32], the fp8 values exactly)."""
    table = open_checkpoint(DEFAULT_DIR).layer(1).table
    return table(torch.arange(1000)).float().numpy()


def _whole(path, name=NAME) -> np.ndarray:
    """gguf's own reader and dequantiser over the whole tensor: float32 [rows, cols]."""
    t = next(t for t in GGUFReader(path).tensors if t.name == name)
    return quants.dequantize(t.data, t.tensor_type).reshape(int(t.shape[1]), int(t.shape[0]))


def _check_gather(path, blocks: np.ndarray) -> GGUFTable:
    table = GGUFTable.open(path, NAME)
    whole = _whole(path)
    assert torch.equal(table(IDS), torch.from_numpy(whole[IDS.numpy()]).to(torch.bfloat16))
    w, s = table.gather_stored(IDS)
    assert np.array_equal(w.numpy(), blocks[IDS.numpy()]) and s.shape == (*IDS.shape, 0)
    return table


@pytest.mark.parametrize("name", QUANTISED)
def test_rows_of_the_tiny_lm_quantised_by_gguf(tmp_path, tiny_rows, name):
    qtype = T[name]
    blocks = np.ascontiguousarray(quants.quantize(tiny_rows, qtype)).view(np.uint8).reshape(len(tiny_rows), -1)
    path = write_table_gguf(tmp_path / f"{name}.gguf", NAME, blocks, qtype)
    table = _check_gather(path, blocks)
    assert table.bits_per_weight == 8 * GGML_QUANT_SIZES[qtype][1] / GGML_QUANT_SIZES[qtype][0]
    if name in ("BF16", "F32"):  # lossless for fp8 values
        assert torch.equal(table(IDS).float(), torch.from_numpy(tiny_rows[IDS.numpy()]))


@pytest.mark.parametrize("name", NOT_QUANTISED)
def test_rows_of_random_valid_blocks(tmp_path, name):
    qtype = T[name]
    blocks = random_blocks(qtype, 1000, 256, seed=len(name))
    _check_gather(write_table_gguf(tmp_path / f"{name}.gguf", NAME, blocks, qtype), blocks)


@pytest.mark.parametrize("name", QUANTISED + NOT_QUANTISED)
def test_zero_blocks_decode_to_zero_rows(name):
    qtype = T[name]
    size, nbytes = GGML_QUANT_SIZES[qtype]
    cols = max(256, size)
    assert not quants.dequantize(np.zeros((2, cols // size * nbytes), np.uint8), qtype).any()


def test_header_parse_equals_ggufs_reader(tmp_path):
    path = write_engram_gguf(tmp_path / "e.gguf", token_map=True)
    mine, theirs = open_gguf(path), GGUFReader(path)
    assert {t.name for t in theirs.tensors} == set(mine.tensors)
    for t in theirs.tensors:
        m = mine.tensors[t.name]
        assert (m.start, m.nbytes, m.qtype, m.shape) == (t.data_offset, t.n_bytes, t.tensor_type, tuple(t.shape[::-1]))
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):
            continue
        value, want = mine.value(key), field.contents()
        assert (value.tolist() if isinstance(value, np.ndarray) else value) == want, key


def test_a_type_gguf_cannot_dequantise_is_refused_by_name(tmp_path):
    blocks = np.zeros((4, 256 // 128 * 18), np.uint8)
    table = GGUFTable.open(write_table_gguf(tmp_path / "q1.gguf", NAME, blocks, T.Q1_0), NAME)
    with pytest.raises(CheckpointError, match="cannot dequantise GGML type Q1_0"):
        table(torch.tensor([1]))


def test_a_row_that_is_not_whole_blocks_is_refused(tmp_path):
    blocks = random_blocks(T.Q4_K, 4, 256)
    path = write_table_gguf(tmp_path / "k.gguf", NAME, blocks, T.Q4_K)
    table = GGUFTable.open(path, NAME)
    with pytest.raises(CheckpointError, match="not fp8 rows"):
        table.gather_fp8(torch.tensor([0]))
    with pytest.raises(CheckpointError, match="not a whole number of Q4_K blocks of 256"):
        GGUFTable(table.rows, T.Q4_K, 32)


def test_row_edits_on_a_gguf_table(tmp_path, tiny_rows):
    blocks = np.ascontiguousarray(quants.quantize(tiny_rows, T.Q8_0)).view(np.uint8).reshape(1000, -1)
    table = GGUFTable.open(write_table_gguf(tmp_path / "q8.gguf", NAME, blocks, T.Q8_0), NAME)
    ids = torch.tensor([5, 6, 7, 8])
    before = table(ids)
    new = torch.linspace(-1, 1, 32)
    with edit_rows(table, {5: "zero", 6: 9, 7: new}):
        got = table(ids)
        assert not got[0].any() and torch.equal(got[1], table(torch.tensor([9]))[0]) and torch.equal(got[3], before[3])
        want = quants.dequantize(quants.quantize(new.numpy()[None], T.Q8_0), T.Q8_0)[0]
        assert torch.equal(got[2], torch.from_numpy(want).to(torch.bfloat16))
    with edit_rows(table, range(7)):
        assert not table(ids)[:2].any() and torch.equal(table(ids)[2:], before[2:])
    assert torch.equal(table(ids), before)
    pair = (torch.zeros(32, dtype=torch.float8_e4m3fn), torch.zeros(1, dtype=torch.float8_e8m0fnu))
    with pytest.raises(RowEditError, match="fits fp8 tables only"), edit_rows(table, {5: pair}):
        pass


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import psutil, torch
    from engram_viz.weights.gguf_table import GGUFTable
    table = GGUFTable.open(sys.argv[1], "blk.14.engram_embd.weight")
    ids = torch.randint(0, table.num_rows, (2, 2048, 24), generator=torch.Generator().manual_seed(0))
    table(ids[:, :64])  # warm up imports, the thread pool and the compiled read loop (3,072 rows: compiled once)
    proc = psutil.Process()
    before = proc.memory_info().rss
    rows = table(ids)
    after = proc.memory_info().rss
    print(json.dumps({"growth": after - before, "shape": list(rows.shape), "zero": not rows.any().item(),
                      "rows": table.num_rows}))
    """
)


def test_full_size_sparse_table_gathers_with_bounded_memory(tmp_path):
    """A V4.1-Flash table at Q8_0 (384,016,682 x 256: 104 GB): header and tensor info written for real by
    gguf's writer, the data region sparse (truncate): 98,304 row reads grow RSS by under 200 MB."""
    rows, qtype = 384_016_682, T.Q8_0
    path = tmp_path / "v41.gguf"
    writer = GGUFWriter(None, "deepseek41")
    nbytes = rows * 256 // 32 * 34
    writer.add_tensor_info("blk.14.engram_embd.weight", (rows, 256 // 32 * 34), np.dtype(np.uint8), nbytes, qtype)
    writer.write_header_to_file(path)
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    header = path.stat().st_size
    os.truncate(path, -(-header // 32) * 32 + nbytes)
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, str(path)], capture_output=True, text=True, check=True)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["rows"] == rows and got["shape"] == [2, 2048, 24, 256] and got["zero"]
    assert got["growth"] < 200 * 2**20  # the bf16 result (50 MB) included
