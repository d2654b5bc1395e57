"""engram_viz.weights.checkpoint: synthetic round trips (bit-identical), hf vs mp layouts, every error case
raising CheckpointError without leaving files behind, and a full-size sparse checkpoint at the real dimensions."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from weights_kit import (
    SHARD,
    TORCH_TO_SAFETENSORS,
    all_tensors,
    describe_checkpoint,
    listing,
    same,
)

from engram_viz.config import CONFIG_DIR
from engram_viz.core import fp8
from engram_viz.core.schema import expected_tensors
from engram_viz.errors import CheckpointError, RowIdError
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.inspect import inspect_checkpoint
from engram_viz.weights.safetensors import create_sparse_safetensors, read_safetensors_header, read_tensor
from engram_viz.weights.scan import scan_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.tables import LazyTable

INDEX = "model.safetensors.index.json"


@pytest.fixture()
def broken(tmp_path, hf_dir) -> Path:
    """A private copy of the HF checkpoint (no tokenizer) to damage."""
    out = tmp_path / "ckpt"
    shutil.copytree(hf_dir, out, ignore=shutil.ignore_patterns("tokenizer.json"))
    return out


def test_round_trip_is_bit_identical(hf_dir, tiny_tensors, tiny_config):
    ckpt = open_checkpoint(hf_dir)
    got = all_tensors(ckpt)
    want = expected_tensors(tiny_config)
    assert set(got) == set(tiny_tensors) == set(want)
    for name, t in got.items():
        dtype, shape = want[name]
        assert TORCH_TO_SAFETENSORS[t.dtype] == dtype and tuple(t.shape) == shape, name
        assert same(t, tiny_tensors[name]), name


def test_reader_agrees_with_the_safetensors_library(hf_dir):
    """Every tensor of every shard: our header parser + pread == safetensors' own reader."""
    for shard in sorted(hf_dir.glob("*.safetensors")):
        header = read_safetensors_header(shard)
        assert header.metadata["engram_viz_synthetic"] == "true"
        with safe_open(str(shard), framework="pt") as f:
            assert set(f.keys()) == set(header.tensors)
            for name in f.keys():  # noqa: SIM118 - safe_open is not a dict
                assert same(read_tensor(header.tensors[name]), f.get_tensor(name)), (shard.name, name)


def test_lazy_gathers_equal_eager_embedding(hf_dir):
    ckpt = open_checkpoint(hf_dir)
    shard = load_file(str(hf_dir / SHARD.format(3)))
    table = ckpt.layers[3].table
    assert isinstance(table, LazyTable)
    ids = torch.randint(0, table.num_rows, (2, 33, 24), generator=torch.Generator().manual_seed(0))
    w, s = shard["layers.3.engram.embed.weight"], shard["layers.3.engram.embed.scale"]
    gw, gs = table.gather_fp8(ids)
    assert same(gw, torch.nn.functional.embedding(ids, w)) and same(gs, torch.nn.functional.embedding(ids, s))
    assert torch.equal(
        table(ids), fp8.dequantize_rows(torch.nn.functional.embedding(ids, w), torch.nn.functional.embedding(ids, s))
    )
    emb = load_file(str(hf_dir / SHARD.format(1)))["embed.weight"]
    raw = torch.tensor([[0, 1, 2, 129_279, 5, 5]])
    assert same(ckpt.embed.rows(raw), torch.nn.functional.embedding(raw, emb))


@pytest.mark.parametrize("world_size", [1, 2, 5])
def test_mp_layout_reads_the_same_as_hf(tmp_path, hf_dir, world_size):
    """model{i}-mp{n}: tables split into ceil(rows / n)-row parts (the last padded), embed split,
    the rest replicated; every tensor reads back identical to the HF layout."""
    mp = write_synthetic_checkpoint(
        tmp_path / "mp", "tiny", seed=0, world_size=world_size, layout="mp", tokenizer=False
    )
    assert sorted(p.name for p in mp.glob("*.safetensors")) == [
        f"model{i}-mp{world_size}.safetensors" for i in range(world_size)
    ]
    a, b = all_tensors(open_checkpoint(hf_dir)), all_tensors(ckpt := open_checkpoint(mp))
    assert ckpt.layout == "mp" and ckpt.synthetic
    for name in a:
        assert same(a[name], b[name]), name
    if world_size == 5:  # 50148 rows over 5 parts of 10030: the last part is padded by 2 rows
        parts = scan_checkpoint(mp).tensors["layers.1.engram.embed.weight"].parts
        assert [p.shape[0] for p in parts] == [10030] * 5


