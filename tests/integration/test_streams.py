"""Stream sources: embedding streams, the captured-streams file format, user tensors; labels and errors."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engram_viz.config import load_config
from engram_viz.run.streams import (
    Streams,
    captured_layers,
    embedding_streams,
    load_captured_streams,
    save_captured_streams,
    streams_from_tensor,
)


def fake_checkpoint(synthetic: bool = True):
    """A stand-in with the Checkpoint attributes embedding_streams uses (config, embed.rows, label, synthetic)."""
    config = load_config("tiny")
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(config.vocab_size, config.dim, generator=g).to(torch.bfloat16)
    embed = SimpleNamespace(rows=lambda ids: weight[ids], weight=weight)
    return SimpleNamespace(config=config, embed=embed, label="test checkpoint", synthetic=synthetic)


def test_embedding_streams_repeat_embed_rows_into_hc_streams():
    ckpt = fake_checkpoint()
    ids = torch.tensor([[0, 5, 129279], [7, 7, 2]])
    s = embedding_streams(ckpt, ids)
    assert isinstance(s, Streams) and s.source == "embedding" and s.layer is None
    assert s.x.shape == (2, 3, 4, 64) and s.x.dtype == torch.bfloat16
    for stream in range(4):
        assert torch.equal(s.x[:, :, stream], ckpt.embed.weight[ids])
    assert torch.equal(s.input_ids, ids) and s.token_mask is None
    assert "true input of layer 0" in s.label and "proxy" in s.label and "1, 3" in s.label
    assert "SYNTHETIC" in s.label and "test checkpoint" in s.label
    assert "SYNTHETIC" not in embedding_streams(fake_checkpoint(synthetic=False), ids).label


def test_embedding_streams_accept_a_flat_list_and_token_types():
    ckpt = fake_checkpoint()
    s = embedding_streams(ckpt, [1, 2, 3, 4], token_types=[-1, 0, 1, -1])
    assert s.x.shape == (1, 4, 4, 64)
    assert s.token_mask.tolist() == [[True, False, False, True]]
    assert "image positions carry the image token's embedding" in s.label


def test_embedding_streams_errors():
    ckpt = fake_checkpoint()
    with pytest.raises(ValueError, match=r"raw_ids holds token id 129280; expected raw ids in 0..129279"):
        embedding_streams(ckpt, [1, 129280])
    with pytest.raises(ValueError, match="raw_ids must be int token ids"):
        embedding_streams(ckpt, [[[1]]])
    with pytest.raises(ValueError, match=r"token_types must have shape \[1, 2\]"):
        embedding_streams(ckpt, [1, 2], token_types=[-1, -1, -1])
    with pytest.raises(ValueError, match="token_types holds 4; expected TEXT = -1 or image parts 0..3"):
        embedding_streams(ckpt, [1, 2], token_types=[-1, 4])


def test_captured_streams_round_trip(tmp_path):
    g = torch.Generator().manual_seed(1)
    x1 = torch.randn(2, 5, 4, 64, generator=g).to(torch.bfloat16)
    x3 = torch.randn(2, 5, 4, 64, generator=g)
    ids = torch.randint(0, 129280, (2, 5), generator=g)
    tt = torch.full((2, 5), -1)
    tt[1, 1:4] = torch.tensor([0, 1, 3])
    path = save_captured_streams(
        tmp_path / "run.safetensors", {1: x1, 3: x3}, ids, tt, {"model": "tiny-test", "description": "unit test"}
    )
    assert captured_layers(path) == [1, 3]
    assert [p.name for p in tmp_path.iterdir()] == ["run.safetensors"]  # no temporary left behind
    s = load_captured_streams(path, layer=1, config="tiny")
    assert s.source == "captured" and s.layer == 1
    assert torch.equal(s.x, x1) and s.x.dtype == torch.bfloat16
    assert torch.equal(s.input_ids, ids) and torch.equal(s.token_types, tt)
    assert s.token_mask[1].tolist() == [True, False, False, False, True]
    assert "entering Engram layer 1 from run.safetensors" in s.label and "model tiny-test" in s.label
    assert torch.equal(load_captured_streams(path, layer=3).x, x3)


def test_captured_streams_single_layer_needs_no_layer_and_documents_names(tmp_path):
    from safetensors.torch import save_file

    x = torch.randn(1, 3, 4, 64)
    save_file({"streams.L14": x, "input_ids": torch.tensor([[1, 2, 3]])}, tmp_path / "a.safetensors")
    s = load_captured_streams(tmp_path / "a.safetensors")
    assert s.layer == 14 and s.token_types is None and s.token_mask is None


@pytest.mark.parametrize(
    "tensors, kwargs, error, match",
    [
        ({"input_ids": torch.zeros(1, 3, dtype=torch.int64)}, {}, ValueError, "no 'streams.L<layer>' tensor found"),
        ({"streams.L1": torch.zeros(1, 3, 4, 64)}, {}, ValueError, "tensor 'input_ids' .* is missing"),
        (
            {
                "streams.L1": torch.zeros(1, 3, 4, 64),
                "streams.L3": torch.zeros(1, 3, 4, 64),
                "input_ids": torch.zeros(1, 3, dtype=torch.int64),
            },
            {},
            ValueError,
            r"holds streams for layers \[1, 3\]; pass layer=",
        ),
        (
            {"streams.L1": torch.zeros(1, 3, 4, 64), "input_ids": torch.zeros(1, 3, dtype=torch.int64)},
            {"layer": 3},
            ValueError,
            r"no 'streams.L3' tensor; the file has streams for layers \[1\]",
        ),
        (
            {"streams.L2": torch.zeros(1, 3, 4, 64), "input_ids": torch.zeros(1, 3, dtype=torch.int64)},
            {"config": "tiny"},
            ValueError,
            "layer 2 is not an Engram layer of config 'tiny'",
        ),
        (
            {"streams.L1": torch.zeros(1, 3, 4, 32), "input_ids": torch.zeros(1, 3, dtype=torch.int64)},
            {"config": "tiny"},
            ValueError,
            r"streams.L1 has shape \[1, 3, 4, 32\]; config 'tiny' expects \[B, T, 4, 64\]",
        ),
        (
            {"streams.L1": torch.zeros(3, 4, 64), "input_ids": torch.zeros(1, 3, dtype=torch.int64)},
            {},
            ValueError,
            r"must have shape \[B, T, hc, dim\] \(rank 4\)",
        ),
        (
            {
                "streams.L1": torch.zeros(1, 3, 4, 64, dtype=torch.int32),
                "input_ids": torch.zeros(1, 3, dtype=torch.int64),
            },
            {},
            TypeError,
            "must be bf16, f16 or f32 streams, got torch.int32",
        ),
        (
            {"streams.L1": torch.zeros(1, 3, 4, 64), "input_ids": torch.zeros(1, 4, dtype=torch.int64)},
            {},
            ValueError,
            r"input_ids must have shape \[1, 3\]",
        ),
        (
            {"streams.L1": torch.zeros(1, 3, 4, 64), "input_ids": torch.zeros(1, 3)},
            {},
            TypeError,
            "input_ids must be an int64 or int32 tensor",
        ),
        (
            {"streams.L1": torch.zeros(1, 3, 4, 64), "input_ids": torch.full((1, 3), 200000)},
            {"config": "tiny"},
            ValueError,
            "input_ids holds token id 200000",
        ),
        (
            {"streams.L1": torch.full((1, 3, 4, 64), float("nan")), "input_ids": torch.zeros(1, 3, dtype=torch.int64)},
            {},
            ValueError,
            "non-finite values",
        ),
        (
            {
                "streams.L1": torch.zeros(1, 3, 4, 64),
                "input_ids": torch.zeros(1, 3, dtype=torch.int64),
                "token_types": torch.tensor([[-1, 7, -1]]),
            },
            {},
            ValueError,
            "token_types holds 7",
        ),
    ],
)
def test_captured_streams_errors(tmp_path, tensors, kwargs, error, match):
    from safetensors.torch import save_file

    path = tmp_path / "bad.safetensors"
    save_file(tensors, path)
    with pytest.raises(error, match=match):
        load_captured_streams(path, **kwargs)


def test_captured_streams_unreadable_files(tmp_path):
    with pytest.raises(FileNotFoundError, match="captured-streams file .*missing.safetensors does not exist"):
        load_captured_streams(tmp_path / "missing.safetensors")
    bad = tmp_path / "corrupt.safetensors"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}xxxxxx")
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        load_captured_streams(bad)
    with pytest.raises(ValueError, match="is not a readable safetensors file"):
        captured_layers(bad)


def test_save_captured_streams_validates_and_leaves_nothing_half_written(tmp_path):
    x = torch.zeros(1, 3, 4, 64)
    with pytest.raises(ValueError, match="streams is empty"):
        save_captured_streams(tmp_path / "a.safetensors", {}, torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"streams\[3\] has \[B, T\] = \[1, 2\]"):
        save_captured_streams(tmp_path / "a.safetensors", {1: x, 3: x[:, :2]}, torch.zeros(1, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"input_ids must have shape \[1, 3\]"):
        save_captured_streams(tmp_path / "a.safetensors", {1: x}, torch.zeros(1, 2, dtype=torch.int64))
    assert list(tmp_path.iterdir()) == []


def test_streams_from_tensor():
    x = torch.randn(2, 3, 4, 64)
    s = streams_from_tensor(x, "tiny", label="random normal", layer=3, input_ids=torch.ones(2, 3, dtype=torch.int64))
    assert s.source == "tensor" and s.x is x and s.layer == 3 and s.label == "user tensor: random normal"
    with pytest.raises(ValueError, match=r"x has shape \[2, 3, 4, 32\]; config 'tiny' expects \[B, T, 4, 64\]"):
        streams_from_tensor(x[..., :32], "tiny")
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        streams_from_tensor(x.numpy())
    with pytest.raises(ValueError, match="x holds non-finite values"):
        streams_from_tensor(x / 0)
    with pytest.raises(ValueError, match="layer 2 is not an Engram layer"):
        streams_from_tensor(x, "tiny", layer=2)
    with pytest.raises(ValueError, match=r"input_ids must have shape \[2, 3\]"):
        streams_from_tensor(x, input_ids=torch.ones(3, dtype=torch.int64))
    assert streams_from_tensor(x.to(torch.bfloat16)).x.dtype == torch.bfloat16  # no config: shape free, dtype kept


def test_embedding_streams_of_the_synthetic_checkpoint_say_synthetic():
    from engram_viz.weights.synthetic import synthetic_checkpoint

    ckpt = synthetic_checkpoint("tiny")
    ids = torch.tensor([[0, 1, 2, 100]])
    s = embedding_streams(ckpt, ids)
    assert torch.equal(s.x[:, :, 2], ckpt.embed.rows(ids))
    assert "SYNTHETIC" in s.label and ckpt.label in s.label
