"""The tiny Engram LM: committed weights (names, dtypes, shapes), loading, forward, gate forcing,
export round trip, and its use as the suite's default checkpoint."""

from __future__ import annotations

import json

import pytest
import torch

from engram_viz.cli import build_parser
from engram_viz.core.schema import expected_tensors
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import CheckpointError
from engram_viz.tiny.files import load_tiny_model, save_tiny_model
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig, engram_config, gates_forced
from engram_viz.tiny.train import TrainSettings
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.resolve import default_checkpoint
from engram_viz.weights.safetensors import read_safetensors_header
from engram_viz.weights.scan import INDEX_FILE
from engram_viz.weights.tiny_folder import DEFAULT_DIR, ENGRAM_SHARD, LM_SHARD

TORCH_DTYPE = {"F8_E4M3": torch.float8_e4m3fn, "F8_E8M0": torch.float8_e8m0fnu, "BF16": torch.bfloat16}
PROMPT = "In the beginning God created the heaven and the earth. 起初，神创造天地。"


@pytest.fixture(scope="module")
def model() -> TinyEngramLM:
    return load_tiny_model()


@pytest.fixture(scope="module")
def prompt_ids() -> torch.Tensor:
    return torch.tensor([get_tokenizer("tiny").encode(PROMPT, bos=True)])


def test_committed_files_are_small() -> None:
    files = [p for p in DEFAULT_DIR.iterdir() if p.is_file()]
    assert {LM_SHARD, ENGRAM_SHARD, INDEX_FILE, "config.json", "MODEL_CARD.md", "loss_curve.png"} <= {
        p.name for p in files
    }
    assert sum(p.stat().st_size for p in files) <= 25 * 2**20  # the bound on committed weights


def test_committed_engram_tensors_match_the_tiny_config() -> None:
    """Every Engram tensor under the real checkpoint's name, dtype and shape for the tiny preset
    with the recipe's table size (``engram_config(TrainSettings().engram_vocab_size)``)."""
    config = engram_config(TrainSettings().engram_vocab_size)
    header = read_safetensors_header(DEFAULT_DIR / ENGRAM_SHARD)
    want = {k: v for k, v in expected_tensors(config).items() if k != "embed.weight"}
    assert set(header.tensors) == set(want)
    for name, (dtype, shape) in want.items():
        info = header.tensors[name]
        assert (info.dtype, tuple(info.shape)) == (dtype, tuple(shape)), name
    index = json.loads((DEFAULT_DIR / INDEX_FILE).read_text())
    assert {n for n, f in index["weight_map"].items() if f == ENGRAM_SHARD} == set(want)
    # the config in the folder is the tiny preset (tables resized) plus the tiny_lm section
    raw = json.loads((DEFAULT_DIR / "config.json").read_text())
    assert {k: raw[k] for k in config.to_dict() if k != "name"} == {
        k: (list(v) if isinstance(v, tuple) else v) for k, v in config.to_dict().items() if k != "name"
    }


def test_committed_lm_tensors(model: TinyEngramLM) -> None:
    header = read_safetensors_header(DEFAULT_DIR / LM_SHARD)
    rows, dim = model.lm.vocab_rows, model.config.dim
    assert header.tensors["tiny.embed.weight"].dtype == "BF16"
    assert tuple(header.tensors["tiny.embed.weight"].shape) == (rows, dim)
    assert tuple(header.tensors["tiny.embed.raw_ids"].shape) == (rows,)
    assert all(t.dtype == "BF16" for n, t in header.tensors.items() if n != "tiny.embed.raw_ids")
    assert int(model.raw_ids[0]) == -1 and bool((model.raw_ids[1:].diff() > 0).all())


def test_open_checkpoint_and_default(model: TinyEngramLM) -> None:
    ckpt = open_checkpoint(DEFAULT_DIR)
    assert not ckpt.synthetic
    assert ckpt.label.startswith("tiny Engram LM trained on") and "data/tiny-engram" in ckpt.label
    assert default_checkpoint().label == ckpt.label
    config = model.config
    assert config.engram_num_embeddings == engram_config(TrainSettings().engram_vocab_size).engram_num_embeddings
    for layer_id, rows in zip(config.engram_layer_ids, config.engram_num_embeddings):
        w = ckpt.layer(layer_id)
        assert (w.table.num_rows, w.table.head_dim) == (rows, config.engram_head_dim)
        assert w.wkv_weight.dtype == torch.float8_e4m3fn and w.q_weight.dtype == torch.bfloat16
        assert torch.equal(w.q_weight.float(), model.engrams[str(layer_id)].q_weight)
    # the token embedding serves every raw id: known ids their row, the rest the unknown row 0
    known = model.raw_ids[1:4]
    unknown = torch.tensor([129279])
    assert int(model.remap[unknown]) == 0
    rows = ckpt.embed.rows(torch.cat([known, unknown]))
    assert torch.equal(rows.float(), model.embed.weight[torch.tensor([1, 2, 3, 0])])