def test_mp_layout_with_replicated_embed_and_short_last_part(tmp_path, tiny_tensors, hf_dir):
    """The other shapes a converter may produce: embed.weight whole in every part, the last table part short."""
    folder = tmp_path / "mp3"
    folder.mkdir()
    n = 3
    for i in range(n):
        part = {}
        for name, t in tiny_tensors.items():
            if name.endswith((".engram.embed.weight", ".engram.embed.scale")):
                rows = -(-t.shape[0] // n)
                part[name] = t[i * rows : (i + 1) * rows].contiguous()
            else:
                part[name] = t
        save_file(part, str(folder / f"model{i}-mp{n}.safetensors"))
    shutil.copyfile(CONFIG_DIR / "tiny.json", folder / "config.json")
    ckpt = open_checkpoint(folder)
    assert not ckpt.synthetic and ckpt.label.startswith("checkpoint ") and ckpt.tokenizer_path is None
    got = all_tensors(ckpt)
    for name, t in tiny_tensors.items():
        assert same(got[name], t), name


def test_provenance_and_config(hf_dir, tiny_config):
    ckpt = open_checkpoint(hf_dir)
    assert ckpt.synthetic and ckpt.label.startswith("SYNTHETIC tiny checkpoint (seed 0")
    assert ckpt.config == tiny_config  # the folder's config.json is recognised as the preset
    assert ckpt.tokenizer_path == hf_dir / "tokenizer.json" and ckpt.tokenizer_path.is_file()
    assert all(w.table.synthetic and w.table.label.startswith("SYNTHETIC") for w in ckpt.layers.values())
    assert ckpt.embed.synthetic and ckpt.embed.label.startswith("SYNTHETIC")
    assert json.loads((hf_dir / "SYNTHETIC.json").read_text())["synthetic"] is True
    assert json.loads(json.dumps(describe_checkpoint(ckpt)))["synthetic"] is True
    assert open_checkpoint(hf_dir / INDEX, config="tiny").config == tiny_config  # a file inside the folder works too
    with pytest.raises(KeyError, match="expected one of \\[1, 3\\]"):
        ckpt.layer(2)


def test_a_plain_folder_is_not_labelled_synthetic(tmp_path, tiny_tensors):
    folder = tmp_path / "plain"
    folder.mkdir()
    save_file(tiny_tensors, str(folder / "model.safetensors"))
    ckpt = open_checkpoint(folder, config="tiny")
    assert not ckpt.synthetic and "SYNTHETIC" not in ckpt.label and not ckpt.layers[1].table.synthetic


def _rewrite_shard(path: Path, edit) -> None:
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def _drop_from_index(folder: Path, name: str) -> None:
    doc = json.loads((folder / INDEX).read_text())
    del doc["weight_map"][name]
    (folder / INDEX).write_text(json.dumps(doc))


def _corrupt_header(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(8)
        fh.write(b"\xff\xfe garbage")


ERROR_CASES = {
    "missing tensor (index)": (
        lambda d: _drop_from_index(d, "layers.3.engram.q_weight"),
        r"model\.safetensors\.index\.json: tensor 'layers\.3\.engram\.q_weight' not found",
    ),
    "missing tensor (shard)": (
        lambda d: _rewrite_shard(d / SHARD.format(2), lambda t: t.pop("layers.3.engram.q_weight")),
        r"model-00002-of-00003\.safetensors: tensor 'layers\.3\.engram\.q_weight' not found",
    ),
    "wrong dtype": (
        lambda d: _rewrite_shard(
            d / SHARD.format(2), lambda t: t.update({"layers.1.engram.k_weight": t["layers.1.engram.k_weight"].float()})
        ),
        r"model-00002-of-00003\.safetensors: tensor 'layers\.1\.engram\.k_weight' has dtype F32, expected BF16",
    ),
    "wrong table dtype": (
        lambda d: _rewrite_shard(
            d / SHARD.format(3),
            lambda t: t.update({"layers.3.engram.embed.scale": t["layers.3.engram.embed.scale"].view(torch.uint8)}),
        ),
        r"model-00003-of-00003\.safetensors: tensor 'layers\.3\.engram\.embed\.scale' has dtype U8, expected F8_E8M0",
    ),
    "wrong shape": (
        lambda d: _rewrite_shard(
            d / SHARD.format(2),
            lambda t: t.update({"layers.1.engram.q_weight": torch.ones(4, 63, dtype=torch.bfloat16)}),
        ),
        r"model-00002-of-00003\.safetensors: tensor 'layers\.1\.engram\.q_weight' has shape \[4, 63\], expected \[4, 64\]",
    ),
    "wrong table rows": (
        lambda d: _rewrite_shard(
            d / SHARD.format(3),
            lambda t: t.update(
                {k: t[k][:-1].contiguous() for k in ("layers.3.engram.embed.weight", "layers.3.engram.embed.scale")}
            ),
        ),
        r"tensor 'layers\.3\.engram\.embed\.(weight|scale)' has shape \[54839, (32|1)\], expected \[54840",
    ),
    "truncated shard": (
        lambda d: os.truncate(d / SHARD.format(3), (d / SHARD.format(3)).stat().st_size - 1000),
        r"model-00003-of-00003\.safetensors: tensor 'layers\.3\.engram\.embed\.\w+': truncated file",
    ),
    "corrupt header": (
        lambda d: _corrupt_header(d / SHARD.format(1)),
        r"model-00001-of-00003\.safetensors: corrupt safetensors header",
    ),
    "missing index file": (
        lambda d: (d / INDEX).unlink(),
        r"missing index file model\.safetensors\.index\.json.*3 safetensors files",
    ),
    "corrupt index file": (
        lambda d: (d / INDEX).write_text('{"weight_map": '),
        r"index file .*model\.safetensors\.index\.json is corrupt",
    ),
    "missing shard": (
        lambda d: (d / SHARD.format(3)).unlink(),
        r"shard .*model-00003-of-00003\.safetensors \(holding tensor 'layers\.3\.engram\.embed\.\w+'\) does not exist",
    ),
    "missing config": (
        lambda d: (d / "config.json").unlink(),
        r"has no config\.json; pass config=",
    ),
}


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_errors_name_file_and_tensor_and_leave_nothing(broken, case):
    damage, pattern = ERROR_CASES[case]
    damage(broken)
    before = listing(broken)
    with pytest.raises(CheckpointError, match=pattern):
        open_checkpoint(broken)
    report = None
    try:
        report = inspect_checkpoint(broken)
    except CheckpointError:
        pass  # inspect may not even scan it; when it does, it must flag the problem
    if report is not None:
        assert report["valid"] is not True
    assert listing(broken) == before  # reading never writes


def test_id_past_the_table_end(hf_dir):
    ckpt = open_checkpoint(hf_dir)
    table = ckpt.layers[1].table
    for call in (table, table.gather_fp8):
        with pytest.raises(RowIdError, match=r"row id 50148 out of range .*expected 0\.\.50147") as info:
            call(torch.tensor([[1, 50_148]]))
        assert isinstance(info.value, CheckpointError)
    with pytest.raises(CheckpointError, match=r"row id 129280 out of range for token embedding"):
        ckpt.embed.rows(torch.tensor([129_280]))


def test_mp_errors(tmp_path):
    mp = write_synthetic_checkpoint(tmp_path / "mp", "tiny", world_size=2, tokenizer=False)
    (mp / "model1-mp2.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"needs 2 parts; missing \['model1-mp2\.safetensors'\]"):
        open_checkpoint(mp)
    mp = write_synthetic_checkpoint(tmp_path / "mp2", "tiny", world_size=2, tokenizer=False)
    _rewrite_shard(
        mp / "model0-mp2.safetensors",
        lambda t: t.update({"layers.1.engram.embed.weight": t["layers.1.engram.embed.weight"][:-3].contiguous()}),
    )
    with pytest.raises(
        CheckpointError,
        match=r"model0-mp2\.safetensors: tensor 'layers\.1\.engram\.embed\.weight' \(part 0 of 2\) has shape",
    ):
        open_checkpoint(mp)


def test_full_size_sparse_checkpoint_opens_lazily(tmp_path, v41_config):
    """Shards at the real shapes (two 101 GB tables, embed 1.3 GB) as sparse files: the checkpoint
    opens against the v41-flash config, tables stay lazy, inspect reports the true sizes."""
    folder = tmp_path / "v41"
    folder.mkdir()
    want = expected_tensors(v41_config)
    t14 = [n for n in want if n.startswith("layers.14.engram.embed.")]
    shards = {
        "model-00001-of-00048.safetensors": ["embed.weight"],
        "model-00047-of-00048.safetensors": [n for n in want if n != "embed.weight" and n not in t14],
        "model-00048-of-00048.safetensors": t14,
    }
    weight_map = {}
    for fname, names in shards.items():
        create_sparse_safetensors(folder / fname, {n: want[n] for n in names})
        weight_map.update(dict.fromkeys(names, fname))
    weight_map["layers.0.attn.wq.weight"] = "model-00002-of-00048.safetensors"  # other tensors are ignored
    (folder / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    shutil.copyfile(CONFIG_DIR / "v41-flash.json", folder / "config.json")
    assert sum(p.stat().st_blocks for p in folder.iterdir()) * 512 < 2**20

    ckpt = open_checkpoint(folder)
    assert ckpt.config == v41_config and not ckpt.synthetic
    table = ckpt.layer(14).table
    assert isinstance(table, LazyTable) and table.num_rows == 384_016_682
    assert table(torch.tensor([0, 384_016_681])).abs().sum() == 0
    assert ckpt.layer(1).wkv_weight.shape == (25600, 6144) and ckpt.layer(1).wkv_scale.shape == (800, 192)
    assert ckpt.embed.rows(torch.tensor([129_279])).shape == (1, 5120)

    report = inspect_checkpoint(folder)
    assert report["valid"] is True and report["n_tensors"] == len(want) + 1
    sizes = {t["name"]: t["bytes"] for t in report["tensors"]}
    assert sizes["layers.14.engram.embed.weight"] == 98_308_270_592
    assert sizes["layers.1.engram.wkv.weight"] == 157_286_400
    with pytest.raises(CheckpointError, match=r"has shape \[384006168, 256\], expected \[50148, 32\]"):
        open_checkpoint(folder, config="tiny")
