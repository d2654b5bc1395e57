"""Gate versus memory (engram_viz.analysis.gates.gate_memory): training counts per position, groups,
the per-layer summary, the binned curve with its Spearman, and the issue's target checks."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pandas as pd
import pytest
import torch

from engram_viz._cache import checksum_path
from engram_viz.analysis.corpus.ngram_counts import NgramCounts
from engram_viz.analysis.gates import gate_memory as GM
from engram_viz.analysis.gates.gate_memory import (
    count_bin,
    gate_count_curve,
    gate_memory_summary,
    memory_group,
    memory_targets,
    read_counts,
    sequence_counts,
    spearman,
    training_recipe,
)
from engram_viz.config import load_config
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import EngramVizError
from engram_viz.tiny.data import batch_offsets


def test_sequence_counts_reads_the_trigram_ending_at_each_position():
    counts = NgramCounts("tiny")
    counts.add_compressed(np.array([5, 6, 7, 5, 6, 7, 5, 6, 8]))  # one training sequence
    got = sequence_counts(np.array([5, 6, 7, 9]), np.ones(4, bool), counts, order=3)
    assert got.tolist() == [-1, -1, 2, 0]  # blocked, blocked, (5,6,7) seen twice, (6,7,9) never
    assert sequence_counts(np.array([5, 6, 7]), np.ones(3, bool), counts, order=2).tolist() == [-1, 3, 2]
    masked = sequence_counts(np.array([5, 6, -1]), np.array([True, True, False]), counts, order=2)
    assert masked.tolist() == [-1, 3, -1]  # an image position counts nothing
    with pytest.raises(ValueError, match="order"):
        sequence_counts(np.array([5]), np.ones(1, bool), counts, order=5)


def test_groups_bins_and_spearman():
    g = memory_group(np.array([25, 20, 19, 1, 0, -1, 30]), np.array(["a"] * 6 + ["random_token"]))
    assert g.tolist() == ["often", "often", "seldom", "seldom", "never", "blocked", "random"]
    assert count_bin(np.array([0, 1, 3, 7, 20, 500, 5000])).tolist() == [
        "0",
        "1",
        "2-4",
        "5-19",
        "20-99",
        "100-999",
        ">=1000",
    ]
    assert spearman(np.arange(10), np.arange(10) ** 3) == pytest.approx(1.0)
    assert spearman(np.arange(10), -np.arange(10.0)) == pytest.approx(-1.0)
    assert np.isnan(spearman(np.arange(2), np.arange(2)))


def _frame() -> pd.DataFrame:
    """Layer 1: gate rises with the count; layer 3: flat, random controls highest."""
    rng = np.random.default_rng(0)
    rows = []
    for layer in (1, 3):
        for count in (0, 1, 5, 30, 300):
            gate = 0.4 + 0.1 * np.log10(1 + count) if layer == 1 else 0.5
            rows += [
                {"layer": layer, "count": count, "category": "x", "gate": gate + e} for e in rng.normal(0, 0.01, 20)
            ]
        rows += [{"layer": layer, "count": 0, "category": "random_token", "gate": 0.3 if layer == 1 else 0.7}] * 20
    f = pd.DataFrame(rows)
    f["loss_saved"] = f["count"] / 100
    f["group"] = memory_group(f["count"].to_numpy(), f["category"].to_numpy())
    return f


def test_summary_curve_and_targets():
    f = _frame()
    summary = gate_memory_summary(f)
    assert summary[summary.layer == 1]["group"].astype(str).tolist() == ["often", "seldom", "never", "random"]
    often = summary[(summary.layer == 1) & (summary.group == "often")].iloc[0]
    assert often.n == 40 and often.loss_saved == pytest.approx(1.65)
    curve, rho = gate_count_curve(f)
    assert curve[curve.layer == 1]["count_bin"].astype(str).tolist() == ["0", "1", "5-19", "20-99", "100-999"]
    assert rho[1] > 0.9 and abs(rho[3]) < 0.5
    assert list(curve["count_bin"].cat.categories) == ["0", "1", "5-19", "20-99", "100-999"]  # empty bins off
    for r in curve.itertuples():  # the interval against numpy, bin by bin
        g = f[(f.layer == r.layer) & f.group.isin(["often", "seldom", "never"])]
        g = g[count_bin(g["count"].to_numpy()) == r.count_bin]["gate"].to_numpy()
        half = 1.96 * g.std(ddof=1) / np.sqrt(len(g))
        assert r.n == len(g) and (r.ci_low, r.ci_high) == pytest.approx((g.mean() - half, g.mean() + half))
    targets = memory_targets(summary, rho).set_index("layer")
    assert bool(targets.loc[1, "met"]) and not bool(targets.loc[3, "met"])
    assert targets.loc[1, "often_minus_random"] == pytest.approx(often.mean_gate - 0.3)
    assert bool(targets.loc[3, "random_highest"]) and not bool(targets.loc[1, "random_highest"])


def test_read_counts_counts_exactly_the_windows_the_recipe_reads():
    """Independent check: each batch window's input part, from position 0, counted in Python."""
    config = load_config("tiny")
    token_map = get_tokenizer(config).token_map
    train = torch.from_numpy(np.random.default_rng(0).integers(3, 40, 400))  # few ids: n-grams repeat
    recipe = {"seed": 3, "steps": 5, "batch": 4, "seq_len": 16}
    want = Counter()
    for start in batch_offsets(len(train), 16, 4, 5, 3).reshape(-1).tolist():
        seq = token_map[train[start : start + 16].numpy()].tolist()  # the last token of a window is a target only
        want.update(tuple(seq[i - 2 : i + 1]) for i in range(2, len(seq)))
    counts = read_counts(config, train, recipe)
    trigrams = {k: v for k, v in counts.as_dict().items() if len(k) == 3 and config.engram_pad_id not in k}
    assert trigrams == dict(want)
    assert counts.n_positions == 5 * 4 * 16
    assert read_counts(config, train, recipe | {"steps": 1}).n_positions == 4 * 16