def test_forward_is_finite_and_gates_are_learned(model: TinyEngramLM, prompt_ids: torch.Tensor) -> None:
    gates = []
    handles = [e.hook_gate.add_hook(lambda g, _n: gates.append(g.clone())) for e in model.engrams.values()]
    try:
        with torch.no_grad():
            logits = model(prompt_ids)
    finally:
        for h in handles:
            h.remove()
    assert logits.shape == (1, prompt_ids.shape[1], model.lm.vocab_rows)
    assert torch.isfinite(logits).all()
    assert len(gates) == 2 and all(g.shape == (1, prompt_ids.shape[1], 4) for g in gates)
    g = torch.cat([x.flatten() for x in gates])
    assert ((g > 0) & (g < 1)).all()
    assert float(g.std()) > 0.02  # trained: not every gate sits at one value


def test_gates_forced_through_hooks(model: TinyEngramLM, prompt_ids: torch.Tensor) -> None:
    seen = []
    with torch.no_grad():
        open_logits = model(prompt_ids)
        with gates_forced(model, 0.0):
            handles = [e.hook_out.add_hook(lambda t, _n: seen.append(t.clone())) for e in model.engrams.values()]
            shut_logits = model(prompt_ids)
            for h in handles:
                h.remove()
        again = model(prompt_ids)
    assert not torch.allclose(open_logits, shut_logits)
    assert torch.equal(open_logits, again)  # the forcing hooks are gone after the block
    assert all(not e.hook_gate.fns for e in model.engrams.values())
    # with every gate at 0 each Engram layer passes its streams through unchanged: all 4 equal
    for out in seen:
        assert torch.equal(out[:, :, 0], out[:, :, 3])


def test_train_steps_export_and_reload(tmp_path) -> None:
    """A few optimiser steps on a fresh model, export (fp8 Engram tensors), reload: the exported
    model's logits stay close to the float model's."""
    torch.manual_seed(0)
    tok = get_tokenizer("tiny")
    text = "And God said, Let there be light: and there was light. " * 4
    ids = torch.tensor([tok.encode(text, bos=True)])
    raw_ids = torch.cat([torch.tensor([-1]), ids.unique()])
    fresh = TinyEngramLM("tiny", tok.token_map, raw_ids, TinyLMConfig(vocab_rows=len(raw_ids)))
    opt = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    losses = []
    for _ in range(4):
        loss = fresh.loss(ids)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < losses[0]
    save_tiny_model(fresh, tmp_path, {"label": "test model"})
    back = load_tiny_model(tmp_path)
    with torch.no_grad():
        a, b = fresh(ids[:, :-1]), back(ids[:, :-1])
    assert torch.isfinite(b).all()
    assert float((a.softmax(-1) - b.softmax(-1)).abs().max()) < 0.05
    ckpt = open_checkpoint(tmp_path)
    assert ckpt.label == "test model"


def test_no_engram_variant_exports_without_engram_tensors(tmp_path) -> None:
    tok = get_tokenizer("tiny")
    raw_ids = torch.tensor([-1, 5, 9, 100])
    m = TinyEngramLM("tiny", tok.token_map, raw_ids, TinyLMConfig(vocab_rows=4, use_engram=False))
    save_tiny_model(m, tmp_path)
    assert not (tmp_path / ENGRAM_SHARD).exists()
    back = load_tiny_model(tmp_path)
    assert len(back.engrams) == 0
    assert back(torch.tensor([[5, 9, 7]])).shape == (1, 3, 4)


def test_cli_train_tiny_arguments() -> None:
    args = build_parser().parse_args(["train-tiny", "--out", "x", "--seed", "3", "--no-engram", "--steps", "5"])
    assert (args.out, args.seed, args.no_engram, args.steps) == ("x", 3, True, 5)


def test_bad_folder_is_a_clear_error(tmp_path) -> None:
    with pytest.raises(CheckpointError, match=r"config file .*config\.json does not exist"):
        load_tiny_model(tmp_path)
    with pytest.raises(CheckpointError, match="does not exist or is not a folder"):
        load_tiny_model(tmp_path / "nowhere")


def test_engram_config_resizes_only_the_tables() -> None:
    base = engram_config(2000)
    assert base.name == "tiny" and base.engram_num_embeddings == (50148, 54840)
    big = engram_config(TrainSettings().engram_vocab_size)
    assert big.name == f"tiny-v{TrainSettings().engram_vocab_size}"
    assert all(b > 4 * a for a, b in zip(base.engram_num_embeddings, big.engram_num_embeddings))
    same = {k: v for k, v in big.to_dict().items() if k not in ("name", "engram_vocab_size", "engram_num_embeddings")}
    assert same == {k: v for k, v in base.to_dict().items() if k in same}
