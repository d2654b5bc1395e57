"""engram_viz.apps.notebook: the helpers the notebooks share (weights from the environment, provenance,
display with a static fallback, the capped corpus sample, the small analyses, checked export)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest

from engram_viz.apps import notebook as nb


@pytest.fixture(scope="module")
def pipe():
    return nb.load_pipeline()


@pytest.fixture(scope="module")
def trace(pipe):
    return pipe.run(
        [
            {"id": "caption", "category": "image", "text": "Here is the Milky Way: <image:6x3> It stretches across."},
            {"id": "en", "category": "english_entities", "text": "Only Alexander the Great could tame the horse."},
            {"id": "zh", "category": "chinese_entities", "text": "万里长城东起山海关，西至嘉峪关。"},
            {"id": "rnd", "category": "random_token", "seed": 3, "length": 40},
        ]
    )


def test_load_pipeline_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(nb.ENV_CHECKPOINT, str(tmp_path / "missing"))
    with pytest.raises(FileNotFoundError, match="missing"):
        nb.load_pipeline()


def test_provenance_says_model_streams_and_synthetic(pipe, trace):
    box = nb.provenance(trace)
    html = box._repr_html_()
    assert trace.model_label.split(" at ")[0] in html and "Residual streams" in html
    assert ("Synthetic weights" in html) == ("SYNTHETIC" in trace.model_label)
    assert "model and weights:" in repr(nb.provenance(pipe))
    layout = nb.layout_provenance("v41-flash", "60,000 tokens")
    assert "no weights" in layout._repr_html_() and "v41-flash" in repr(layout)


def test_short_label_drops_the_folder():
    assert (
        nb.short_label("SYNTHETIC tiny checkpoint (seed 0) at /root/.cache/x/y") == "SYNTHETIC tiny checkpoint (seed 0)"
    )
    assert nb.short_label("tiny Engram LM") == "tiny Engram LM"


def test_stamp_and_show_carry_the_label_and_a_png(trace):
    from engram_viz.viz import gate_heatmap, gate_heatmap_interactive, token_view

    gates = trace.to_frame("gates")
    fig = nb.stamp(gate_heatmap(gates, "en"), trace.model_label)
    assert any(nb.short_label(trace.model_label) == t.get_text() for t in fig.texts)
    view = nb.stamp(token_view(gates, "en", title="t"), "model X at /some/where")
    assert view.title == "t \u2014 model X"
    inter = nb.stamp(gate_heatmap_interactive(gates, "en"), trace.model_label)
    assert inter.layout.title.subtitle.text
    bundle = nb.show(inter, fig)._repr_mimebundle_()
    assert "application/vnd.plotly.v1+json" in bundle
    assert base64.b64decode(bundle["image/png"]).startswith(b"\x89PNG")
    json.dumps(bundle)  # what a kernel sends must be JSON
    assert "<script" not in json.dumps(bundle)
    with pytest.raises(TypeError, match="cannot stamp"):
        nb.stamp(object(), "x")


def test_figures_dir_and_corpus_tokens_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(nb.ENV_FIGURES, str(tmp_path / "f"))
    assert nb.figures_dir() == tmp_path / "f" and (tmp_path / "f").is_dir()
    monkeypatch.setenv(nb.ENV_CORPUS_TOKENS, "1234")
    assert nb.corpus_tokens() == 1234
    for bad in ("lots", "0"):
        monkeypatch.setenv(nb.ENV_CORPUS_TOKENS, bad)
        with pytest.raises(ValueError, match="positive integer"):
            nb.corpus_tokens()


def test_corpus_sample_is_capped_per_file():
    stats, description = nb.corpus_sample("tiny", tokens_per_file=2_000)
    assert stats.tokens <= 2_000 * len(stats.files)
    assert stats.counts.n_positions == stats.tokens
    assert "corpus" in description


def test_stream_selectivity_ranks_every_layer_and_stream(trace):
    sel = nb.stream_selectivity(trace.to_frame("gates"))
    n = len(trace.layer_ids) * int(trace.meta["hc_mult"])
    assert len(sel) == n and list(sel["rank"]) == list(range(1, n + 1))
    assert sel["auc"].between(0, 1).all() and sel["auc"].is_monotonic_decreasing
    with pytest.raises(ValueError, match="random_token"):
        nb.stream_selectivity(trace.to_frame("gates"), controls=("nothing",))


def test_stream_selectivity_auc_by_hand():
    rows = []
    for cat, values in (("idioms", [0.9, 0.8, 0.1]), ("random_token", [0.2, 0.3])):
        for i, v in enumerate(values):
            rows.append({"prompt": cat, "category": cat, "position": i, "is_image": False, "layer": 1, "stream": 0,
                         "gate": v})  # fmt: skip
    sel = nb.stream_selectivity(pd.DataFrame(rows))
    # pairs (pattern > control): 0.9 > both, 0.8 > both, 0.1 > none -> 4 of 6
    assert sel["auc"].iloc[0] == pytest.approx(4 / 6)


def test_ngram_windows_block_at_the_start_and_across_images(trace):
    table = nb.ngram_windows_table(trace, "caption")
    assert (table.loc[0, ["2-gram", "3-gram", "4-gram"]] == "BLOCKED").all()
    assert table.loc[3, "4-gram"] != "BLOCKED"
    image = table.index[table["is_image"]]
    after = image.max() + 1
    assert (table.loc[after, ["2-gram", "3-gram", "4-gram"]] == "BLOCKED").all()
    assert table.loc[after + 1, "2-gram"] != "BLOCKED" and table.loc[after + 1, "3-gram"] == "BLOCKED"
    assert table.loc[after + 3, "4-gram"] != "BLOCKED"


def test_text_after_an_image_hashes_as_a_fresh_sequence(pipe):
    check = nb.after_image_vs_fresh_start(pipe, " It stretches across the sky.")
    assert len(check) >= 5 and check["same_token"].all() and check["equal_rows"].all()
    assert check.loc[0, "orders_reaching_image"] == [2, 3, 4] and check.loc[3, "orders_reaching_image"] == []


def test_export_figures_writes_checked_files(tmp_path, trace):
    from engram_viz.viz import gate_heatmap, token_view

    gates = trace.to_frame("gates")
    files = nb.export_figures(
        {"heat": gate_heatmap(gates, "en"), "tokens": token_view(gates, ["en", "zh"])}, tmp_path, dpi=80
    )
    assert set(files["format"]) == {"pdf", "svg", "png", "html"}
    assert (files["check"] == "ok").all() and (files["bytes"] > 0).all()
    (tmp_path / "broken.pdf").write_bytes(b"not a pdf")
    (tmp_path / "broken.svg").write_text("<svg")
    (tmp_path / "remote.html").write_text('<script src="https://cdn.example/x.js"></script>')
    assert nb.check_file(tmp_path / "broken.pdf") != "ok"
    assert nb.check_file(tmp_path / "broken.svg").startswith("SVG does not parse")
    assert "network" in nb.check_file(tmp_path / "remote.html")
    assert np.all(files["path"].map(lambda p: str(p).startswith(str(tmp_path))))


def test_ngram_frequency_counts_the_ngram_ending_at_each_position(pipe, tmp_path):
    from engram_viz.analysis.corpus import count_corpus

    text = "the horse ran across the field"
    (tmp_path / "c.txt").write_text(f"{text}\n\n{text}\n", encoding="utf-8")
    counts = count_corpus([tmp_path / "c.txt"], pipe.config, pipe.tokenizer, progress=False).counts
    trace = pipe.run([{"id": "same", "text": text}, {"id": "img", "text": f"<image:2x2>{text}"}])
    freq = nb.ngram_frequency(trace, counts, order=3)
    same = freq[freq["prompt"] == "same"].set_index("position")["ngram_count"]
    assert (same.loc[:1] == -1).all()  # reaches before the start
    assert (same.loc[2:] == 2).all()  # every 3-gram of the text occurs once per document
    img = freq[freq["prompt"] == "img"].set_index("position")["ngram_count"]
    first_text = int(trace.is_image[1].nonzero().max()) + 1
    assert (img.loc[: first_text + 1] == -1).all() and (img.loc[first_text + 2 :] >= 0).all()
    with pytest.raises(ValueError, match="order"):
        nb.ngram_frequency(trace, counts, order=7)


def test_stream_selectivity_by_a_label_column():
    rows = [{"prompt": "p", "category": "x", "position": i, "is_image": False, "layer": 1, "stream": 0,
             "gate": g, "flag": f} for i, (g, f) in enumerate([(0.9, True), (0.8, True), (0.1, False), (0.5, None)])]  # fmt: skip
    sel = nb.stream_selectivity(pd.DataFrame(rows), label="flag")
    assert sel["auc"].iloc[0] == 1.0 and sel["pattern_positions"].iloc[0] == 2 and sel["control_positions"].iloc[0] == 1
    with pytest.raises(ValueError, match="no column"):
        nb.stream_selectivity(pd.DataFrame(rows), label="missing")
