"""The page I/O calculator against hand-computed cases; ``engram-viz cache-sim`` end to end on a
small corpus (tables, figure, one line per bad input, nothing written)."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from engram_viz.analysis.caches.page_io import LAYOUTS, disk_need, disk_table, pages_per_unit
from engram_viz.apps.cache_sim_job import run_cache_sim
from engram_viz.cli import main
from engram_viz.errors import CacheSimError

pytestmark = pytest.mark.unit
pytest.importorskip("libcachesim")


def test_pages_per_token_by_hand():
    # token 0 reads rows 0, 15, 16, 511, 512; token 1 reads rows 1000, 1001
    rows = np.array([0, 15, 16, 511, 512, 1000, 1001])
    units = np.array([0, 0, 0, 0, 0, 1, 1])
    assert LAYOUTS["split"].rows_per_page == (16, 512) and LAYOUTS["packed"].rows_per_page == (15,)
    # split: weight pages {0, 0, 1, 31, 32} -> 4, scale pages {0, 0, 0, 0, 1} -> 2; token 1: {62, 62}, {1, 1}
    assert pages_per_unit(rows, units, LAYOUTS["split"]).tolist() == [6, 2]
    # packed, 15 rows a page: {0, 1, 1, 34, 34} -> 3; token 1: {66, 66} -> 1
    assert pages_per_unit(rows, units, LAYOUTS["packed"]).tolist() == [3, 1]


def test_disk_need_by_hand():
    assert disk_need(48, 1000) == (48_000, 48_000 * 4096)  # decode: 48 pages a token at 1000 tokens/s
    iops, bw = disk_need(1000, 20_000, tokens_per_unit=4096)  # prefill: 1000 pages a 4096-token step
    assert iops == pytest.approx(20_000 / 4096 * 1000) and bw == pytest.approx(iops * 4096)
    with pytest.raises(CacheSimError):
        disk_need(-1, 1000)
    pages = pd.DataFrame(
        {
            "layer": [1, 14, 1],
            "mode": ["token", "token", "chunk8"],
            "policy": "LRU",
            "cache_rows": 10,
            "layout": "packed",
            "pages_per_unit": [20.0, 22.0, 100.0],
        }
    )
    disk = disk_table(pages, decode_tokens_per_s=100, prefill_tokens_per_s=800).set_index("mode")
    assert disk.loc["token", "iops"] == 100 * 42  # the layers' pages add up
    assert disk.loc["chunk8", "iops"] == 800 / 8 * 100
    assert disk.loc["chunk8", "mb_per_s"] == pytest.approx(800 / 8 * 100 * 4096 / 1e6)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("corpus")
    path = folder / "c.txt"
    text = (
        "The Great Wall of China is long. It was built over centuries.\n\n四大发明是造纸术、指南针、火药和印刷术。\n\n"
    )
    path.write_text(text * 8, encoding="utf-8")
    (folder / "empty.txt").write_text("", encoding="utf-8")
    return folder


def test_cache_sim_writes_its_tables_and_figure(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["cache-sim", str(corpus / "c.txt"), "--out", str(out), "--config", "v41-flash", "--quiet"]
    assert (
        main([*args, "--policy", "LRU,LFU,belady", "--sizes", "16,64,4MiB", "--chunk", "16", "--io-tokens", "50"]) == 0
    )
    hit = pd.read_parquet(out / "cache_hit_rates.parquet")
    assert set(hit["policy"]) == {"LRU", "LFU", "Belady"} and sorted(set(hit["cache_rows"])) == [
        16,
        64,
        4 * 2**20 // 264,
    ]
    assert set(hit["scope"]) == {"all", "n2", "n3", "n4"} and set(hit["mode"]) == {"token", "chunk16"}
    assert (hit["cache_bytes"] == hit["cache_rows"] * 264).all()
    for _, g in hit.groupby(["layer", "scope", "mode", "cache_rows"]):
        assert g.set_index("policy")["hit_rate"].max() == g.set_index("policy").loc["Belady", "hit_rate"]
    assert (hit["hit_rate"] <= hit["best_hit_rate"] + 1e-12).all()
    warm = pd.read_parquet(out / "cache_warmup.parquet")
    assert warm.groupby(["layer", "scope", "mode", "policy", "cache_rows"])["hits"].sum().sum() == hit["hits"].sum()
    for name in ("cache_page_io", "cache_order_hits", "cache_disk", "cache_files"):
        assert (out / f"{name}.parquet").is_file() and (out / f"{name}.csv").is_file()
    assert (out / "hit_rate_vs_size.png").is_file()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["tokens"] == int(hit["tokens"].iloc[0]) and summary["row_bytes"] == 264
    assert "wrote 6 tables" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--sizes", "0"], "cache size '0'"),
        (["--sizes", "-1"], "cache size '-1'"),
        (["--sizes", "abc"], "cache size 'abc'"),
        (["--policy", "MRU"], "unknown cache policy 'MRU'"),
        (["--corpus-empty"], "gave no tokens"),
    ],
)
def test_bad_inputs_are_refused_with_one_line(corpus, tmp_path, capsys, extra, message):
    source = corpus / ("empty.txt" if extra == ["--corpus-empty"] else "c.txt")
    extra = [] if extra == ["--corpus-empty"] else extra
    out = tmp_path / "out"
    assert main(["cache-sim", str(source), "--out", str(out), "--config", "v41-flash", *extra]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("engram-viz cache-sim: error: ") and message in err[0], err
    assert not out.exists() and not list(tmp_path.iterdir())  # nothing half-written, no trace left


def test_an_empty_corpus_on_dask_is_refused_and_leaves_nothing(corpus, tmp_path):
    pytest.importorskip("dask.distributed")
    out = tmp_path / "out"
    with pytest.raises(CacheSimError, match="gave no tokens"):
        run_cache_sim([corpus / "empty.txt"], out, "v41-flash", workers=2, processes=False, progress=False)
    assert not list(tmp_path.iterdir())  # no output, no trace folder
