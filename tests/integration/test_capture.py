"""capture: named hook points, run_with_cache, editing hooks, cleanup and flat memory."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from capture_kit import make_engram, random_inputs

from engram_viz.core.hashing import NgramHasher
from engram_viz.core.hooks import HOOK_SITES, hook_name, hook_table_markdown, parse_hook_name
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.capture import DEFAULT_NAMES, ActivationCache, HookRegistry, force_gate, zero_ablate


@pytest.fixture(scope="module")
def setup(tiny_config):
    engrams = {n: make_engram(tiny_config, n, seed=3) for n in tiny_config.engram_layer_ids}
    registry = HookRegistry()
    for e in engrams.values():
        registry.update(HookRegistry.from_module(e))
    return tiny_config, engrams, registry


def _formula_gate(dot: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    gate = torch.sigmoid(torch.copysign(dot.abs().clamp_min(1e-6).sqrt(), dot))
    return gate.masked_fill(~mask.unsqueeze(-1), 0)


def test_names_and_table(setup):
    config, _, registry = setup
    assert registry.names == [hook_name(n, k) for n in config.engram_layer_ids for k in HOOK_SITES]
    assert parse_hook_name("engram.L14.gate") == (14, "gate")
    for bad in ("engram.L1.gates", "L1.gate", "engram.Lx.gate"):
        with pytest.raises(ValueError, match="not a hook name"):
            parse_hook_name(bad)
    table = hook_table_markdown()
    assert all(f"engram.L{{n}}.{k}" in table for k in HOOK_SITES)
    assert registry.resolve("engram.*.gate") == ["engram.L1.gate", "engram.L3.gate"]
    assert registry.resolve(["engram.L3.*"]) == [hook_name(3, k) for k in HOOK_SITES]
    with pytest.raises(ValueError, match="matches no hook point"):
        registry.resolve(["engram.L2.gate"])


def test_gates_equal_module_output_and_capture_does_not_perturb(setup):
    config, engrams, registry = setup
    e = engrams[1]
    x, ids, mask = random_inputs(config, e)
    plain = e(x, ids, mask)
    out, cache = registry.run_with_cache(lambda: e(x, ids, mask), names=["engram.L1.*"])
    assert torch.equal(out, plain)
    assert torch.equal(cache["engram.L1.out"], plain)
    assert torch.equal(cache["engram.L1.hash_ids"], ids)
    assert torch.equal(cache["engram.L1.token_mask"], mask)
    gate, value, dot = cache["engram.L1.gate"], cache["engram.L1.value"], cache["engram.L1.dot"]
    assert gate.shape == (2, 7, config.hc_mult) and gate.dtype == torch.float32
    assert cache["engram.L1.rows"].shape == (2, 7, 24, config.engram_head_dim)
    assert cache["engram.L1.key"].shape == (2, 7, config.hc_mult, config.dim)
    assert torch.equal(gate, _formula_gate(dot, mask))
    # the module's output is h + gate * value with exactly these gates
    assert torch.equal(plain, (x.float() + gate.unsqueeze(-1) * value.unsqueeze(-2)).to(x.dtype))
    assert (gate[:, 2:4] == 0).all() and (gate[:, 4:] > 0).all()


def test_hooks_not_asked_for_capture_nothing(setup):
    config, engrams, registry = setup
    e = engrams[3]
    x, ids, mask = random_inputs(config, e)
    seen = {}

    def spy(t, name):
        seen[name] = dict(registry.active())

    with registry.hooks({"engram.L3.out": spy}):
        _, cache = registry.run_with_cache(lambda: e(x, ids, mask), names="engram.L3.gate")
    assert list(cache) == ["engram.L3.gate"] and len(cache) == 1
    # during the run exactly two hooks were attached: the spy and the one storing the gate
    assert seen["engram.L3.out"] == {"engram.L3.gate": 1, "engram.L3.out": 1}
    assert registry.active() == {}
    with pytest.raises(KeyError, match="not captured"):
        cache["engram.L3.dot"]
    # a requested hook of a layer that did not run is reported, not silently empty
    _, cache = registry.run_with_cache(lambda: e(x, ids, mask), names=["engram.L1.gate"])
    assert len(cache) == 0
    with pytest.raises(KeyError, match="never ran"):
        cache["engram.L1.gate"]


def test_force_gate_changes_output_exactly_as_formula(setup):
    config, engrams, registry = setup
    e = engrams[1]
    x, ids, mask = random_inputs(config, e, seed=5)
    plain, cache = registry.run_with_cache(lambda: e(x, ids, mask), names=["engram.L1.value", "engram.L1.gate"])
    value, gate = cache["engram.L1.value"], cache["engram.L1.gate"]
    h = x.float()

    # gate 0 everywhere: Engram adds nothing, the streams pass through unchanged
    shut = registry.run_with_cache(lambda: e(x, ids, mask), names=[], hooks={"engram.L1.gate": force_gate(0.0)})[0]
    assert torch.equal(shut, x)

    # gate 0.75 on stream 2 only, at the first two positions only
    positions = torch.zeros(x.shape[:2], dtype=torch.bool)
    positions[:, :2] = True
    out, c2 = registry.run_with_cache(
        lambda: e(x, ids, mask), names=["engram.L1.gate"], hooks={"engram.*.gate": force_gate(0.75, [2], positions)}
    )
    want_gate = gate.clone()
    want_gate[:, :2, 2] = 0.75
    assert torch.equal(c2["engram.L1.gate"], want_gate)  # the cache sees the edited gate
    assert torch.equal(out, (h + want_gate.unsqueeze(-1) * value.unsqueeze(-2)).to(x.dtype))
    changed = torch.zeros_like(out, dtype=torch.bool)
    changed[:, :2, 2] = True
    assert torch.equal(out[~changed], plain[~changed])

    # zero-ablating the value has the same effect as shutting the gate
    ablated = registry.run_with_cache(lambda: e(x, ids, mask), names=[], hooks={"engram.L1.value": zero_ablate})[0]
    assert torch.equal(ablated, x)
    assert registry.active() == {}


def test_cleanup_on_error_and_bad_hooks(setup):
    config, engrams, registry = setup
    e = engrams[1]
    x, ids, mask = random_inputs(config, e)

    def boom():
        raise RuntimeError("forward failed")

    with pytest.raises(RuntimeError, match="forward failed"):
        registry.run_with_cache(boom, names=["engram.*"], hooks={"engram.L1.gate": force_gate(1.0)})
    assert registry.active() == {}
    with pytest.raises(TypeError, match="callable"), registry.hooks({"engram.L1.gate": 3}):
        pass
    assert registry.active() == {}

    def wrong_shape(t, name):
        return t[..., :1]

    with pytest.raises(ValueError, match="same as its input"):
        registry.run_with_cache(lambda: e(x, ids, mask), hooks={"engram.L1.dot": wrong_shape})
    assert registry.active() == {}


def test_device_option_and_copies(setup):
    config, engrams, registry = setup
    e = engrams[1]
    x, ids, mask = random_inputs(config, e)
    with registry.capture(["engram.L1.hash_ids"], device=None) as cache:
        e(x, ids, mask)
    got = cache["engram.L1.hash_ids"]
    assert torch.equal(got, ids) and got.data_ptr() != ids.data_ptr()  # a copy, never the caller's tensor
    assert cache.captured and cache.nbytes == ids.nbytes
    assert "engram.L1.hash_ids" in repr(cache)
    assert set(cache.layer("hash_ids")) == {1}
    moved = cache.to("cpu")
    assert isinstance(moved, ActivationCache) and torch.equal(moved["engram.L1.hash_ids"], ids)


def test_memory_stays_flat_over_a_prompt_loop(setup):
    """No reference to captured tensors survives the cache: a loop keeps nothing alive."""
    config, engrams, registry = setup
    e = engrams[3]
    refs = []
    for i in range(30):
        x, ids, mask = random_inputs(config, e, batch=2, seq=32, seed=i)
        _, cache = registry.run_with_cache(
            lambda x=x, ids=ids, mask=mask: e(x, ids, mask), names=["engram.L3.rows", "engram.L3.key"]
        )
        refs.append(weakref.ref(cache.chunks("engram.L3.key")[0]))
        del cache
    gc.collect()
    assert all(r() is None for r in refs)
    assert registry.active() == {}
    assert all(not p.fns for p in registry.points.values())


def test_capture_during_generation_joins_chunks(setup, tokenizer):
    """Prefill + token-by-token decode inside one capture reads like one full prefill."""
    config, engrams, registry = setup
    tok = get_tokenizer(config)
    ids = torch.tensor([tok.encode("Alexander the Great conquered Persia in 331 BC.")])
    T = ids.shape[1]
    x = torch.randn(1, T, config.hc_mult, config.dim, generator=torch.Generator().manual_seed(0))
    li = config.engram_layer_ids.index(1)

    def run(chunks):
        hasher = NgramHasher(config, tok.token_map, max_batch=1, max_seq_len=T)
        for s, t in chunks:
            engrams[1](x[:, s:t], hasher(ids[:, s:t], s)[:, :, li])

    names = ["engram.L1.hash_ids", "engram.L1.gate"]
    with registry.capture(names) as full:
        run([(0, T)])
    with registry.capture(names) as steps:
        run([(0, 5)] + [(t, t + 1) for t in range(5, T)])
    assert len(steps.chunks("engram.L1.gate")) == T - 4
    assert torch.equal(steps["engram.L1.hash_ids"], full["engram.L1.hash_ids"])
    # the wkv GEMM may sum in another order for other shapes: equal up to float32 rounding
    torch.testing.assert_close(steps["engram.L1.gate"], full["engram.L1.gate"], rtol=0, atol=1e-5)


def test_default_names_cover_the_trace_core(setup):
    _, _, registry = setup
    got = registry.resolve(DEFAULT_NAMES)
    assert set(got) == {hook_name(n, k) for n in (1, 3) for k in ("hash_ids", "token_mask", "gate")}


def test_capture_rank_without_distributed_captures(setup):
    config, engrams, registry = setup
    e = engrams[1]
    x, ids, mask = random_inputs(config, e)
    _, cache = registry.run_with_cache(lambda: e(x, ids, mask), names=["engram.L1.gate"], capture_rank=0)
    assert cache.captured and "engram.L1.gate" in cache
