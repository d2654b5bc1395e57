"""EngramLayout: multipliers, primes, offsets (reference section 2) and the inverse questions."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
from importlib.metadata import entry_points

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engram_viz.cli import main
from engram_viz.config import load_config
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout, RowOwner, _layout_primes, is_prime, next_prime

# Reference section 2, verified values.
V41_MULTIPLIERS = [
    [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    [67716810739261, 51510806800915, 30921347202721, 82619226485591],
]
V41_ROWS = [384_006_168, 384_016_682]


def primes_above(start: int, count: int) -> list[int]:
    """The first ``count`` primes > ``start``: a segmented sieve, independent of the library's search."""
    width = 64 * count + 1000  # prime gaps near 1.6e7 average ~17; this window is ample
    lo, hi = start + 1, start + 1 + width
    small = [p for p in range(2, int(hi**0.5) + 1) if all(p % q for q in range(2, int(p**0.5) + 1))]
    alive = bytearray([1]) * width
    for p in small:
        first = max(p * p, (lo + p - 1) // p * p)
        alive[first - lo :: p] = bytearray(len(range(first - lo, width, p)))
    found = [lo + i for i in range(width) if alive[i] and lo + i > 1]
    assert len(found) >= count
    return found[:count]


@pytest.fixture(scope="module")
def v41(v41_config) -> EngramLayout:
    return EngramLayout(v41_config)


@pytest.fixture(scope="module")
def tiny(tiny_config) -> EngramLayout:
    return EngramLayout(tiny_config)


# ---------------------------------------------------------------- the real layout


def test_rows_per_layer_equal_engram_num_embeddings(v41, v41_config):
    assert v41.rows_per_layer.tolist() == V41_ROWS == list(v41_config.engram_num_embeddings)
    assert v41.column_primes.sum(axis=1).tolist() == V41_ROWS
    v41.check_against_config()


def test_multipliers_equal_the_verified_values(v41):
    assert v41.multipliers.dtype == np.int64
    assert v41.multipliers.shape == (2, 4)
    assert v41.multipliers.tolist() == V41_MULTIPLIERS
    assert (v41.multipliers % 2 == 1).all()


def test_no_overflow_is_possible(v41, v41_config):
    # the largest product of a compressed id and a multiplier stays below 2**63
    assert (v41_config.engram_compressed_vocab_size - 1) * int(v41.multipliers.max()) < 2**63


def test_primes_are_the_first_48_primes_above_engram_vocab_size(v41):
    primes = v41.primes
    assert primes.dtype == np.int64 and primes.shape == (2, 3, 8)
    flat = primes.reshape(-1).tolist()
    assert len(set(flat)) == 48
    assert flat == primes_above(16_000_000 - 1, 48)
    assert flat[:2] == [16000057, 16000079]  # layer 1, 2-gram, heads 0 and 1
    assert primes[1, 2, -2:].tolist() == [16000879, 16000889]  # layer 14, 4-gram, last two heads
    assert primes[0].reshape(-1).tolist() == flat[:24] and primes[1].reshape(-1).tolist() == flat[24:]


def test_column_primes_follow_order_then_head(v41):
    for li in range(2):
        for order in (2, 3, 4):
            for head in range(8):
                col = v41.column(order, head)
                assert col == (order - 2) * 8 + head
                assert v41.column_primes[li, col] == v41.primes[li, order - 2, head]


def assert_columns_tile(layout: EngramLayout) -> None:
    """Every layer's column ranges [offset, offset + prime) tile [0, rows) in column order."""
    assert layout.offsets.dtype == np.int64
    assert layout.offsets.shape == (len(layout.layer_ids), layout.n_hash_cols)
    for li in range(len(layout.layer_ids)):
        end = 0
        for col in range(layout.n_hash_cols):
            start = int(layout.offsets[li, col])
            assert start == end, f"layer index {li} column {col} starts at {start}, previous ends at {end}"
            end = start + int(layout.column_primes[li, col])
        assert end == layout.rows_per_layer[li]


def test_offsets_are_disjoint_and_tile_each_table(v41):
    assert_columns_tile(v41)
    assert v41.offsets[:, 0].tolist() == [0, 0]  # one table per layer
    assert v41.offsets[0, 1] == 16000057


# ---------------------------------------------------------------- the tiny preset


def test_tiny_preset_obeys_the_same_rules(tiny, tiny_config):
    assert tiny.rows_per_layer.tolist() == list(tiny_config.engram_num_embeddings)
    tiny.check_against_config()
    flat = tiny.primes.reshape(-1).tolist()
    assert len(set(flat)) == 48
    assert flat == primes_above(tiny_config.engram_vocab_size - 1, 48)
    assert_columns_tile(tiny)
    assert (tiny.multipliers % 2 == 1).all()


def test_multipliers_depend_only_on_layer_id_and_compressed_vocab(tiny, v41):
    # tiny shares layer 1 and the compressed vocab with v41-flash, so its layer-1 multipliers match
    assert tiny.layer_ids[0] == v41.layer_ids[0] == 1
    assert tiny.multipliers[0].tolist() == V41_MULTIPLIERS[0]
    assert tiny.multipliers[1].tolist() != V41_MULTIPLIERS[1]


def test_a_config_whose_sizes_disagree_is_refused(tiny_config):
    bad = dataclasses.replace(tiny_config, engram_num_embeddings=(50148, 54841))
    with pytest.raises(ValueError, match=r"\[50148, 54840\] differ from engram_num_embeddings \[50148, 54841\]"):
        EngramLayout(bad).check_against_config()


# ---------------------------------------------------------------- inverse questions


def test_owner_at_every_column_boundary(v41):
    for li, layer in enumerate(v41.layer_ids):
        for col in range(24):
            start = int(v41.offsets[li, col])
            prime = int(v41.column_primes[li, col])
            for row, bucket in ((start, 0), (start + prime - 1, prime - 1), (start + prime // 2, prime // 2)):
                assert v41.owner(layer, row) == RowOwner(
                    layer=layer, layer_index=li, order=col // 8 + 2, head=col % 8, column=col, bucket=bucket
                )


@pytest.mark.parametrize(("layer", "row"), [(1, -1), (1, 384_006_168), (14, 384_016_682), (14, 10**12)])
def test_owner_rejects_rows_outside_the_table(v41, layer, row):
    with pytest.raises(ValueError, match=rf"row {row} out of range for layer {layer}"):
        v41.owner(layer, row)


def test_inverse_questions_reject_unknown_layers_orders_heads(v41):
    with pytest.raises(ValueError, match=r"layer 2 is not an Engram layer; expected one of \[1, 14\]"):
        v41.owner(2, 0)
    with pytest.raises(ValueError, match=r"n-gram order 5 out of range"):
        v41.column(5, 0)
    with pytest.raises(ValueError, match=r"head 8 out of range"):
        v41.column(2, 8)
    with pytest.raises(ValueError, match=r"an n-gram of 1 tokens"):
        v41.ngram_rows(1, [5])
    with pytest.raises(ValueError, match=r"an n-gram of 5 tokens"):
        v41.ngram_rows(1, [5, 6, 7, 8, 9])
    with pytest.raises(ValueError, match=r"compressed id 99092 out of range"):
        v41.ngram_rows(14, [5, 99092])
    with pytest.raises(ValueError, match=r"compressed id -1 out of range"):
        v41.ngram_rows(14, [-1, 5])


@pytest.mark.parametrize("preset", ["v41-flash", "tiny"])
def test_inverse_questions_agree_with_the_hasher(preset, tokenizer):
    """For every position, order and layer: ngram_rows of the (pad-filled) n-gram gives the hasher's
    rows, and owner() of each of those rows names the column the hasher put it in."""
    layout = EngramLayout(load_config(preset))
    raw = tokenizer.encode("The Engram memory of DeepSeek remembers Alexander the Great. 亚历山大大帝")
    comp = tokenizer.compress(raw).tolist()
    rows = hash_prompt(layout.config, tokenizer.token_map, torch.tensor([raw]))[0].numpy()
    pad = tokenizer.pad_compressed
    for t in range(len(raw)):
        for li, layer in enumerate(layout.layer_ids):
            for order in layout.config.ngram_orders:
                window = [pad] * max(0, order - 1 - t) + comp[max(0, t - order + 1) : t + 1]
                cols = slice((order - 2) * 8, (order - 1) * 8)
                got = rows[t, li, cols]
                assert layout.ngram_rows(layer, window).tolist() == got.tolist(), (t, layer, order)
                for head, row in enumerate(got.tolist()):
                    owner = layout.owner(layer, row)
                    assert (owner.order, owner.head) == (order, head)
                    assert owner.bucket == row - layout.offsets[li, owner.column]


# ---------------------------------------------------------------- CLI


def test_cli_layout_json_in_process(capsys):
    assert main(["layout", "--config", "v41-flash", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["config"] == "v41-flash"
    assert out["compressed_vocab_size"] == 99_092
    assert out["layer_ids"] == [1, 14]
    assert out["n_hash_cols"] == 24
    assert out["multipliers"] == V41_MULTIPLIERS
    assert out["rows_per_layer"] == V41_ROWS
    assert np.asarray(out["primes"]).reshape(-1).tolist() == primes_above(16_000_000 - 1, 48)
    assert np.asarray(out["offsets"]).shape == (2, 24)


def test_cli_layout_text_and_subprocess():
    proc = subprocess.run(
        [sys.executable, "-m", "engram_viz.cli", "layout", "--config", "v41-flash"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "Engram layer 14: 384,016,682 rows" in proc.stdout
    assert "16000057" in proc.stdout and "16000889" in proc.stdout


def test_cli_layout_bad_config_is_a_clean_error(capsys):
    assert main(["layout", "--config", "no-such-config"]) == 2
    assert "unknown config 'no-such-config'" in capsys.readouterr().err


def test_console_script_is_declared():
    (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "engram-viz"]
    assert script.value == "engram_viz.cli:main"


# ---------------------------------------------------------------- the prime search (issue 23)


def trial_division(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def test_is_prime_matches_trial_division():
    for n in range(-5, 30_000):
        assert is_prime(n) == trial_division(n), n
    rng = np.random.default_rng(23)
    for n in rng.integers(10**8, 10**10, size=300).tolist():
        assert is_prime(n) == trial_division(n), n


@pytest.mark.parametrize(
    "n",
    [
        561,  # Carmichael numbers fool Fermat's test
        41041,
        3_215_031_751,  # strong pseudoprime to the bases 2, 3, 5, 7
        3_825_123_056_546_413_051,  # strong pseudoprime to every base up to 23
        (2**31 - 1) * (2**31 + 11),  # a semiprime near 2**62
    ],
)
def test_is_prime_refuses_pseudoprimes(n):
    assert not is_prime(n)


def test_is_prime_on_large_known_primes_and_the_reference_primes():
    for p in (2**31 - 1, 2**61 - 1, 2**63 - 25, 16000057, 16000079, 16000879, 16000889):
        assert is_prime(p), p
    assert next_prime(16_000_000) == 16000057 and next_prime(16000057) == 16000079
    assert not is_prime(2**63 - 1)  # 7^2 x 73 x ...


def seen_set_primes(vocab: int, n_layers: int, n_orders: int, n_heads: int) -> np.ndarray:
    """The reference's loop as it reads: a shared seen set, the start restarted per order."""
    seen: set[int] = set()
    out = np.zeros((n_layers, n_orders, n_heads), dtype=np.int64)
    for li in range(n_layers):
        for oi in range(n_orders):
            start = vocab - 1
            for head in range(n_heads):
                p = start + 1
                while not trial_division(p) or p in seen:
                    p += 1
                seen.add(p)
                out[li, oi, head] = start = p
    return out


@settings(max_examples=60, deadline=2000)
@given(
    vocab=st.integers(1, 5000),
    n_layers=st.integers(1, 4),
    n_orders=st.integers(1, 5),
    n_heads=st.integers(1, 9),
)
def test_layout_primes_equal_the_seen_set_loop(vocab, n_layers, n_orders, n_heads):
    got = _layout_primes(vocab, n_layers, n_orders, n_heads)
    assert np.array_equal(got, seen_set_primes(vocab, n_layers, n_orders, n_heads))
    assert not got.flags.writeable  # cached: nobody may change the shared array


def test_v41_layout_builds_fast_and_is_cached(v41_config):
    start = time.perf_counter()
    layout = EngramLayout(v41_config)
    layout.check_against_config()
    assert time.perf_counter() - start < 1.0
    before = _layout_primes.cache_info().hits
    assert np.array_equal(EngramLayout(v41_config).primes, layout.primes)
    assert _layout_primes.cache_info().hits == before + 1
