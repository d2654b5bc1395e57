"""Engram rows read from the Hub by byte ranges (``weights.remote_rows``), against a real HTTP server on
127.0.0.1 (``hub_kit.HubServer``) serving a synthetic checkpoint: the rows equal the folder's bit for bit,
only the planned ranges are asked for, the row cache on disk survives a restart and keeps its bound,
a report reads kilobytes of rows instead of the tables with the folder's gates, and a server that
drops connections or changes a file under the same revision is one clear line with nothing kept."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hub_kit import COMMIT, HubServer, Repo, use_hub

from engram_viz.errors import HubError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts, prompt_set_path
from engram_viz.weights import hub_ranges
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.row_store import SUFFIX, store_root
from engram_viz.weights.synthetic import write_synthetic_checkpoint

pytestmark = pytest.mark.integration

REPO = "test/rows"
TABLE_SHARD = "model-00003-of-00003.safetensors"  # holds the last Engram layer's table and nothing else


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("rows") / "ckpt", "tiny", seed=5)


@pytest.fixture
def served(folder, tmp_path):
    """A copy of the checkpoint that a test may change under the same commit."""
    return Path(shutil.copytree(folder, tmp_path / "served"))


@pytest.fixture
def hub(served, tmp_path, monkeypatch):
    with HubServer({REPO: Repo(served)}) as server:
        use_hub(server, monkeypatch, tmp_path)
        monkeypatch.setattr(hub_ranges, "BACKOFF_S", 0.01)  # the retries' schedule, not their count, shortened
        yield server


def _ids(num_rows: int, n: int, seed: int) -> torch.Tensor:
    return torch.from_numpy(np.random.default_rng(seed).integers(0, num_rows, size=n))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.uint8)


def _rows_on_disk() -> list[Path]:
    return sorted(store_root().glob(f"*/*{SUFFIX}"))


def test_remote_rows_equal_the_folder_bit_for_bit_with_the_planned_ranges_only(hub, folder):
    remote, local = open_checkpoint(f"hf://{REPO}"), open_checkpoint(folder)
    for layer_id, rows in zip(local.config.engram_layer_ids, local.config.engram_num_embeddings):
        table = remote.layer(layer_id).table
        ids = _ids(rows, 3000, layer_id)
        uniq = np.unique(ids.numpy())
        planned = table.weight.plan(uniq) + table.scale.plan(uniq)
        before = len(hub.ranges(REPO))
        for mine, theirs in zip(table.gather_fp8(ids), local.layer(layer_id).table.gather_fp8(ids)):
            assert torch.equal(_bytes(mine), _bytes(theirs))
        asked = hub.ranges(REPO)[before:]
        assert sorted(r.span for r in asked) == sorted(planned)  # each planned range once, nothing else
        assert all(r.status == 206 for r in asked)
        assert sum(r.sent for r in asked) == sum(b - a for a, b in planned)
    tokens = _ids(local.config.vocab_size, 500, 0)
    assert torch.equal(_bytes(remote.embed.rows(tokens)), _bytes(local.embed.rows(tokens)))

    # the same rows again come from the row cache: no request
    before = len(hub.ranges(REPO))
    last = local.config.engram_layer_ids[-1]
    remote.layer(last).table.gather_fp8(_ids(local.config.engram_num_embeddings[-1], 3000, last))
    assert len(hub.ranges(REPO)) == before
    assert remote.remote_reads is not None and local.remote_reads is None
    table = remote.remote_reads.summary()["tensors"][f"layers.{last}.engram.embed.weight"]
    assert table["rows_cached"] == table["rows_remote"] > 0


RUN = """
import json, sys
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.prompts import load_prompts, prompt_set_path
pipe = Pipeline(sys.argv[1], streams="embedding")
pipe.run(load_prompts(prompt_set_path("default")))
print(json.dumps(pipe.checkpoint.remote_reads.summary()))
"""


def test_a_run_reads_rows_not_tables_gates_equal_the_folder_and_the_row_cache_survives_a_restart(hub, folder, capsys):
    prompts = load_prompts(prompt_set_path("default"))
    pipe = Pipeline(f"hf://{REPO}", streams="embedding")
    gates = pipe.run(prompts).to_frame("gates")["gate"].tolist()
    from_disk = Pipeline(folder, streams="embedding").run(prompts).to_frame("gates")["gate"].tolist()
    assert gates == from_disk
    reads = pipe.checkpoint.remote_reads.summary()
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    headers = sum(8 + int.from_bytes((folder / s).read_bytes()[:8], "little") for s in set(weight_map.values()))
    assert reads["total"]["bytes_remote"] + headers == sum(r.sent for r in hub.ranges(REPO))  # every byte counted
    tables = {n: c for n, c in reads["tensors"].items() if n.endswith("engram.embed.weight")}
    assert all(c["rows_remote"] > 0 for c in tables.values()) and len(tables) == len(pipe.config.engram_layer_ids)
    with capsys.disabled():
        n, mb = sum(c["rows_remote"] for c in tables.values()), reads["total"]["bytes_remote"] / 1e6
        print(f"\ndefault prompts from the loopback Hub: {n:,} table rows; {mb:.2f} MB read in all")

    # a restart: a new process takes every row from the row cache, with no range request at all
    before = len(hub.ranges(REPO))
    done = subprocess.run([sys.executable, "-c", RUN, f"hf://{REPO}"], check=True, capture_output=True, text=True)
    again = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(hub.ranges(REPO)) == before
    assert again["total"]["rows_remote"] == 0
    assert again["total"]["rows_cached"] == reads["total"]["rows_remote"] + reads["total"]["rows_cached"]


def test_a_damaged_row_file_is_read_again_and_the_bound_is_kept(hub, folder, monkeypatch):
    remote, local = open_checkpoint(f"hf://{REPO}"), open_checkpoint(folder)
    layer = local.config.engram_layer_ids[0]
    ids = _ids(local.config.engram_num_embeddings[0], 2000, 1)
    remote.layer(layer).table.gather_fp8(ids)
    damaged = max(_rows_on_disk(), key=lambda p: p.stat().st_size)
    damaged.write_bytes(damaged.read_bytes()[:-8] + b"\0" * 8)  # its sidecar no longer vouches for it
    before = len(hub.ranges(REPO))
    again = open_checkpoint(f"hf://{REPO}").layer(layer).table.gather_fp8(ids)
    assert len(hub.ranges(REPO)) > before  # those rows came from the Hub again
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(again, local.layer(layer).table.gather_fp8(ids)))

    monkeypatch.setenv("ENGRAM_VIZ_ROW_CACHE_MB", "0.05")
    bounded = open_checkpoint(f"hf://{REPO}").layer(local.config.engram_layer_ids[-1]).table
    for seed in range(3):
        bounded.gather_fp8(_ids(local.config.engram_num_embeddings[-1], 1000, 10 + seed))
        assert sum(p.stat().st_size for p in _rows_on_disk()) <= 0.05 * 2**20


def test_a_server_that_drops_connections_is_retried_then_refused_keeping_nothing(hub, folder):
    remote = open_checkpoint(f"hf://{REPO}")
    table = remote.layer(remote.config.engram_layer_ids[-1]).table
    kept = _rows_on_disk()
    hub.repos[REPO].drop[TABLE_SHARD] = "once"
    ids = _ids(table.num_rows, 200, 7)
    local = open_checkpoint(folder).layer(remote.config.engram_layer_ids[-1]).table
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(table.gather_fp8(ids), local.gather_fp8(ids)))
    assert [r.status for r in hub.ranges(REPO, TABLE_SHARD)].count(-1) == 1  # broken off once, then retried

    kept = _rows_on_disk()
    hub.repos[REPO].drop[TABLE_SHARD] = "always"
    before = len(hub.ranges(REPO, TABLE_SHARD))
    with pytest.raises(HubError) as err:
        table.gather_fp8(_ids(table.num_rows, 50, 8))
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(f"hf://{REPO}@{COMMIT[:12]}/{TABLE_SHARD}: bytes ")
    assert f"could not be read after {hub_ranges.TRIES} tries (RemoteProtocolError" in message
    asked = hub.ranges(REPO, TABLE_SHARD)[before:]
    assert len(asked) % hub_ranges.TRIES == 0 and all(r.status == -1 for r in asked)
    assert _rows_on_disk() == kept and not list(store_root().rglob("*.tmp"))


def test_a_file_changed_under_the_same_revision_is_refused(hub, folder, served, monkeypatch):
    remote = open_checkpoint(f"hf://{REPO}")
    table = remote.layer(remote.config.engram_layer_ids[-1]).table
    first = _ids(table.num_rows, 100, 3)
    before_change = table.gather_fp8(first)
    shard = served / TABLE_SHARD
    data = bytearray(shard.read_bytes())
    data[-64:] = bytes(64)  # the last rows' bytes change; the commit does not
    shard.write_bytes(bytes(data))
    with pytest.raises(HubError, match=rf"^hf://{REPO}@{COMMIT[:12]}/{TABLE_SHARD} changed under revision .*refused"):
        table.gather_fp8(_ids(table.num_rows, 100, 4))
    kept = table.gather_fp8(first)  # rows read before the change still come from the row cache
    assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(kept, before_change))

    monkeypatch.setenv("ENGRAM_VIZ_OFFLINE", "1")
    with pytest.raises(HubError, match=r"rows .* are not in the row cache, and --offline"):
        table.gather_fp8(_ids(table.num_rows, 100, 5))


def test_rows_come_from_the_storage_the_hub_redirects_to_and_the_token_stays_with_the_hub(
    folder, tmp_path, monkeypatch
):
    with HubServer({"test/stored": Repo(folder, storage=True)}) as hub:
        use_hub(hub, monkeypatch, tmp_path)
        monkeypatch.setenv("HF_TOKEN", "hf_for_the_hub_only")
        monkeypatch.setattr(hub_ranges, "BACKOFF_S", 0.01)
        remote, local = open_checkpoint("hf://test/stored"), open_checkpoint(folder)
        last = local.config.engram_layer_ids[-1]
        hub.expire.add(("test/stored", TABLE_SHARD))  # the first signed URL has expired by the first row read
        ids = _ids(local.config.engram_num_embeddings[-1], 500, 9)
        mine, theirs = remote.layer(last).table.gather_fp8(ids), local.layer(last).table.gather_fp8(ids)
        assert all(torch.equal(_bytes(a), _bytes(b)) for a, b in zip(mine, theirs))
        ranges = hub.ranges("test/stored")
        assert ranges and all(r.storage and not r.auth for r in ranges)  # every byte range from storage, no token
        hub_side = [r for r in hub.log if not r.storage and r.file.endswith(".safetensors")]
        assert hub_side and all(r.method == "HEAD" and r.status == 302 and r.auth for r in hub_side)
        assert [r.status for r in hub.log if r.file == TABLE_SHARD and r.status == 403] == [403]
        assert sum(r.file == TABLE_SHARD for r in hub_side) == 2  # pinned once, asked again after the 403
