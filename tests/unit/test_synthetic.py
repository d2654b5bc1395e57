"""engram_viz.weights.synthetic and default: synthetic gates, interrupted and refused writes, the cached
synthetic checkpoint, the default checkpoint and the procedural v41-flash checkpoint."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from weights_kit import (
    SHARD,
    TORCH_TO_SAFETENSORS,
    all_tensors,
    same,
)

from engram_viz.core import fp8
from engram_viz.core.schema import engram_names, expected_tensors
from engram_viz.errors import RowIdError
from engram_viz.tiny.model import engram_config
from engram_viz.tiny.train import TrainSettings
from engram_viz.weights import synthetic as S
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.procedural import ProceduralTable
from engram_viz.weights.resolve import default_checkpoint
from engram_viz.weights.synthetic import synthetic_checkpoint, write_synthetic_checkpoint


def test_synthetic_gates_are_not_trivial(hf_dir, tiny_config):
    """The drawn weights put the seed's gate (float64, reference section 5) well away from 0.5."""
    ckpt = open_checkpoint(hf_dir)
    g = torch.Generator().manual_seed(0)
    hc, dim = tiny_config.hc_mult, tiny_config.dim
    for w in ckpt.layers.values():
        ids = torch.randint(0, w.table.num_rows, (256, 24), generator=g)
        rows = w.table(ids).double().flatten(-2)
        kv = rows @ fp8.dequantize_blocks(w.wkv_weight, w.wkv_scale).double().T
        key = kv[:, : hc * dim].unflatten(-1, (hc, dim))
        h = ckpt.embed.rows(torch.randint(0, 129_280, (256,), generator=g)).double()[:, None, :].expand(-1, hc, -1)
        rstd = torch.rsqrt(h.square().mean(-1) + 1e-20) * torch.rsqrt(key.square().mean(-1) + 1e-20)
        dot = (h * (w.q_weight.double() * w.k_weight.double()) * key).sum(-1) * rstd / math.sqrt(dim)
        gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
        assert gate.std() > 0.1 and gate.min() < 0.3 and gate.max() > 0.7


class Boom(RuntimeError):
    pass


@pytest.mark.parametrize("exc", [Boom, KeyboardInterrupt])
def test_interrupted_write_leaves_nothing(tmp_path, monkeypatch, exc):
    calls = []
    real_save = S._save

    def failing_save(tensors, path, metadata):
        calls.append(path)
        if len(calls) == 2:
            raise exc("interrupted")
        real_save(tensors, path, metadata)

    monkeypatch.setattr(S, "_save", failing_save)
    parent = tmp_path / "out"
    parent.mkdir()
    with pytest.raises(exc):
        write_synthetic_checkpoint(parent / "ckpt", "tiny")
    assert len(calls) == 2 and list(parent.iterdir()) == []


def test_writer_refuses_existing_folder_and_huge_configs(tmp_path):
    existing = tmp_path / "taken"
    existing.mkdir()
    (existing / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="already exists"):
        write_synthetic_checkpoint(existing, "tiny")
    assert [p.name for p in existing.iterdir()] == ["keep.txt"]
    with pytest.raises(ValueError, match=r"use synthetic_checkpoint\('v41-flash'\)"):
        write_synthetic_checkpoint(tmp_path / "big", "v41-flash")
    with pytest.raises(ValueError, match="world_size 3 must divide vocab_size"):
        write_synthetic_checkpoint(tmp_path / "odd", "tiny", world_size=3)
    with pytest.raises(ValueError, match="layout must be"):
        write_synthetic_checkpoint(tmp_path / "x", "tiny", layout="zip")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_synthetic_tiny_is_cached_and_rebuilt_when_damaged(tmp_path, monkeypatch, tiny_tensors):
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    monkeypatch.setattr(S, "_SYNTHETIC_CACHE", {})
    ckpt = synthetic_checkpoint("tiny")
    assert ckpt.synthetic and ckpt.label.startswith("SYNTHETIC") and ckpt.path.parent == tmp_path / "synthetic"
    assert synthetic_checkpoint("tiny") is ckpt
    assert same(all_tensors(ckpt)["layers.3.engram.wkv.weight"], tiny_tensors["layers.3.engram.wkv.weight"])
    stamp = (ckpt.path / SHARD.format(1)).stat().st_mtime_ns
    monkeypatch.setattr(S, "_SYNTHETIC_CACHE", {})
    again = synthetic_checkpoint("tiny")  # a new process: the folder is reused, not rewritten
    assert again.path == ckpt.path and (ckpt.path / SHARD.format(1)).stat().st_mtime_ns == stamp
    (ckpt.path / SHARD.format(3)).unlink()
    monkeypatch.setattr(S, "_SYNTHETIC_CACHE", {})
    rebuilt = synthetic_checkpoint("tiny")
    assert (rebuilt.path / SHARD.format(3)).is_file()
    assert same(all_tensors(rebuilt)["layers.3.engram.embed.weight"], tiny_tensors["layers.3.engram.embed.weight"])
    assert not [p for p in (tmp_path / "synthetic").iterdir() if p.name.startswith(".")]  # no temp leftovers


def test_default_checkpoint_says_what_it_is(tiny_config):
    """The embedded default is the tiny config with the tiny LM recipe's tables (a synthetic
    fallback: the tiny config itself), and its label says SYNTHETIC exactly when it is."""
    ckpt = default_checkpoint()
    want = tiny_config if ckpt.synthetic else engram_config(TrainSettings().engram_vocab_size)
    assert dataclasses.replace(ckpt.config, name=want.name) == want and default_checkpoint().path == ckpt.path
    assert ("SYNTHETIC" in ckpt.label) == ckpt.synthetic
    assert ckpt.layers and ckpt.embed.rows(torch.tensor([[1, 2]])).shape == (1, 2, tiny_config.dim)


def test_procedural_v41_flash_checkpoint(v41_config):
    ckpt = synthetic_checkpoint("v41-flash")
    assert ckpt.synthetic and ckpt.path is None and ckpt.layout == "procedural"
    assert ckpt.label.startswith("SYNTHETIC procedural v41-flash")
    want = expected_tensors(v41_config)
    for layer_id, rows in zip(v41_config.engram_layer_ids, v41_config.engram_num_embeddings):
        w = ckpt.layer(layer_id)
        names = engram_names(layer_id)
        assert isinstance(w.table, ProceduralTable) and w.table.synthetic and "SYNTHETIC" in w.table.label
        assert (w.table.num_rows, w.table.head_dim) == (rows, 256)
        for key in ("wkv_weight", "wkv_scale", "q_weight", "k_weight"):
            t = getattr(w, key)
            assert (TORCH_TO_SAFETENSORS[t.dtype], tuple(t.shape)) == want[names[key]], key
        gw, gs = w.table.gather_fp8(torch.tensor([[0, rows - 1]]))
        assert gw.shape == (1, 2, 256) and gs.shape == (1, 2, 8)
        with pytest.raises(RowIdError, match=f"row id {rows} out of range"):
            w.table(torch.tensor([rows]))
    assert not torch.equal(ckpt.layer(1).table(torch.arange(4)), ckpt.layer(14).table(torch.arange(4)))
    assert ckpt.embed.synthetic and ckpt.embed.rows(torch.tensor([[0, 129_279]])).shape == (1, 2, 5120)
    assert synthetic_checkpoint("v41-flash") is ckpt
