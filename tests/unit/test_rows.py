"""engram_viz.weights.rows: lazy vs eager gathers, coalesced and threaded preads, row-split files,
pickling and fork, truncation after open, and bounded memory on a full-size sparse table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from weights_kit import (
    V41_ROWS,
    TensorRows,
    raw,
    write_tiny_table,
)

from engram_viz.errors import CheckpointError, RowIdError
from engram_viz.weights import rows as R
from engram_viz.weights.embedding import TokenEmbedding
from engram_viz.weights.rows import LazyRows
from engram_viz.weights.safetensors import create_sparse_safetensors, read_safetensors_header, read_tensor
from engram_viz.weights.tables import InMemoryTable, LazyTable


@pytest.fixture(scope="module")
def tiny_table_file(tmp_path_factory) -> tuple[Path, torch.Tensor, torch.Tensor]:
    """A 5,000 x 64 table written by the safetensors library (an independent writer)."""
    return write_tiny_table(tmp_path_factory.mktemp("table"))


@pytest.mark.parametrize(
    "ids",
    [
        "random",
        "dense",
        "duplicates",
        "edges",
        "gapped",
        "empty",
    ],
)
def test_lazy_gather_equals_eager_embedding(tiny_table_file, ids):
    path, w, s = tiny_table_file
    n = w.shape[0]
    g = torch.Generator().manual_seed(2)
    row_ids = {
        "random": torch.randint(0, n, (4, 9, 24), generator=g),
        "dense": torch.arange(100, 3100).reshape(30, 100),
        "duplicates": torch.tensor([[5, 5, 5, 4, 5], [4, 4, 4, 4, 4]]),
        "edges": torch.tensor([n - 1, 0, n - 1, 1]),
        "gapped": torch.arange(0, n, 7),
        "empty": torch.zeros(0, 24, dtype=torch.long),
    }[ids]
    table = LazyTable.open(path, "t.weight", "t.scale")
    gw, gs = table.gather_fp8(row_ids)
    assert gw.dtype == torch.float8_e4m3fn and gs.dtype == torch.float8_e8m0fnu
    assert gw.shape == (*row_ids.shape, 64) and gs.shape == (*row_ids.shape, 2)
    assert torch.equal(raw(gw), raw(F.embedding(row_ids, w)))
    assert torch.equal(raw(gs), raw(F.embedding(row_ids, s)))
    assert torch.equal(table(row_ids), InMemoryTable(w, s)(row_ids))


@pytest.fixture(params=["compiled", "python"])
def read_loop(request, monkeypatch) -> str:
    """The reads issued by the compiled loop (``pread_kernel``, needs numba) or by ``os.preadv`` from Python."""
    if request.param == "compiled":
        pytest.importorskip("numba")
    monkeypatch.setattr(R, "COMPILED_MIN_ROWS", 0 if request.param == "compiled" else 10**9)
    return request.param


@pytest.mark.parametrize("gap_bytes,max_read,threaded", [(0, 2**20, False), (4096, 1000, False), (10**6, 2**20, True)])
def test_coalescing_and_threads_do_not_change_rows(
    tiny_table_file, monkeypatch, read_loop, gap_bytes, max_read, threaded
):
    """Reads merged across gaps, split at read-size blocks, or issued from threads, by either read loop,
    give the same rows."""
    monkeypatch.setattr(R, "COALESCE_GAP_BYTES", dict.fromkeys(R.COALESCE_GAP_BYTES, gap_bytes))
    monkeypatch.setattr(R, "MAX_READ_BYTES", max_read)
    monkeypatch.setattr(R, "THREADED_MIN_READS", 1 if threaded else 10**9)
    path, w, s = tiny_table_file
    table = LazyTable.open(path, "t.weight", "t.scale")
    rng = np.random.default_rng(3)
    row_ids = torch.from_numpy(np.concatenate([rng.integers(0, 5000, 700), np.arange(1200, 1900), [4999, 0]]))
    gw, gs = table.gather_fp8(row_ids)
    assert torch.equal(raw(gw), raw(w[row_ids])) and torch.equal(raw(gs), raw(s[row_ids]))


def test_generic_row_reader_bf16_and_eager_read(tiny_table_file):
    path, _, _ = tiny_table_file
    header = read_safetensors_header(path)
    emb = read_tensor(header.tensors["emb"])
    rows = LazyRows(header.tensors["emb"])
    assert rows.dtype == torch.bfloat16 and (rows.num_rows, rows.cols) == (300, 48)
    ids = torch.tensor([[299, 0, 17], [17, 17, 5]])
    assert torch.equal(rows.gather(ids), emb[ids])
    token = TokenEmbedding(rows)
    assert torch.equal(token.rows(ids), F.embedding(ids, emb)) and token.dim == 48
    with pytest.raises(RowIdError, match="row id 300 out of range.*0..299"):
        token.rows(torch.tensor([300]))
    assert torch.equal(TokenEmbedding(TensorRows(emb))(ids), emb[ids])


def test_row_split_over_files_reads_as_one_table(tmp_path, tiny_table_file):
    """The mp layout: parts of ceil(rows / n) rows, the last padded (or short), read as one table."""
    _, w, s = tiny_table_file
    n_rows, world = w.shape[0], 3
    part = -(-n_rows // world)
    for last_padded in (True, False):
        paths = []
        for i in range(world):
            pw, ps = w[i * part : (i + 1) * part], s[i * part : (i + 1) * part]
            if last_padded and pw.shape[0] < part:
                pad = part - pw.shape[0]
                pw = torch.cat([raw(pw), torch.zeros(pad, 64, dtype=torch.uint8)]).view(torch.float8_e4m3fn)
                ps = torch.cat([raw(ps), torch.full((pad, 2), 127, dtype=torch.uint8)]).view(torch.float8_e8m0fnu)
            p = tmp_path / f"model{i}-mp{world}-{last_padded}.safetensors"
            save_file({"t.weight": pw.contiguous(), "t.scale": ps.contiguous()}, str(p))
            paths.append(p)
        table = LazyTable.open(paths, "t.weight", "t.scale", num_rows=n_rows)
        assert table.num_rows == n_rows
        ids = torch.tensor([0, part - 1, part, 2 * part - 1, 2 * part, n_rows - 1, 77, 4000])
        gw, gs = table.gather_fp8(ids)
        assert torch.equal(raw(gw), raw(w[ids])) and torch.equal(raw(gs), raw(s[ids]))
        with pytest.raises(RowIdError, match=f"row id {n_rows} out of range"):
            table(torch.tensor([n_rows]))  # a padded row exists in the file but is not part of the table


_FORKED_TABLE = None


def _gather_in_forked_child(ids: np.ndarray) -> np.ndarray:
    torch.set_num_threads(1)  # as DataLoader workers do: torch's OpenMP pool does not survive fork
    return _FORKED_TABLE(torch.from_numpy(ids)).view(torch.int16).numpy()


def test_lazy_table_pickles_and_survives_fork(tiny_table_file, monkeypatch):
    """Spawned workers get a pickled table (descriptors reopen); a forked child, whose parent had
    started the reader threads, gets a fresh thread pool instead of the parent's dead one."""
    import multiprocessing as mp
    import pickle

    monkeypatch.setattr(R, "THREADED_MIN_READS", 1)
    monkeypatch.setattr(R, "COALESCE_GAP_BYTES", dict.fromkeys(R.COALESCE_GAP_BYTES, 0))
    path, w, _ = tiny_table_file
    table = LazyTable.open(path, "t.weight", "t.scale")
    ids = torch.arange(0, 5000, 3)
    want = table(ids)  # threaded reads in the parent
    assert torch.equal(table.gather_fp8(ids)[0].view(torch.uint8), w[ids].view(torch.uint8))
    clone = pickle.loads(pickle.dumps(table))
    assert torch.equal(clone(ids), want)
    monkeypatch.setattr(sys.modules[__name__], "_FORKED_TABLE", table)
    with mp.get_context("fork").Pool(1) as pool:
        got = pool.apply_async(_gather_in_forked_child, (ids.numpy(),)).get(timeout=120)
    assert torch.equal(torch.from_numpy(got).view(torch.bfloat16), want)


