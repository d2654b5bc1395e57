"""The n-gram hasher (reference section 3) against an independent per-position implementation.

The reference below is written from the spec alone, in plain Python ints: its own prime search
(Miller-Rabin, the reference's draw order with one `seen` set), the verified multipliers, a loop
over positions and look-backs with sticky blocking, XOR of id * multiplier, then % prime + offset.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from prompt_kit import as_torch

from engram_viz.cli import main
from engram_viz.config import CONFIG_DIR, ConfigError, EngramConfig, load_config
from engram_viz.core.hashing import DEAD, NgramHasher, hash_prompt
from engram_viz.errors import EngramVizError
from engram_viz.run.images import build_input
from engram_viz.weights.resolve import default_checkpoint

VERIFIED_MULTIPLIERS = {
    1: [76632096046245, 4839876093313, 35959672319349, 73987337458391],
    14: [67716810739261, 51510806800915, 30921347202721, 82619226485591],
}
ENGLISH = (
    "The Engram memory of DeepSeek remembers Alexander the Great, who was tutored by Aristotle. "
    "THE the The the - the same word, four ways.\n\n\tIndented line; numbers 12345 and 3.14159!"
)
CHINESE = "亚历山大大帝是马其顿王国的国王，他曾师从亚里士多德。北京是中华人民共和国的首都。"
PRESETS = ["v41-flash", "tiny"]


# ---------------------------------------------------------------- the independent reference


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin for n < 3,215,031,751 (bases 2, 3, 5, 7)."""
    if n < 2:
        return False
    for p in (2, 3, 5, 7):
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in (2, 3, 5, 7):
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def recipe_multipliers(layer_id: int, compressed_vocab: int, max_ngram: int) -> list[int]:
    """Reference section 2's recipe (needed for the tiny preset's layer 3; checked below against the
    verified values for layers 1 and 14)."""
    bound = max(1, (2**63 - 1) // compressed_vocab // 2)
    draws = np.random.default_rng(10007 * layer_id).integers(low=0, high=bound, size=(max_ngram,), dtype=np.int64)
    return [2 * int(v) + 1 for v in draws]


class Reference:
    """Multipliers [L][max_ngram], primes [L][orders][heads], offsets [L][24] as Python ints."""

    def __init__(self, config: EngramConfig):
        self.config = config
        n_max, heads = config.engram_max_ngram_size, config.engram_n_heads
        self.multipliers = [
            VERIFIED_MULTIPLIERS[layer]
            if config.engram_compressed_vocab_size == 99_092 and layer in VERIFIED_MULTIPLIERS
            else recipe_multipliers(layer, config.engram_compressed_vocab_size, n_max)
            for layer in config.engram_layer_ids
        ]
        seen: set[int] = set()
        self.primes = []
        for _layer in config.engram_layer_ids:
            per_order = []
            for _order in range(2, n_max + 1):
                start, drawn = config.engram_vocab_size - 1, []
                for _head in range(heads):
                    candidate = start + 1
                    while not is_prime(candidate) or candidate in seen:
                        candidate += 1
                    seen.add(candidate)
                    drawn.append(candidate)
                    start = candidate
                per_order.append(drawn)
            self.primes.append(per_order)
        self.offsets = []
        for per_order in self.primes:
            running, offs = 0, []
            for drawn in per_order:
                for p in drawn:
                    offs.append(running)
                    running += p
            self.offsets.append(offs)

    def hash(self, compressed: list[int], pad: int) -> list[list[list[int]]]:
        """Row ids [T][n_layers][24] of one sequence of compressed ids (DEAD at image positions)."""
        heads, n_max = self.config.engram_n_heads, self.config.engram_max_ngram_size
        out = []
        for t in range(len(compressed)):
            per_layer = []
            for li in range(len(self.multipliers)):
                rows, h, blocked = [], 0, False
                for shift in range(n_max):
                    if t - shift < 0 or compressed[t - shift] == DEAD:
                        blocked = True  # sticky: every longer look-back stays blocked
                    token = pad if blocked else compressed[t - shift]
                    h ^= token * self.multipliers[li][shift]
                    if shift >= 1:
                        for head in range(heads):
                            col = (shift - 1) * heads + head
                            rows.append(h % self.primes[li][shift - 1][head] + self.offsets[li][col])
                per_layer.append(rows)
            out.append(per_layer)
        return out


@pytest.fixture(scope="module")
def references() -> dict[str, Reference]:
    return {name: Reference(load_config(name)) for name in PRESETS}


def reference_rows(ref: Reference, tokenizer, ids: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """[B, T, L, 24] from the reference, with DEAD where mask is False."""
    token_map = tokenizer.token_map
    pad = int(token_map[ref.config.engram_pad_id])
    batch = []
    for b, seq in enumerate(ids.tolist()):
        comp = [int(token_map[r]) for r in seq]
        if mask is not None:
            comp = [c if keep else DEAD for c, keep in zip(comp, mask[b].tolist())]
        batch.append(ref.hash(comp, pad))
    return np.array(batch, dtype=np.int64).reshape(len(batch), ids.shape[1], len(ref.multipliers), -1)


def vl_prompt(tokenizer, preset: str, text: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Raw ids [1, T] and token mask [1, T] of a prompt with ``<image:WxH>`` placeholders (no BOS)."""
    built = as_torch(build_input(text, tokenizer, preset, bos=False))
    return built["input_ids"], built["token_mask"]


# ---------------------------------------------------------------- the reference's own parameters


def test_recipe_reproduces_the_verified_multipliers():
    for layer, want in VERIFIED_MULTIPLIERS.items():
        assert recipe_multipliers(layer, 99_092, 4) == want


def test_reference_primes_match_the_verified_facts(references):
    v41 = references["v41-flash"]
    assert [sum(sum(o) for o in layer) for layer in v41.primes] == [384_006_168, 384_016_682]
    assert v41.primes[0][0][:2] == [16000057, 16000079] and v41.primes[1][2][-2:] == [16000879, 16000889]
    tiny = references["tiny"]
    assert [sum(sum(o) for o in layer) for layer in tiny.primes] == list(tiny.config.engram_num_embeddings)


# ---------------------------------------------------------------- vectorised == reference


@pytest.mark.parametrize("text", [ENGLISH, CHINESE, ENGLISH + " " + CHINESE], ids=["english", "chinese", "mixed"])
@pytest.mark.parametrize("preset", PRESETS)
def test_real_text_matches_reference(preset, references, tokenizer, text):
    reference = references[preset]
    ids = torch.tensor([tokenizer.encode(text, bos=True)])
    got = hash_prompt(preset, tokenizer.token_map, ids)
    assert got.dtype == torch.int64 and got.shape == (1, ids.shape[1], 2, 24)
    np.testing.assert_array_equal(got.numpy(), reference_rows(reference, tokenizer, ids))


@pytest.mark.parametrize("preset", PRESETS)
def test_random_ids_match_reference(preset, references, tokenizer):
    reference = references[preset]
    gen = torch.Generator().manual_seed(1234)
    ids = torch.randint(0, 129_280, (3, 97), generator=gen)
    ids[0, 10:20] = 2  # pad tokens inside the text
    ids[1, :5] = torch.arange(129_275, 129_280)  # added tokens
    ids[2, 40:50] = 270  # a repeated token
    got = hash_prompt(preset, tokenizer.token_map, ids)
    np.testing.assert_array_equal(got.numpy(), reference_rows(reference, tokenizer, ids))
    # int32 ids hash the same
    np.testing.assert_array_equal(hash_prompt(preset, tokenizer.token_map, ids.int()).numpy(), got.numpy())


@pytest.mark.parametrize("preset", PRESETS)
def test_image_spans_match_reference(preset, references, tokenizer):
    reference = references[preset]
    ids0, mask0 = vl_prompt(tokenizer, preset, "<image:3x2>Describe this picture:<image:4x1><image:2x2>in one word.")
    ids1, mask1 = vl_prompt(tokenizer, preset, "Compare<image:2x3>with the text<image:1x1>")
    length = max(ids0.shape[1], ids1.shape[1])
    # batch of two prompts of different lengths, the shorter one padded with text pad tokens
    ids = torch.full((2, length), 2)
    mask = torch.ones((2, length), dtype=torch.bool)
    ids[0, : ids0.shape[1]], mask[0, : ids0.shape[1]] = ids0[0], mask0[0]
    ids[1, : ids1.shape[1]], mask[1, : ids1.shape[1]] = ids1[0], mask1[0]
    assert (~mask).sum() > 20
    got = hash_prompt(preset, tokenizer.token_map, ids, mask)
    np.testing.assert_array_equal(got.numpy(), reference_rows(reference, tokenizer, ids, mask))


def test_batch_rows_are_independent(tokenizer):
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(0, 129_280, (4, 30), generator=gen)
    together = hash_prompt("v41-flash", tokenizer.token_map, ids)
    for b in range(4):
        alone = hash_prompt("v41-flash", tokenizer.token_map, ids[b : b + 1])
        assert torch.equal(together[b : b + 1], alone)


# ---------------------------------------------------------------- properties

raw_id = st.one_of(st.integers(0, 129_279), st.sampled_from([2, 0, 270, 671, 1805, 128_000, 129_264, 129_279]))


@st.composite
def prompts(draw, max_len: int = 40):
    """(ids [T], mask [T]); masked (image) positions only in a leading part, the first chunk."""
    ids = draw(st.lists(raw_id, min_size=1, max_size=max_len))
    first = draw(st.integers(1, len(ids)))
    head = draw(st.lists(st.booleans(), min_size=first, max_size=first))
    return ids, head + [True] * (len(ids) - first), first


@st.composite
def splits(draw, length: int, first: int):
    """Chunk sizes summing to length; the first chunk covers at least ``first`` positions."""
    sizes = [draw(st.integers(first, length))]
    while sum(sizes) < length:
        left = length - sum(sizes)
        sizes.append(draw(st.one_of(st.just(1), st.integers(1, left))) if left > 1 else 1)
    return sizes


@given(data=st.data(), preset_name=st.sampled_from(PRESETS))
def test_any_chunking_equals_one_prefill(tokenizer, data, preset_name):
    ids, mask, first = data.draw(prompts())
    sizes = data.draw(splits(len(ids), first))
    ids_t, mask_t = torch.tensor([ids]), torch.tensor([mask])
    full = hash_prompt(preset_name, tokenizer.token_map, ids_t, mask_t)
    hasher = NgramHasher(
        preset_name, tokenizer.token_map, max_batch=1, max_seq_len=len(ids) + data.draw(st.integers(0, 5))
    )
    pos, parts = 0, []
    for size in sizes:
        chunk_mask = mask_t[:, pos : pos + size]
        # later chunks may pass no mask at all (all text)
        use_mask = chunk_mask if pos == 0 or data.draw(st.booleans()) else None
        parts.append(hasher(ids_t[:, pos : pos + size], pos, use_mask))
        pos += size
    assert torch.equal(torch.cat(parts, dim=1), full)


@given(prompt=prompts())
def test_prefill_matches_reference_on_random_masks(tokenizer, references, prompt):
    ids, mask, _ = prompt
    ids_t, mask_t = torch.tensor([ids]), torch.tensor([mask])
    for name, ref in references.items():
        got = hash_prompt(name, tokenizer.token_map, ids_t, mask_t)
        np.testing.assert_array_equal(got.numpy(), reference_rows(ref, tokenizer, ids_t, mask_t))


@given(prompt=prompts())
def test_every_row_lies_in_its_column(tokenizer, references, prompt):
    ids, mask, _ = prompt
    for name, ref in references.items():
        rows = hash_prompt(name, tokenizer.token_map, torch.tensor([ids]), torch.tensor([mask]))[0].numpy()
        offsets = np.array(ref.offsets)  # [L, 24]
        primes = np.array(ref.primes).reshape(len(ref.primes), -1)  # [L, 24]
        assert ((rows >= offsets) & (rows < offsets + primes)).all()


@given(prompt=prompts())
def test_image_positions_hash_like_an_all_pad_window(tokenizer, references, prompt):
    ids, mask, _ = prompt
    for name, ref in references.items():
        rows = hash_prompt(name, tokenizer.token_map, torch.tensor([ids]), torch.tensor([mask]))[0]
        pad = int(tokenizer.token_map[2])
        all_pad = torch.tensor(ref.hash([pad], pad)[0])  # position 0: every look-back blocked, reads pad
        # the same window, as the library hashes a lone pad token
        assert torch.equal(hash_prompt(name, tokenizer.token_map, torch.tensor([[2]]))[0, 0], all_pad)
        for t, keep in enumerate(mask):
            if not keep:
                assert torch.equal(rows[t], all_pad), t


@given(prompt=prompts())
def test_text_after_an_image_hashes_like_a_sequence_start(tokenizer, prompt):
    ids, mask, _ = prompt
    for name in PRESETS:
        rows = hash_prompt(name, tokenizer.token_map, torch.tensor([ids]), torch.tensor([mask]))[0]
        t = 0
        while t < len(ids):
            if mask[t] and (t == 0 or not mask[t - 1]):  # a run of text starts here
                end = t
                while end < len(ids) and mask[end]:
                    end += 1
                alone = hash_prompt(name, tokenizer.token_map, torch.tensor([ids[t:end]]))[0]
                assert torch.equal(rows[t:end], alone), (t, end)
                t = end
            else:
                t += 1


def test_image_span_shuts_the_lookback_of_the_next_token(tokenizer):
    # explicit case: "cat" after an image vs "cat" after text
    ids, mask = vl_prompt(tokenizer, "v41-flash", "a<image:2x1> cat")
    assert (~mask).sum() == 5 and ids[0, -1] == tokenizer.encode(" cat")[0]
    rows = hash_prompt("v41-flash", tokenizer.token_map, ids, mask)[0]
    start = hash_prompt("v41-flash", tokenizer.token_map, torch.tensor([tokenizer.encode(" cat")]))[0, 0]
    assert torch.equal(rows[-1], start)
    unmasked = hash_prompt("v41-flash", tokenizer.token_map, ids)[0]
    assert not torch.equal(unmasked[-1], start)


def test_reset_starts_a_new_sequence(tokenizer):
    hasher = NgramHasher("tiny", tokenizer.token_map, max_batch=1, max_seq_len=16)
    a, b = torch.tensor([tokenizer.encode("one two three")]), torch.tensor([tokenizer.encode(" four five")])
    hasher(a, 0)
    hasher.reset()
    assert torch.equal(hasher(b, 0), hash_prompt("tiny", tokenizer.token_map, b))


def test_decode_continues_the_prefill(tokenizer):
    ids = torch.tensor([tokenizer.encode(ENGLISH)])
    hasher = NgramHasher("v41-flash", tokenizer.token_map, max_batch=1, max_seq_len=ids.shape[1])
    outs = [hasher(ids[:, :10], 0)] + [hasher(ids[:, t : t + 1], t) for t in range(10, ids.shape[1])]
    assert torch.equal(torch.cat(outs, 1), hash_prompt("v41-flash", tokenizer.token_map, ids))


# ---------------------------------------------------------------- bad input


@pytest.fixture
def hasher(tokenizer) -> NgramHasher:
    return NgramHasher("tiny", tokenizer.token_map, max_batch=2, max_seq_len=16)


@pytest.mark.parametrize(
    ("ids", "error", "message"),
    [
        (torch.tensor([[5, 129_280]]), ValueError, r"input_ids holds token id 129280; expected raw ids in 0\.\.129279"),
        (torch.tensor([[5, -1]]), ValueError, r"input_ids holds token id -1; expected raw ids in 0\.\.129279"),
        (torch.tensor([5, 6]), ValueError, r"input_ids must have shape \[batch, seq_len\], got rank 1 shape \[2\]"),
        (torch.zeros(1, 2, 3, dtype=torch.long), ValueError, r"got rank 3 shape \[1, 2, 3\]"),
        (torch.tensor([[5.0, 6.0]]), TypeError, r"input_ids must be int64 or int32 token ids, got torch.float32"),
        (torch.tensor([[True]]), TypeError, r"got torch.bool"),
        ([[5, 6]], TypeError, r"input_ids must be a torch.Tensor, got list"),
        (np.array([[5, 6]]), TypeError, r"input_ids must be a torch.Tensor, got ndarray"),
    ],
    ids=["too-large", "negative", "rank-1", "rank-3", "float", "bool", "list", "numpy"],
)
def test_bad_ids_are_named(hasher, tokenizer, ids, error, message):
    with pytest.raises(error, match=message):
        hasher(ids, 0)
    with pytest.raises(error, match=message):
        hash_prompt("tiny", tokenizer.token_map, ids)


def test_chunk_that_overruns_the_cache(hasher):
    with pytest.raises(ValueError, match=r"chunk at start_pos=12 of length 5 overruns the cache of max_seq_len=16"):
        hasher(torch.ones((1, 5), dtype=torch.long), 12)
    with pytest.raises(ValueError, match=r"start_pos=-1"):
        hasher(torch.ones((1, 1), dtype=torch.long), -1)
    with pytest.raises(ValueError, match=r"batch 3 but the hasher's cache holds max_batch=2"):
        hasher(torch.ones((3, 1), dtype=torch.long), 0)


def test_image_span_outside_the_first_chunk_is_refused_and_leaves_the_cache_intact(hasher, tokenizer):
    ids = torch.tensor([tokenizer.encode("one two three four five six")])
    n = ids.shape[1]
    head = hasher(ids[:, :3], 0)
    mask = torch.ones((1, n - 3), dtype=torch.bool)
    mask[0, 1] = False
    with pytest.raises(ValueError, match=r"image spans must lie in the first \(start_pos 0\) chunk.*start_pos=3"):
        hasher(ids[:, 3:], 3, mask)
    tail = hasher(ids[:, 3:], 3)
    assert torch.equal(torch.cat([head, tail], 1), hash_prompt("tiny", tokenizer.token_map, ids))


@pytest.mark.parametrize(
    ("mask", "error", "message"),
    [
        (torch.ones((1, 3), dtype=torch.long), TypeError, r"token_mask must be a bool tensor, got torch.int64"),
        ([[True, True, True]], TypeError, r"token_mask must be a bool tensor"),
        (torch.ones((1, 4), dtype=torch.bool), ValueError, r"token_mask has shape \[1, 4\], expected \[1, 3\]"),
    ],
)
def test_bad_token_mask(hasher, mask, error, message):
    with pytest.raises(error, match=message):
        hasher(torch.tensor([[5, 6, 7]]), 0, mask)


def test_bad_token_map(tokenizer):
    with pytest.raises(ValueError, match=r"token_map must have shape \[129280\], got \[100\]"):
        NgramHasher("tiny", np.arange(100))
    with pytest.raises(ValueError, match=r"token_map must have shape \[129280\], got \[2, 129280\]"):
        NgramHasher("tiny", np.stack([tokenizer.token_map] * 2))


# ---------------------------------------------------------------- CLI


def test_cli_hash_json(capsys, tokenizer, references):
    text = "The Engram memory of DeepSeek 记得亚历山大大帝"
    assert main(["hash", text, "--config", "v41-flash", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"raw_ids", "compressed_ids", "row_ids"}
    raw = tokenizer.encode(text)
    assert out["raw_ids"] == raw
    assert out["compressed_ids"] == tokenizer.compress(raw).tolist()
    rows = np.asarray(out["row_ids"])
    assert rows.shape == (len(raw), 2, 24)
    np.testing.assert_array_equal(rows, reference_rows(references["v41-flash"], tokenizer, torch.tensor([raw]))[0])
    assert main(["hash", text, "--config", "v41-flash", "--json", "--bos"]) == 0
    assert json.loads(capsys.readouterr().out)["raw_ids"] == [0, *raw]


def test_cli_hash_subprocess_default_config(tokenizer):
    """Without --config, hash gives the row ids of the embedded default model (what a default report
    shows), not of the tiny preset, whose tables are smaller."""
    proc = subprocess.run(
        [sys.executable, "-m", "engram_viz.cli", "hash", "THE the", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    out = json.loads(proc.stdout)
    assert len(set(out["compressed_ids"])) == 1  # THE and " the" share a compressed id
    config = default_checkpoint().config
    assert config.engram_num_embeddings != load_config("tiny").engram_num_embeddings
    rows = np.asarray(out["row_ids"])
    np.testing.assert_array_equal(rows, reference_rows(Reference(config), tokenizer, torch.tensor([out["raw_ids"]]))[0])


def test_cli_hash_text_output(capsys):
    assert main(["hash", "hello world", "--config", "tiny"]) == 0
    text = capsys.readouterr().out
    assert "2 tokens" in text and "L1:" in text and "L3:" in text


def test_cli_hash_empty_text():
    with pytest.raises(SystemExit, match=r"TEXT produced no tokens"):
        main(["hash", "", "--config", "tiny"])


def test_a_config_whose_primes_disagree_with_its_tables_is_refused_before_hashing(tmp_path, tokenizer):
    """engram_num_embeddings must equal the rows the layout's primes give; the hasher checks it, so a
    wrong config never produces a row id (reference section 2)."""
    path = tmp_path / "config.json"
    raw = json.loads((CONFIG_DIR / "tiny.json").read_text())
    path.write_text(json.dumps({**raw, "engram_num_embeddings": [50148, 54841]}))
    bad = load_config(path)
    with pytest.raises(ConfigError, match=rf"config '{path}': .*differ from engram_num_embeddings \[50148, 54841\]"):
        NgramHasher(bad, tokenizer.token_map)


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda m: m.__setitem__(500, -1), ValueError, r"token_map\[500\] = -1; compressed ids must lie in 0\.\.99091"),
        (lambda m: m.__setitem__(7, 99_092), ValueError, r"token_map\[7\] = 99092"),
        (lambda m: m.astype(np.float64), TypeError, r"token_map must hold integer compressed ids, got torch.float64"),
        (lambda m: m.astype(bool), TypeError, r"got torch.bool"),
    ],
    ids=["negative", "too-large", "float", "bool"],
)
def test_bad_token_map_values(tokenizer, change, error, message):
    """A -1 in the map would hash like a DEAD image position; floats would be truncated."""
    token_map = tokenizer.token_map.copy()
    changed = change(token_map)
    with pytest.raises(error, match=message) as err:
        NgramHasher("tiny", token_map if changed is None else changed)
    assert isinstance(err.value, EngramVizError)


def test_a_start_pos_that_skips_positions_is_refused(hasher, tokenizer):
    ids = torch.tensor([tokenizer.encode("one two three four five six")])
    with pytest.raises(ValueError, match=r"start_pos=2 skips positions: the cache holds 0 hashed positions"):
        hasher(ids[:, 2:4], 2)  # nothing hashed yet
    head = hasher(ids[:, :3], 0)
    with pytest.raises(ValueError, match=r"start_pos=4 skips positions: .* holds 3 hashed positions \(0\.\.2\)"):
        hasher(ids[:, 4:], 4)
    tail = hasher(ids[:, 3:], 3)  # the next position continues
    assert torch.equal(torch.cat([head, tail], 1), hash_prompt("tiny", tokenizer.token_map, ids))
    assert torch.equal(hasher(ids[:, 1:2], 1), head[:, 1:2])  # a rewind re-hashes an earlier position
    with pytest.raises(ValueError, match=r"start_pos=3 skips positions: .* holds 2 hashed positions"):
        hasher(ids[:, 3:4], 3)  # ... and forgets what followed it
    with pytest.raises(TypeError, match=r"start_pos must be an integer position, got float"):
        hasher(ids[:, :1], 0.0)
    hasher.reset()
    with pytest.raises(ValueError, match=r"start_pos=1 skips positions"):
        hasher(ids[:, 1:2], 1)


def test_hasher_errors_are_the_suites_own(hasher):
    with pytest.raises(EngramVizError):
        hasher([[5, 6]], 0)
    with pytest.raises(EngramVizError):
        hasher(torch.tensor([[5, 129_280]]), 0)
    with pytest.raises(EngramVizError, match=r"max_seq_len must be a positive integer, got 0"):
        NgramHasher("tiny", np.zeros(129_280, dtype=np.int64), max_seq_len=0)
