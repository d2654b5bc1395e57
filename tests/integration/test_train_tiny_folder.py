"""train-tiny --out is all or nothing, like report and corpus, and refuses a bad --steps or --seed in
one line naming the option, before anything is written or trained."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engram_viz.cli import main
from engram_viz.errors import EngramVizError, InputError
from engram_viz.tiny.data import Corpus
from engram_viz.tiny.files import load_tiny_model
from engram_viz.tiny.train import TrainSettings, train_tiny

SMALL = TrainSettings(steps=2, batch=2, seq_len=8, warmup=1, eval_every=1, engram_vocab_size=2000, vocab_rows=64)


@pytest.fixture(scope="module")
def corpus() -> Corpus:
    g = torch.Generator().manual_seed(0)
    return Corpus(
        train=torch.randint(1, 400, (400,), generator=g),
        heldout=torch.randint(1, 400, (80,), generator=g),
        raw_ids=torch.tensor([-1, *range(1, 64)]),
        n_docs={"train_docs": 1, "heldout_docs": 1},
    )


def _files(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


def test_a_run_folder_is_written_whole_and_replaced_whole(tmp_path, corpus):
    out = tmp_path / "run"
    train_tiny(out, seed=1, settings=SMALL, progress=False, corpus=corpus)
    first = _files(out)
    assert {"metrics.json", "loss_curve.png", "config.json"} <= set(first)
    (out / "MODEL_CARD.md").write_text("written by hand")
    (out / "stale.txt").write_text("from an older run")
    m = train_tiny(out, seed=2, settings=SMALL, progress=False, corpus=corpus)
    assert _files(out) == sorted([*first, "MODEL_CARD.md"])  # no stale file; the model card kept
    assert (out / "MODEL_CARD.md").read_text() == "written by hand"
    assert json.loads((out / "metrics.json").read_text())["seed"] == m["seed"] == 2
    load_tiny_model(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]  # nothing beside it


def test_a_folder_of_something_else_is_refused_before_training(tmp_path, corpus):
    out = tmp_path / "photos"
    out.mkdir()
    (out / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(EngramVizError, match="holds files of something else"):
        train_tiny(out, settings=SMALL, progress=False, corpus=corpus)
    assert _files(out) == ["holiday.jpg"]
    assert main(["train-tiny", "--out", str(out), "--steps", "1", "--quiet"]) == 2
    assert _files(out) == ["holiday.jpg"]


def test_a_failed_run_leaves_the_earlier_run(tmp_path, corpus, monkeypatch):
    out = tmp_path / "run"
    train_tiny(out, seed=1, settings=SMALL, progress=False, corpus=corpus)
    before = {p: (out / p).read_bytes() for p in _files(out)}

    def boom(*args, **kwargs):
        raise RuntimeError("disk gone")

    monkeypatch.setattr("engram_viz.tiny.train.plot_curves", boom)
    with pytest.raises(RuntimeError, match="disk gone"):
        train_tiny(out, seed=2, settings=SMALL, progress=False, corpus=corpus)
    assert {p: (out / p).read_bytes() for p in _files(out)} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"]


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["--steps", "0"], "--steps"),
        (["--steps", "-1"], "--steps"),
        (["--seed", str(2**70)], "--seed"),
        (["--seed", "-1"], "--seed"),
    ],
)
def test_bad_steps_and_seeds_are_one_line_naming_the_option(tmp_path, capsys, args, option):
    out = tmp_path / "run"
    assert main(["train-tiny", "--out", str(out), "--quiet", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert option in err and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert not out.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "bad",
    [
        {"steps": 0},
        {"steps": 1.5},
        {"steps": True},
        {"eval_every": 0},
        {"batch": -2},
        {"lr": float("nan")},
        {"warmup": -1},
    ],
)
def test_settings_out_of_range_are_refused_by_name(bad):
    with pytest.raises(InputError, match=f"train-tiny {next(iter(bad))}"):
        TrainSettings(**bad)


@pytest.mark.parametrize("seed", [2**64, -1, 1.0, True, "3"])
def test_train_tiny_refuses_a_seed_torch_cannot_take(tmp_path, corpus, seed):
    with pytest.raises(InputError, match=r"seed \(--seed\)"):
        train_tiny(tmp_path / "run", seed=seed, settings=SMALL, progress=False, corpus=corpus)
    assert list(tmp_path.iterdir()) == []
