"""Checkpoints from the Hub (``hf://owner/repo``) against a real HTTP server on 127.0.0.1 that speaks
the Hub's download API (``hub_kit.HubServer``) over a synthetic checkpoint folder: only the planned
files are fetched (the Engram shards never whole: their rows by byte ranges, ``test_remote_rows.py``),
the Hub cache and the row cache are honoured, offline uses the caches alone, the results equal the
same folder opened from disk, and a missing, gated or broken repository is one clear line."""

from __future__ import annotations

import json
import socket

import blocks_kit
import pytest
import torch
from block0_kit import SMALL
from hub_kit import COMMIT, HubServer, Repo, use_hub

from engram_viz.cli import main
from engram_viz.core.schema import EMBED_NAME, is_engram_path_name
from engram_viz.errors import HubError
from engram_viz.run.pipeline import Pipeline
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.hub import HubRef, parse_hub_ref, shards_needed
from engram_viz.weights.index import INDEX_FILE, read_json
from engram_viz.weights.resolve import weights_config
from engram_viz.weights.synthetic import write_synthetic_checkpoint

pytestmark = pytest.mark.integration

PROMPTS = ["Alexander the Great was a king of Macedon.", "四大发明"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A synthetic tiny checkpoint with block 0: 3 Engram shards and the block-0 shard."""
    return write_synthetic_checkpoint(tmp_path_factory.mktemp("hub") / "ckpt", "tiny", seed=3, block0=SMALL)


@pytest.fixture
def hub(folder, tmp_path, monkeypatch):
    repos = {
        "test/ckpt": Repo(folder),
        "test/gated": Repo(folder, gated=True),
        "test/broken": Repo(folder, drop={_engram_shards(folder)[-1]: "always"}),
        "test/flaky": Repo(folder, drop={_engram_shards(folder)[-1]: "once"}),
    }
    with HubServer(repos) as server:
        use_hub(server, monkeypatch, tmp_path)
        yield server


def _engram_shards(folder) -> list[str]:
    """The shards holding the Engram-path tensors (read by rows, never downloaded whole)."""
    weight_map = read_json(folder / INDEX_FILE, "index file")["weight_map"]
    return sorted({shard for name, shard in weight_map.items() if is_engram_path_name(name)})


def _all_shards(folder) -> set[str]:
    return set(read_json(folder / INDEX_FILE, "index file")["weight_map"].values())


def _same_rows(a, b, ids) -> bool:
    """The fp8 rows and their e8m0 scales of two tables, bit for bit."""
    return all(
        torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(a.gather_fp8(ids), b.gather_fp8(ids))
    )


def test_hub_refs_parse_and_bad_ones_are_refused():
    assert parse_hub_ref("hf://deepseek-ai/DeepSeek-V4.1-Flash") == HubRef("deepseek-ai/DeepSeek-V4.1-Flash")
    assert parse_hub_ref("hf://a/b@v1.0") == HubRef("a/b", "v1.0")
    for bad in ("hf://", "hf://noslash", "hf://a/b/c", "hf://a/b@", "hf://../x", "hf://a/.."):
        with pytest.raises(HubError, match="expected hf://owner/repo"):
            parse_hub_ref(bad)


def test_open_checkpoint_downloads_no_shard_and_equals_the_folder(hub, folder):
    ckpt = open_checkpoint("hf://test/ckpt")
    engram = _engram_shards(folder)
    assert _all_shards(folder) - set(engram), "the fixture must hold a shard the Engram layers do not read"
    fetched = [r.file for r in hub.log if r.repo == "test/ckpt" and r.method == "GET" and r.span is None]
    assert sorted(fetched) == sorted([INDEX_FILE, "config.json", "tokenizer.json", "SYNTHETIC.json"])
    assert {r.file for r in hub.ranges("test/ckpt")} == set(engram)  # headers and the small tensors, by ranges
    assert ckpt.label.startswith(
        f"SYNTHETIC tiny checkpoint (seed 3; random weights, not trained) at hf://test/ckpt@{COMMIT[:12]}"
    )

    local = open_checkpoint(folder)
    ids = torch.arange(0, local.config.engram_num_embeddings[0], 97)
    for layer_id in local.config.engram_layer_ids:
        mine, theirs = ckpt.layer(layer_id), local.layer(layer_id)
        assert torch.equal(mine.wkv_weight.view(torch.uint8), theirs.wkv_weight.view(torch.uint8))
        assert torch.equal(mine.q_weight, theirs.q_weight) and torch.equal(mine.k_weight, theirs.k_weight)
        assert _same_rows(mine.table, theirs.table, ids)

    # the Hub cache and the row cache are honoured: a second open sends no file and no byte again
    sent = hub.downloads("test/ckpt")
    open_checkpoint("hf://test/ckpt")
    assert hub.downloads("test/ckpt") == sent


def test_config_and_inspect_read_what_they_need(hub, folder, capsys):
    assert weights_config("hf://test/ckpt") == open_checkpoint(folder).config
    assert hub.downloads("test/ckpt") == ["config.json"]  # the config alone, no shard
    assert main(["inspect", "hf://test/ckpt"]) == 0
    assert "every dtype and shape as expected" in capsys.readouterr().out
    assert main(["inspect", "hf://test/ckpt", "--verify"]) == 2  # every byte by ranges: refused, one line
    err = capsys.readouterr().err
    assert "--verify reads every byte of the Engram tensors" in err and err.count("\n") == 1


def test_block0_streams_fetch_block0_too_and_gates_equal_the_folder(hub, folder):
    from_hub = Pipeline("hf://test/ckpt", streams="block0").run(PROMPTS).to_frame("gates")
    weight_map = read_json(folder / INDEX_FILE, "index file")["weight_map"]
    whole = {r.file for r in hub.log if r.repo == "test/ckpt" and r.method == "GET" and r.span is None}
    block0 = {shard for name, shard in weight_map.items() if name.startswith("layers.0.") or name == EMBED_NAME}
    assert whole & _all_shards(folder) == block0 == set(shards_needed(weight_map, [0]))
    from_disk = Pipeline(folder, streams="block0").run(PROMPTS).to_frame("gates")
    assert from_hub["gate"].tolist() == from_disk["gate"].tolist()


def test_model_streams_fetch_the_blocks_before_the_last_engram_layer_and_equal_the_folder(tmp_path, monkeypatch):
    """streams="model" downloads embed + blocks 0 .. last Engram layer - 1, never an Engram shard
    (layer 1's Engram tensors share block 1's prefix) nor a later block's; gates equal the folder's."""
    folder = blocks_kit.write(tmp_path / "blocks", 64, seed=0)
    weight_map = read_json(folder / INDEX_FILE, "index file")["weight_map"]
    last = max(blocks_kit.ENGRAM_LAYERS)
    prompt = {"id": "p", "input_ids": blocks_kit.prompt(40, seed=1)[0][0]}
    with HubServer({"test/blocks": Repo(folder)}) as server:
        use_hub(server, monkeypatch, tmp_path)
        from_hub = Pipeline("hf://test/blocks", streams="model").run([prompt]).to_frame("gates")
        whole = {r.file for r in server.log if r.method == "GET" and r.span is None}
    fetched = whole & _all_shards(folder)
    assert (
        fetched
        == set(shards_needed(weight_map, range(last)))
        == {weight_map[EMBED_NAME]} | {f"model-block{b}.safetensors" for b in range(last)}
    )
    assert not fetched & (set(_engram_shards(folder)) - {weight_map[EMBED_NAME]})
    from_disk = Pipeline(folder, streams="model").run([prompt]).to_frame("gates")
    assert from_hub["gate"].tolist() == from_disk["gate"].tolist()


def test_offline_uses_the_cache_alone(hub, folder, monkeypatch):
    monkeypatch.setenv("ENGRAM_VIZ_OFFLINE", "1")
    with pytest.raises(HubError, match=r"hf://test/ckpt: model.safetensors.index.json is not in the local Hub cache"):
        open_checkpoint("hf://test/ckpt")
    monkeypatch.delenv("ENGRAM_VIZ_OFFLINE")
    online = Pipeline("hf://test/ckpt", streams="embedding").run(PROMPTS).to_frame("gates")

    with socket.socket() as s:  # the endpoint now a port nobody listens on
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    offline = Pipeline("hf://test/ckpt", streams="embedding").run(PROMPTS).to_frame("gates")
    assert offline["gate"].tolist() == online["gate"].tolist()


@pytest.mark.parametrize(
    ("repo", "expected"),
    [
        ("test/missing", "hf://test/missing: no such repository on the Hub (or a private one: set HF_TOKEN"),
        ("test/gated", "hf://test/gated is a gated repository: accept its conditions on the Hub"),
        ("test/broken", f"hf://test/broken@{COMMIT[:12]}/model-00003-of-00003.safetensors: bytes 0-7 could not be"),
        ("test/ckpt@v9", "hf://test/ckpt@v9: no revision 'v9' in this repository"),
    ],
)
def test_a_repository_that_cannot_be_had_is_one_line_and_writes_nothing(hub, tmp_path, capsys, repo, expected):
    out = tmp_path / "report"
    code = main(["report", "--checkpoint", f"hf://{repo}", "--out", str(out), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(f"engram-viz report: error: {expected}"), err
    assert err.count("\n") == 1
    assert not out.exists() and list(tmp_path.glob(".report*")) == []


def test_a_connection_dropped_once_is_retried(hub, folder):
    ckpt = open_checkpoint("hf://test/flaky")
    shard = _engram_shards(folder)[-1]
    transfers = [r.status for r in hub.log if r.repo == "test/flaky" and r.file == shard and r.method == "GET"]
    assert transfers[0] == -1 and transfers[-1] in (200, 206)  # broken off, then fetched by huggingface_hub's retry
    local = open_checkpoint(folder)
    last = local.config.engram_layer_ids[-1]
    assert _same_rows(
        ckpt.layer(last).table, local.layer(last).table, torch.arange(local.config.engram_num_embeddings[-1])
    )


def test_config_commands_take_a_hub_checkpoint_and_read_its_config_alone(hub, folder, tmp_path, capsys):
    def run(*argv: str) -> dict:
        assert main(list(argv)) == 0
        return json.loads(capsys.readouterr().out)

    for command in (["hash", "Alexander the Great"], ["layout"], ["params"]):
        from_hub = run(*command, "--checkpoint", "hf://test/ckpt", "--json")
        from_disk = run(*command, "--checkpoint", str(folder), "--json")
        from_hub.pop("config", None), from_disk.pop("config", None)  # where the config came from
        assert from_hub == from_disk and from_hub
    text = tmp_path / "text.txt"
    text.write_text("Alexander the Great was a king of Macedon.\n", encoding="utf-8")
    out = tmp_path / "corpus"
    assert main(["corpus", str(text), "--out", str(out), "--checkpoint", "hf://test/ckpt", "--quiet"]) == 0
    assert json.loads((out / "summary.json").read_text())["config"] == open_checkpoint(folder).config.name
    assert hub.downloads("test/ckpt") == ["config.json"]  # the config alone, fetched once, no shard