def test_file_truncated_after_open_raises(tmp_path, tiny_table_file, read_loop):
    """A shard cut short between opening and reading: the read (by either read loop) names the file and tensor."""
    src, _, _ = tiny_table_file
    p = tmp_path / "t.safetensors"
    p.write_bytes(src.read_bytes())
    table = LazyTable.open(p, "t.weight", "t.scale")
    end = table.weight.parts[0].start + 100 * table.weight.row_bytes
    os.truncate(p, end)
    with pytest.raises(CheckpointError, match="truncated file") as info:
        table.gather_fp8(torch.tensor([10, 4000]))
    assert str(p) in str(info.value) and "t.weight" in str(info.value)


MEMORY_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import psutil, torch
    from engram_viz.weights.tables import LazyTable
    path, ids_path = sys.argv[1], sys.argv[2]
    table = LazyTable.open(path, "layers.14.engram.embed.weight", "layers.14.engram.embed.scale")
    ids = torch.load(ids_path)
    table(ids[:64])  # warm up imports, the thread pool and the compiled read loop (~1,500 rows: compiled once)
    proc = psutil.Process()
    try:
        open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM)
        peak_ok = True
    except OSError:
        peak_ok = False
    before = proc.memory_info().rss
    w, s = table.gather_fp8(ids)
    rows = table(ids)
    after = proc.memory_info().rss
    peak = None
    if peak_ok:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
    known = {str(r): rows[0, j].float().tolist()[:4] for j, r in enumerate(ids[0, :3].tolist())}
    print(json.dumps({"growth": after - before, "peak_growth": None if peak is None else peak - before,
                      "shape": list(rows.shape), "w_shape": list(w.shape), "known": known,
                      "nonzero_rows": int((rows.float().abs().sum(-1) > 0).sum())}))
    """
)


def test_full_size_sparse_table_bounded_memory(tmp_path):
    """The real table's logical size (384,016,682 x 256 e4m3 + scales) as a sparse file: it opens,
    serves a 4k-token prompt's rows (4096 x 24 ids) correctly, and resident memory grows < 200 MB."""
    path = tmp_path / "model-00048-of-00048.safetensors"
    wname, sname = "layers.14.engram.embed.weight", "layers.14.engram.embed.scale"
    header = create_sparse_safetensors(path, {wname: ("F8_E4M3", (V41_ROWS, 256)), sname: ("F8_E8M0", (V41_ROWS, 8))})
    assert header.file_size > 101 * 10**9 and os.stat(path).st_blocks * 512 < 2**20  # 101 GB, no disk
    # three known rows: first, last and one in the middle; everything else reads as zeros
    known = {0: 0x38, V41_ROWS - 1: 0x40, 123_456_789: 0xB8}  # 1.0, 2.0, -1.0
    fd = os.open(path, os.O_WRONLY)
    try:
        for row, byte in known.items():
            os.pwrite(fd, bytes([byte]) * 256, header.tensors[wname].start + row * 256)
            os.pwrite(fd, bytes([128]) * 8, header.tensors[sname].start + row * 8)  # scale 2.0
    finally:
        os.close(fd)
    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, V41_ROWS, (4096, 24), generator=g)
    ids[0, :3] = torch.tensor(list(known))
    torch.save(ids, tmp_path / "ids.pt")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    res = subprocess.run(
        [sys.executable, "-c", MEMORY_SCRIPT, str(path), str(tmp_path / "ids.pt")],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert out["shape"] == [4096, 24, 256] and out["w_shape"] == [4096, 24, 256]
    assert out["known"] == {str(0): [2.0] * 4, str(V41_ROWS - 1): [4.0] * 4, str(123_456_789): [-2.0] * 4}
    assert out["nonzero_rows"] == 3
    assert out["growth"] < 200 * 2**20, out
    if out["peak_growth"] is not None:
        assert out["peak_growth"] < 200 * 2**20, out
