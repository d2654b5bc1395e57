"""The analyses the notebooks tell their stories with (``engram_viz.analysis``): stream selectivity,
a trace's n-grams (windows table, corpus frequency), text after an image as a fresh start, and
the capped corpus sample."""

from __future__ import annotations

import pandas as pd
import pytest

from engram_viz.analysis.corpus.corpus_sample import corpus_sample
from engram_viz.analysis.corpus.counting import count_corpus
from engram_viz.analysis.gates.image_boundary import after_image_vs_fresh_start
from engram_viz.analysis.gates.summary import stream_selectivity
from engram_viz.analysis.row_stats.trace_ngrams import ngram_frequency, ngram_windows_table


def test_corpus_sample_is_capped_per_file():
    stats, description = corpus_sample("tiny", tokens_per_file=2_000)
    assert stats.tokens <= 2_000 * len(stats.files)
    assert stats.counts.n_positions == stats.tokens
    assert "corpus" in description


def test_stream_selectivity_ranks_every_layer_and_stream(trace):
    sel = stream_selectivity(trace.to_frame("gates"))
    n = len(trace.layer_ids) * int(trace.meta["hc_mult"])
    assert len(sel) == n and list(sel["rank"]) == list(range(1, n + 1))
    assert sel["auc"].between(0, 1).all() and sel["auc"].is_monotonic_decreasing
    with pytest.raises(ValueError, match="random_token"):
        stream_selectivity(trace.to_frame("gates"), controls=("nothing",))


def test_stream_selectivity_auc_by_hand():
    rows = []
    for cat, values in (("idioms", [0.9, 0.8, 0.1]), ("random_token", [0.2, 0.3])):
        for i, v in enumerate(values):
            rows.append(
                {"prompt": cat, "category": cat, "position": i, "is_image": False, "layer": 1, "stream": 0, "gate": v}
            )
    sel = stream_selectivity(pd.DataFrame(rows))
    # pairs (pattern > control): 0.9 > both, 0.8 > both, 0.1 > none -> 4 of 6
    assert sel["auc"].iloc[0] == pytest.approx(4 / 6)


def test_ngram_windows_block_at_the_start_and_across_images(pipe, trace):
    table = ngram_windows_table(trace, pipe.config, "caption")
    assert (table.loc[0, ["2-gram", "3-gram", "4-gram"]] == "BLOCKED").all()
    assert table.loc[3, "4-gram"] != "BLOCKED"
    image = table.index[table["is_image"]]
    after = image.max() + 1
    assert (table.loc[after, ["2-gram", "3-gram", "4-gram"]] == "BLOCKED").all()
    assert table.loc[after + 1, "2-gram"] != "BLOCKED" and table.loc[after + 1, "3-gram"] == "BLOCKED"
    assert table.loc[after + 3, "4-gram"] != "BLOCKED"


def test_text_after_an_image_hashes_as_a_fresh_sequence(pipe):
    check = after_image_vs_fresh_start(pipe, " It stretches across the sky.")
    assert len(check) >= 5 and check["same_token"].all() and check["equal_rows"].all()
    assert check.loc[0, "orders_reaching_image"] == [2, 3, 4] and check.loc[3, "orders_reaching_image"] == []


def test_ngram_frequency_counts_the_ngram_ending_at_each_position(pipe, tmp_path):
    text = "the horse ran across the field"
    (tmp_path / "c.txt").write_text(f"{text}\n\n{text}\n", encoding="utf-8")
    counts = count_corpus([tmp_path / "c.txt"], pipe.config, pipe.tokenizer, progress=False).counts
    trace = pipe.run([{"id": "same", "text": text}, {"id": "img", "text": f"<image:2x2>{text}"}])
    freq = ngram_frequency(trace, counts, order=3)
    same = freq[freq["prompt"] == "same"].set_index("position")["ngram_count"]
    assert (same.loc[:1] == -1).all()  # reaches before the start
    assert (same.loc[2:] == 2).all()  # every 3-gram of the text occurs once per document
    img = freq[freq["prompt"] == "img"].set_index("position")["ngram_count"]
    first_text = int(trace.is_image[1].nonzero().max()) + 1
    assert (img.loc[: first_text + 1] == -1).all() and (img.loc[first_text + 2 :] >= 0).all()
    with pytest.raises(ValueError, match="order"):
        ngram_frequency(trace, counts, order=7)


def test_stream_selectivity_by_a_label_column():
    rows = [
        {
            "prompt": "p",
            "category": "x",
            "position": i,
            "is_image": False,
            "layer": 1,
            "stream": 0,
            "gate": g,
            "flag": f,
        }
        for i, (g, f) in enumerate([(0.9, True), (0.8, True), (0.1, False), (0.5, None)])
    ]
    sel = stream_selectivity(pd.DataFrame(rows), label="flag")
    assert sel["auc"].iloc[0] == 1.0 and sel["pattern_positions"].iloc[0] == 2 and sel["control_positions"].iloc[0] == 1
    with pytest.raises(ValueError, match="no column"):
        stream_selectivity(pd.DataFrame(rows), label="missing")
