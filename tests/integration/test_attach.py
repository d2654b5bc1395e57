"""attach: the suite's hook names on a reference-structured model the suite did not build."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from reference_model import ReferenceLayout, build, example_batch, example_images, full_weights
from torch import nn

from engram_viz.config import EngramConfig, load_config
from engram_viz.core.engram import Engram
from engram_viz.core.layout import EngramLayout
from engram_viz.run.attach import AttachError, attach, find_engram_modules
from engram_viz.run.capture import HookRegistry, force_gate
from engram_viz.run.trace import Trace

HERE = Path(__file__).resolve().parents[1]  # tests/, where reference_model.py lives


class _Rows:
    def __init__(self, weight, scale):
        self.weight, self.scale, self.num_rows, self.head_dim = weight, scale, len(weight), weight.shape[1]

    def __call__(self, ids):
        from engram_viz.core.fp8 import dequantize_rows

        return dequantize_rows(self.weight[ids], self.scale[ids])


@pytest.fixture(scope="module")
def model():
    return build("tiny", seed=0)


@pytest.fixture(scope="module")
def batch():
    return example_batch("tiny")


@pytest.fixture(scope="module")
def attached_trace(model, batch):
    ids, types = batch
    streams: dict[int, torch.Tensor] = {}
    handles = [
        m.register_forward_pre_hook(lambda mod, args, _n=n: streams.__setitem__(_n, args[0].clone()))
        for n, (_, m) in find_engram_modules(model).items()
    ]
    try:
        with attach(model, "tiny", model_label="ref") as att:
            trace = att.run(ids, types, names=["engram.*.dot", "engram.*.value", "engram.*.out"])
    finally:
        for h in handles:
            h.remove()
    return trace, streams


def test_streams_site_is_what_the_model_hands_each_engram_layer(model, batch, attached_trace):
    """``engram.L{n}.streams`` on an attached model: the input its own forward passes each Engram layer."""
    _, streams = attached_trace
    ids, types = batch
    with attach(model, "tiny") as att:
        trace = att.run(ids, types, names="engram.*.streams")
    got = trace.captured("streams")
    assert sorted(got) == sorted(streams) == [1, 3]
    for n, x in streams.items():
        assert got[n].dtype == x.dtype and torch.equal(got[n], x)


def test_finds_reference_submodules_and_leaves_the_model_untouched(model, batch):
    found = find_engram_modules(model)
    assert {n: p for n, (p, _) in found.items()} == {1: "layers.1.engram", 3: "layers.3.engram"}
    ids, types = batch
    before = model(ids, token_types=types)
    keys = list(model.state_dict())
    n_modules = len(list(model.modules()))
    with attach(model, "tiny") as att:
        assert "forward" in found[1][1].__dict__
        assert list(model.state_dict()) == keys and len(list(model.modules())) == n_modules
        assert torch.equal(model(ids, token_types=types), before)  # no hook: the original forward runs
        out, cache = att.run_with_cache(ids, token_types=types, names=["engram.*.gate", "engram.L3.key"])
        assert torch.equal(out, before)  # hooked: the instrumented forward is the same arithmetic
        assert sorted(cache) == ["engram.L1.gate", "engram.L3.gate", "engram.L3.key"]
    assert all("forward" not in m.__dict__ for _, m in found.values())
    assert torch.equal(model(ids, token_types=types), before)


def test_trace_equals_the_suite_engram_on_the_same_streams(model, batch, attached_trace, tiny_config):
    """The attached run's Trace holds what the suite's own Engram computes from the same weights and streams."""
    trace, streams = attached_trace
    ids, types = batch
    weights = full_weights(tiny_config, seed=0)
    mask = types < 0
    assert trace.layer_ids == (1, 3) and trace.model_label == "ref"
    assert torch.equal(trace.input_ids, ids) and torch.equal(trace.token_types, types)
    hashes = model.engram_hash(ids, 0, mask)
    for li, n in enumerate((1, 3)):
        p = f"layers.{n}.engram."
        w = SimpleNamespace(
            layer_id=n,
            table=_Rows(weights[p + "embed.weight"], weights[p + "embed.scale"]),
            wkv_weight=weights[p + "wkv.weight"],
            wkv_scale=weights[p + "wkv.scale"],
            q_weight=weights[p + "q_weight"],
            k_weight=weights[p + "k_weight"],
        )
        suite = Engram.from_weights(tiny_config, w, mode="fp8", device="cpu")
        with suite.hook_points()[f"engram.L{n}.gate"].add_hook(lambda t, name: None):
            pass  # hook points of the suite module exist under the same names
        out, cache = HookRegistry(suite.hook_points()).run_with_cache(
            lambda suite=suite, n=n, li=li: suite(streams[n], hashes[:, :, li], mask), names=f"engram.L{n}.gate"
        )
        assert torch.equal(trace.tensors[f"engram.L{n}.hash_ids"], hashes[:, :, li])
        torch.testing.assert_close(trace.tensors[f"engram.L{n}.gate"], cache[f"engram.L{n}.gate"], rtol=0, atol=1e-6)
        torch.testing.assert_close(trace.tensors[f"engram.L{n}.out"].float(), out.float(), rtol=0, atol=2e-2)
        assert trace.tensors[f"engram.L{n}.out"].dtype == torch.bfloat16  # x.dtype of the reference streams


def test_image_positions_gate_zero_and_blocked_hashes(attached_trace, batch, tiny_config):
    trace, _ = attached_trace
    _, types = batch
    img = types[1] >= 0
    gates, rows = trace.gates[1], trace.row_ids[1]
    assert (gates[img] == 0).all() and (gates[~img][: int(trace.lengths[1])] > 0).any()
    # every image position hashes an all-pad window: identical rows, equal to those of a pad-only n-gram
    pad = int(trace.meta["pad_compressed"])
    from engram_viz.core.layout import EngramLayout

    layout = EngramLayout(tiny_config)
    for li, n in enumerate((1, 3)):
        want = [layout.ngram_rows(n, (pad,) * order) for order in (2, 3, 4)]
        want = torch.as_tensor([r for block in want for r in block])
        assert all(torch.equal(rows[t, li], want) for t in torch.nonzero(img).flatten())
    assert (trace.compressed_ids[1][img] == -1).all()
    frame = trace.to_frame("gates")
    assert (frame.loc[frame.is_image, "gate"] == 0).all()


def test_edit_hooks_apply_and_leave_nothing_behind(model, batch):
    ids, types = batch
    with attach(model, "tiny") as att:
        plain = model(ids, token_types=types)
        edited = att.run(ids, types, hooks={"engram.L3.gate": force_gate(0.0)})
        assert (edited.tensors["engram.L3.gate"] == 0).all()
        shut, _ = att.run_with_cache(ids, token_types=types, names=[], hooks={"engram.*.gate": force_gate(0.0)})
        assert not torch.equal(shut, plain)
        assert att.registry.active() == {}


def test_suite_modules_keep_their_own_hook_points(tiny_config):
    from capture_kit import make_engram

    class Host(nn.Module):
        def __init__(self):
            super().__init__()
            self.engrams = nn.ModuleDict({str(n): make_engram(tiny_config, n) for n in tiny_config.engram_layer_ids})

    host = Host()
    with attach(host, tiny_config) as att:
        assert att.registry.points["engram.L1.gate"] is host.engrams["1"].hook_gate
        assert "forward" not in host.engrams["1"].__dict__


def test_no_engram_is_a_clear_error():
    with pytest.raises(AttachError, match="no Engram-like submodule"):
        attach(nn.Sequential(nn.Linear(2, 2)))


def test_torchrun_world_size_2_captures_on_rank_0(tmp_path, model, batch, attached_trace):
    """Two ranks, the table row-sharded with an all-reduce: rank 0's Trace equals the one-process Trace."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
    proc = subprocess.run(
        [*cmd, str(HERE / "reference_model.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids, types = batch
    single, _ = attached_trace
    r0, r1 = torch.load(tmp_path / "rank0.pt"), torch.load(tmp_path / "rank1.pt")
    assert r0["world_size"] == 2 and r0["captured"] == 2 and r1["captured"] == 0
    assert torch.equal(r0["plain"], r1["plain"]) and torch.equal(r0["plain"], model(ids, token_types=types))
    assert not (tmp_path / "rank1").exists()
    dist_trace = Trace.load(tmp_path / "trace")
    for name in ("engram.L1.gate", "engram.L3.gate", "engram.L1.hash_ids", "engram.L3.dot", "engram.L3.value"):
        assert torch.equal(dist_trace.tensors[name], single.tensors[name]), name
    edited = Trace.load(tmp_path / "edited")
    assert (edited.tensors["engram.L3.gate"] == 0).all()


# -- image prompts: images reach the model, and the label says when they did not ---------------------


def _layer1_input(model, ids, types, images):
    """The streams the model itself hands Engram layer 1 (a forward pre-hook)."""
    seen = {}
    handle = find_engram_modules(model)[1][1].register_forward_pre_hook(lambda m, a: seen.update(x=a[0]))
    try:
        model(ids, images=images, token_types=types)
    finally:
        handle.remove()
    return seen["x"]


def test_run_passes_images_to_the_model(model, batch):
    ids, types = batch
    images = example_images("tiny")
    with attach(model, "tiny") as att:
        with_images = att.run(ids, types, images=images, names=["engram.L1.out"])
        without = att.run(ids, types, names=["engram.L1.out"])
        _, cache = att.run_with_cache(ids, images=images, token_types=types, names=["engram.L1.gate"])
    assert torch.equal(with_images.tensors["engram.L1.gate"], cache["engram.L1.gate"])
    # image positions have a shut gate, so out == the streams read there: the merged image features
    img = types >= 0
    x = _layer1_input(model, ids, types, images)
    assert torch.equal(with_images.tensors["engram.L1.out"][img], x[img])
    assert not torch.equal(without.tensors["engram.L1.out"][img], x[img])
    after = torch.zeros_like(types, dtype=torch.bool)
    after[1, int(torch.nonzero(types[1] >= 0).max()) + 1 : int(with_images.lengths[1])] = True
    g_img, g_none = with_images.tensors["engram.L3.gate"], without.tensors["engram.L3.gate"]
    assert not torch.equal(g_img[after], g_none[after])  # text after the image reads other streams
    assert torch.equal(g_img[0], g_none[0])  # the text-only prompt is untouched
    assert "no image features" not in with_images.streams_label


def test_label_says_plainly_when_image_spans_had_no_features(model, batch):
    ids, types = batch
    with attach(model, "tiny") as att:
        without = att.run(ids, types, prompt_ids=["text", "pic"])
        text_only = att.run(ids[:1], types[:1])
    label = without.streams_label
    assert "no image features were merged" in label and "'pic'" in label and "'text'" not in label
    assert "no image features" not in text_only.streams_label


def test_images_to_a_model_that_takes_none_is_a_clear_error(batch, tiny_config):
    class NoImages(nn.Module):
        def __init__(self):
            super().__init__()
            from capture_kit import make_engram

            self.engram = make_engram(tiny_config, 1)

        def forward(self, input_ids, token_types=None):
            return input_ids

    ids, types = batch
    with attach(NoImages(), tiny_config) as att, pytest.raises(AttachError, match="takes no images"):
        att.run(ids, types, images=example_images("tiny"))


# -- layout: read from the model, checked against the hooked modules ---------------------------------


def _other_layout_config() -> EngramConfig:
    """tiny with 4 heads and n-grams up to 3: another Engram layout than any preset."""
    base = {**load_config("tiny").to_dict(), "engram_n_heads": 4, "engram_max_ngram_size": 3}
    base.pop("name")
    rows = EngramLayout(EngramConfig(name="other", **base)).rows_per_layer
    return EngramConfig(name="other", **{**base, "engram_num_embeddings": tuple(int(r) for r in rows)})


def test_layout_is_read_from_the_model():
    cfg = _other_layout_config()
    model = build(cfg, seed=1)
    ids, types = example_batch(cfg)
    with attach(model) as att:
        assert att.config.engram_n_heads == 4 and att.config.engram_max_ngram_size == 3
        assert att.config.engram_num_embeddings == cfg.engram_num_embeddings
        trace = att.run(ids, types)
    rows = trace.to_frame("rows")
    assert sorted(rows["order"].unique()) == [2, 3] and sorted(rows["head"].unique()) == [0, 1, 2, 3]
    assert trace.meta["n_heads"] == 4


def test_layout_of_a_preset_model_reads_as_the_preset(model):
    with attach(model) as att:
        assert att.config.name == "tiny"


def test_layout_disagreeing_with_modules_or_config_is_an_error(tiny_config):
    model = build("tiny", seed=0)
    with pytest.raises(AttachError, match="config 'v41-flash'.*engram_layout"):
        attach(model, "v41-flash")
    cfg = _other_layout_config()
    model.engram_layout = ReferenceLayout.from_config(cfg)  # layout of another model
    with pytest.raises(AttachError, match="layers.1.engram.*num_embeddings"):
        attach(model)
    model.engram_layout = ReferenceLayout(4, (1, 2), tiny_config.engram_num_embeddings, ((), ()), 8, 32)
    with pytest.raises(AttachError, match=r"layer_ids \(1, 2\).*hooked Engram modules .*\[1, 3\]"):
        attach(model)
    assert all("forward" not in m.__dict__ for _, m in find_engram_modules(model).values())


def test_no_layout_and_no_config_is_a_clear_error():
    foreign = nn.Module()
    foreign.engram = build("tiny").layers[1].engram
    with pytest.raises(AttachError, match="no engram_layout.*pass config="):
        attach(foreign)


# -- detach in any order -----------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["first-first", "last-first"])
def test_two_attachments_detach_in_any_order(model, batch, order):
    ids, types = batch
    engrams = [m for _, m in find_engram_modules(model).values()]
    before = model(ids, token_types=types)
    a, b = attach(model, "tiny"), attach(model, "tiny")
    ta, tb = a.run(ids, types), b.run(ids, types)
    assert torch.equal(ta.gates, tb.gates)
    first, second = (a, b) if order == "first-first" else (b, a)
    first.detach()
    still = second.run(ids, types)  # the other attachment keeps working
    assert torch.equal(still.gates, ta.gates)
    with pytest.raises(AttachError, match="detached"):
        first.run(ids, types)
    second.detach()
    assert all("forward" not in m.__dict__ for m in engrams)
    with pytest.raises(AttachError, match="detached"):
        second.run(ids, types)
    seen: list[str] = []
    for reg in (a.registry, b.registry):  # hooks left on the old points see nothing: no wrapper runs them
        for point in reg.points.values():
            point.add_hook(lambda t, name: seen.append(name))
    assert torch.equal(model(ids, token_types=types), before) and seen == []
