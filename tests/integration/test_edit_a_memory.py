"""Counterfactual row edits through a Pipeline on the checkpoint kinds the suite reads (the
embedded default, whatever it is, and synthetic Engram layers on embedding streams); the inverse
row index against brute force; the row lens, collision interference and knowledge localisation.
Numbers are the model's own, never pinned."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.edits.localisation import ENTITY_PROMPT, PARTS, entity_localisation
from engram_viz.analysis.edits.row_lens import LensError, position_lens, row_lens
from engram_viz.analysis.edits.shared_rows import collateral_ngrams, collateral_reads, collision_interference
from engram_viz.analysis.edits.targets import EditTargetError, entity_rows, head_rows, ngram_rows, window_rows
from engram_viz.analysis.row_stats.row_index import RowIndex, RowIndexError
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.errors import RowEditError
from engram_viz.run.capture import force_gate
from engram_viz.run.counterfactual import compare_edit
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.synthetic import synthetic_checkpoint

pytestmark = pytest.mark.integration
TEXT = "And the king of Egypt said unto the children of Israel, Go ye out."
OTHER = "In the beginning God created the heaven and the earth."
CORPUS = [TEXT, OTHER, "of the of the of the king", "中国古代的四大发明是造纸术、指南针、火药和印刷术。"]


@pytest.fixture(scope="module", params=["default", "synthetic"])
def pipe(request):
    if request.param == "default":
        return Pipeline(device="cpu")
    return Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu")


@pytest.fixture(scope="module")
def default_pipe():
    return Pipeline(device="cpu")


@pytest.fixture(scope="module")
def corpus_index(default_pipe):
    counts = NgramCounts(default_pipe.config)
    for t in CORPUS:
        counts.add_compressed(default_pipe.tokenizer.compress(default_pipe.tokenizer.encode(t, bos=True)))
    return counts, RowIndex.build(counts, max_per_row=1000)


def _position_rows(pipe, text, position):
    p = pipe.build([text])[0]
    h = hash_prompt(pipe.config, pipe.tokenizer.token_map, torch.from_numpy(p.input_ids)[None])[0, position]
    return {n: h[li].numpy() for li, n in enumerate(pipe.layer_ids)}


def test_untouched_positions_are_bit_identical(pipe):
    edits = _position_rows(pipe, TEXT, 9)  # all 24 rows of one position, every layer
    layer0 = pipe.layer_ids[0]
    first = [int(r) for r in edits[layer0]]
    edits[layer0] = {r: "zero" for r in first} | {first[1]: first[-1] + 1}  # one row copies another
    effect = compare_edit(pipe, [TEXT, OTHER], edits)
    pos = effect.positions
    assert pos["reads_edit"].any() and (~pos["touched"]).any()
    moved = pos[["d_gate_max", "value_change", "out_change"]].abs().sum(axis=1) > 0
    assert not moved[~pos["touched"]].any(), "a position that reads no edited row changed"
    assert moved[(pos["position"] == 9) & (pos["prompt"] == "p0")].all()
    gates = effect.gates.merge(pos[["prompt", "position", "layer", "touched"]], on=["prompt", "position", "layer"])
    untouched = gates[~gates["touched"]]
    assert (untouched["gate"].to_numpy() == untouched["gate_edited"].to_numpy()).all()
    if effect.loss is not None:
        lo = effect.loss[~effect.loss["touched"]]
        assert len(lo) and (lo["loss"].to_numpy() == lo["loss_edited"].to_numpy()).all()
        assert effect.loss["d_loss"].abs().max() > 0
    reads = effect.reads
    assert len(reads) and set(reads["layer"]) <= set(pipe.layer_ids)
    for n, rows in _position_rows(pipe, TEXT, 9).items():
        assert set(reads[(reads["prompt"] == "p0") & (reads["position"] == 9) & (reads["layer"] == n)]["row"]) == set(
            rows.tolist()
        )


def test_no_edit_changes_nothing_and_a_hook_touches_all(pipe):
    same = compare_edit(pipe, [OTHER], {})
    assert (same.positions[["d_gate_max", "value_change", "out_change"]].to_numpy() == 0).all()
    off = compare_edit(pipe, [OTHER], hooks={"engram.*.gate": force_gate(0.0)})
    assert off.positions["touched"].all() and (off.gates["gate_edited"] == 0).all()


@pytest.mark.parametrize("edits", [[1, 2], np.array([3]), {"L1": [1]}, {True: [1]}, "last", {-1: [1.5]}])
def test_bad_edits_through_compare_edit_are_one_row_edit_error(default_pipe, edits):
    """Not a {layer: edits} mapping (once a raw TypeError from ``dict``), a bad layer key or row id."""
    if isinstance(edits, dict) and -1 in edits:
        edits = {default_pipe.layer_ids[0]: edits[-1]}
    with pytest.raises(RowEditError) as err:
        compare_edit(default_pipe, [OTHER], edits)
    assert "\n" not in str(err.value)


def test_zeroing_a_row_equals_zeroing_it_in_the_rows_hook(pipe):
    """The overlay and the ``rows`` hook are two ways to ablate a row; they must agree bit for bit."""
    layer = pipe.layer_ids[-1]
    rows = _position_rows(pipe, TEXT, 5)[layer]
    effect = compare_edit(pipe, [TEXT], {layer: rows[:3]})

    def zero(t, name):
        hid = torch.from_numpy(np.isin(_hid[0].numpy(), rows[:3]))
        return t * (~hid).unsqueeze(-1).to(t.dtype)

    p = pipe.build([TEXT])[0]
    _hid = hash_prompt(pipe.config, pipe.tokenizer.token_map, torch.from_numpy(p.input_ids)[None])[
        :, :, pipe.layer_ids.index(layer)
    ]
    trace = pipe.run([TEXT], hooks={f"engram.L{layer}.rows": zero})
    got = effect.gates[effect.gates["layer"] == layer].sort_values(["position", "stream"])["gate_edited"].to_numpy()
    want = trace.gates[0, : len(p.input_ids), pipe.layer_ids.index(layer)].reshape(-1).double().numpy()
    assert np.array_equal(got, want)


def test_selections(default_pipe):
    layout = EngramLayout(default_pipe.config)
    tok = default_pipe.tokenizer
    ids = tok.encode(TEXT, bos=True)
    c = tok.compress(ids)
    h = hash_prompt(default_pipe.config, tok.token_map, torch.tensor([ids]))[0]
    t = 8
    w = window_rows(layout, c[t - 3 : t + 1])
    for li, n in enumerate(layout.layer_ids):
        assert np.array_equal(w[n], h[t, li].numpy())
        assert np.array_equal(ngram_rows(layout, c[t - 1 : t + 1])[n], h[t, li, :8].numpy())
    col = head_rows(layout, layout.layer_ids[0], 3, 2)[layout.layer_ids[0]]
    assert all(layout.owner(layout.layer_ids[0], r).column == layout.column(3, 2) for r in (col.start, col.stop - 1))
    ent = entity_rows(default_pipe.config, tok, TEXT, "children of Israel")
    assert "".join(ent.pieces[ent.start : ent.end]).strip() == "children of Israel"
    assert set(ent.ngrams["position"]) == set(range(ent.start + 1, ent.end))
    assert (ent.ngrams["position"] - ent.ngrams["order"] + 1 >= ent.start).all()
    ending = entity_rows(default_pipe.config, tok, TEXT, "children of Israel", scope="ending")
    assert len(ending.ngrams) == (ending.end - ending.start) * 24 * len(layout.layer_ids)
    with pytest.raises(EditTargetError, match="not found"):
        entity_rows(default_pipe.config, tok, TEXT, "Babylon")


def test_inverse_index_equals_brute_force_and_round_trips(default_pipe, corpus_index, tmp_path):
    counts, index = corpus_index
    tok, cfg = default_pipe.tokenizer, default_pipe.config
    pad = int(tok.token_map[cfg.engram_pad_id])
    brute = collections.defaultdict(collections.Counter)
    for text in CORPUS:  # every position, every layer and slot, hashed by the torch hasher
        ids = tok.encode(text, bos=True)
        c = tok.compress(ids)
        h = hash_prompt(cfg, tok.token_map, torch.tensor([ids]))[0].numpy()
        for p in range(len(ids)):
            for li, layer in enumerate(cfg.engram_layer_ids):
                for slot in range(cfg.n_hash_cols):
                    n = slot // cfg.engram_n_heads + 2
                    ngram = tuple(int(c[p - k]) if p >= k else pad for k in range(n - 1, -1, -1))
                    brute[(layer, int(h[p, li, slot]))][ngram] += 1
    assert sum(len(li.row) for li in index.layers.values()) == len(brute)
    for (layer, row), ctr in brute.items():
        assert dict(index.members(layer, row)) == dict(ctr)
        assert bool(index.is_collision(layer, [row])[0]) == (len(ctr) >= 2)
    path = index.save(tmp_path / "index.npz")
    again = RowIndex.load(path, cfg)
    assert all(again.members(layer, row) == index.members(layer, row) for layer, row in brute)
    assert again.meta == index.meta
    small = RowIndex.build(counts, max_per_row=1)  # bounded: one member per row, counts kept whole
    for (layer, row), ctr in brute.items():
        assert len(small.members(layer, row)) == 1 and small.members(layer, row)[0][1] == max(ctr.values())
        assert int(small.n_ngrams(layer, [row])[0]) == len(ctr)
    (tmp_path / "bad.npz").write_bytes(b"not a zip")
    with pytest.raises(RowIndexError, match="unreadable"):
        RowIndex.load(tmp_path / "bad.npz", cfg)


def test_lens_interference_localisation_collateral(default_pipe, corpus_index):
    _, index = corpus_index
    pipe = default_pipe
    layer = pipe.layer_ids[0]
    row = int(_position_rows(pipe, TEXT, 9)[layer][0])
    lens = row_lens(pipe, layer, row, index)
    assert lens.owner.column == 0 and lens.n_ngrams >= 1 and len(lens.ngrams) == lens.n_ngrams
    assert len(lens.promoted) == 10 and lens.promoted["logit"].is_monotonic_decreasing
    assert lens.promoted["logit"].to_numpy()[-1] >= lens.suppressed["logit"].to_numpy()[0]
    plens = position_lens(pipe, TEXT, 9, layer)
    assert len(plens.rows) == pipe.config.n_hash_cols and abs(plens.rows["value_share"].sum() - 1) < 0.05

    heads, orders = collision_interference(pipe, [TEXT], index)
    assert len(heads) == len(orders) * pipe.config.engram_n_heads
    assert (orders.loc[orders["n_colliding"] == 0, "d_gate"] == 0).all()
    assert heads["d_gate"].max() > 0 and set(orders["n_colliding"]) <= set(range(pipe.config.engram_n_heads + 1))

    loc = entity_localisation(pipe, TEXT, "children of Israel", [OTHER])
    assert list(loc.summary["part"]) == list(PARTS)
    cont = loc.loss[loc.loss["part"] == PARTS[0]]
    assert cont["position"].tolist() == loc.entity.continuation.tolist()
    assert (loc.loss["loss_engram_off"] != loc.loss["loss"]).any()
    reads = collateral_reads(loc.effect, loc.entity.ngrams, ENTITY_PROMPT)
    own = loc.effect.reads[loc.effect.reads["prompt"] == ENTITY_PROMPT]
    assert len(reads) < len(loc.effect.reads) and len(own) >= len(loc.entity.ngrams)
    shared = collateral_ngrams(index, loc.entity.rows)
    assert set(shared["layer"]) <= set(pipe.layer_ids) and (shared["count"] > 0).all()


def test_lens_of_engram_only_layers():
    """Synthetic Engram layers (no LM head): the row lens still gives owner and n-grams; the logit
    lens and localisation say that they need a model with an LM head."""
    pipe = Pipeline(synthetic_checkpoint("tiny", 0), streams="embedding", device="cpu")
    lens = row_lens(pipe, pipe.layer_ids[0], 5)
    assert lens.owner.bucket == 5 and lens.promoted is None
    with pytest.raises(LensError, match="LM head"):
        position_lens(pipe, TEXT, 3, pipe.layer_ids[0])
    with pytest.raises(LensError, match="LM head"):
        entity_localisation(pipe, TEXT, "children of Israel", [OTHER])