def test_training_recipe_names_the_folder_when_the_section_is_missing():
    good = {"seed": 1, "settings": {"steps": 2, "batch": 3, "seq_len": 4}, "corpus": {"sources": ["kjv"]}}
    assert training_recipe(good, "x") == {"sources": ["kjv"], "seed": 1, "steps": 2, "batch": 3, "seq_len": 4}
    with pytest.raises(EngramVizError, match="some/folder.*training"):
        training_recipe(None, "some/folder")
    with pytest.raises(EngramVizError, match="seq_len"):
        training_recipe(good | {"settings": {"steps": 2, "batch": 3}}, "f")


def test_training_counts_are_cached_with_a_sidecar_and_rebuilt_when_tampered(tmp_path, monkeypatch):
    """The cache entry goes through _cache: written with its sha256 sidecar, reused while they
    agree, rebuilt (not trusted) once the file is edited."""
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path))
    config = load_config("tiny")
    train = torch.from_numpy(np.random.default_rng(1).integers(3, 40, 400))
    built = []

    class _Corpus:
        pass

    def fake_corpus(cfg, sources):
        built.append(sources)
        corpus = _Corpus()
        corpus.train = train
        return corpus

    monkeypatch.setattr(GM, "build_corpus", fake_corpus)
    training = {"seed": 3, "settings": {"steps": 5, "batch": 4, "seq_len": 16}, "corpus": {"sources": ["kjv"]}}
    first = GM.training_counts(config, training)
    (path,) = tmp_path.glob("tiny-read-counts-*.npz")
    assert checksum_path(path).is_file() and len(built) == 1
    assert GM.training_counts(config, training) == first and len(built) == 1  # reused, not rebuilt
    path.write_bytes(path.read_bytes()[:-7] + b"garbage")
    assert GM.training_counts(config, training) == first and len(built) == 2  # tampered: rebuilt
    assert GM.training_counts(config, training) == first and len(built) == 2
