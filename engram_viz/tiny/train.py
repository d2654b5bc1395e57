"""``engram-viz train-tiny``: train the tiny Engram LM on the CPU, deterministically, and export it.

The data, its fixed split and the batch windows are ``engram_viz.tiny.data``; the model is
``engram_viz.tiny.model`` and its exported files ``engram_viz.tiny.files``. Training is AdamW
(betas 0.9/0.95; weight decay on matrices only; the Engram tables at their own learning rate)
with linear warm-up and cosine decay to 10% (:func:`lr_at`), gradients clipped to norm 1. Every
``eval_every`` steps the held-out loss is probed on the first ``PROBE_WINDOWS`` windows, with and
without the Engram gates forced shut; the final step scores all of them.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure

from engram_viz._files import atomic_folder, atomic_path, atomic_write_bytes
from engram_viz._progress import progress_bar
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import InputError
from engram_viz.tiny.data import TRAIN_SOURCES, Corpus, batch_offsets, build_corpus, heldout_windows, windows_at
from engram_viz.tiny.files import load_tiny_model, save_tiny_model, write_json
from engram_viz.tiny.model import TinyEngramLM, TinyLMConfig, count_parameters, engram_config, gates_forced

PROBE_WINDOWS = 64  # held-out windows scored during training (the final score uses all HELDOUT_WINDOWS)
MODEL_CARD = "MODEL_CARD.md"  # written by hand beside a run (data/tiny-engram): a rerun keeps it


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 300
    batch: int = 16
    seq_len: int = 128
    lr: float = 5e-3
    table_lr: float = 3e-2
    warmup: int = 30
    weight_decay: float = 0.01
    eval_every: int = 100
    threads: int = 1  # see MODEL_CARD.md: on a shared 2-core machine 2 threads ran ~4x slower than 1
    engram_vocab_size: int = 10000  # table size: each of the 24 columns gets a prime just above this
    vocab_rows: int = 8192  # rows of the LM's own token embedding (unknown row 0 + the commonest ids)

    def __post_init__(self) -> None:
        """Every field in its range, or an :class:`InputError` naming it (``steps`` is ``--steps``)."""
        for name in ("steps", "batch", "seq_len", "eval_every", "threads", "engram_vocab_size", "vocab_rows"):
            _check_int(f"train-tiny {name}" + (" (--steps)" if name == "steps" else ""), getattr(self, name), 1)
        _check_int("train-tiny warmup", self.warmup, 0)
        for name in ("lr", "table_lr", "weight_decay"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise InputError(f"train-tiny {name} must be a finite number >= 0, got {value!r}")


SEED_MAX = 2**64 - 1  # torch.manual_seed takes an unsigned 64-bit seed


def _check_int(what: str, value: object, lo: int, hi: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{what} must be an integer, got {value!r}")
    if value < lo or (hi is not None and value > hi):
        bound = f"from {lo} to {hi}" if hi is not None else f">= {lo}"
        raise InputError(f"{what} must be an integer {bound}, got {value}")


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up, cosine decay to 10%."""
    if step < s.warmup:
        return (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))


@torch.no_grad()
def heldout_loss(model: TinyEngramLM, windows: torch.Tensor, batch: int = 64, shut_gates: bool = False) -> float:
    """Mean next-token cross-entropy (nats/token) over held-out windows ``[N, T + 1]``; with
    ``shut_gates`` every Engram gate is forced to 0 through the ``engram.L{n}.gate`` hooks."""
    was = model.training
    model.eval()
    total, count = 0.0, 0
    with gates_forced(model, 0.0) if shut_gates else nullcontext():
        for i in range(0, len(windows), batch):
            w = windows[i : i + batch]
            total += float(model.loss(w)) * w[:, 1:].numel()
            count += w[:, 1:].numel()
    model.train(was)
    return total / count


def plot_curves(history: dict, path: Path, title: str) -> None:
    """Loss curve figure (train loss, smoothed, and held-out loss vs step) as PNG, written atomically."""
    fig = Figure(figsize=(6.4, 3.6), dpi=120)
    ax = fig.subplots()
    steps, losses = np.asarray(history["train_step"]), np.asarray(history["train_loss"])
    k = 25
    if len(losses) > k:
        smooth = np.convolve(losses, np.ones(k) / k, mode="valid")
        ax.plot(steps[k - 1 :], smooth, label="train (25-step mean)", lw=1.2)
    else:
        ax.plot(steps, losses, label="train", lw=1.2)
    where = f"first {PROBE_WINDOWS} held-out windows; last point: all"
    ax.plot(history["eval_step"], history["eval_loss"], "o-", ms=3, label=f"held-out ({where})")
    if history.get("eval_shut"):
        ax.plot(history["eval_step"], history["eval_shut"], "s--", ms=3, label="same, Engram gates forced to 0")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title, fontsize=9)
    ax.set_ylim(top=min(8.0, float(np.max(losses)) + 0.2))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp)


def _optimizer(model: TinyEngramLM, settings: TrainSettings) -> torch.optim.AdamW:
    """AdamW: weight decay on matrices only; the Engram tables (``.table.``) at ``table_lr``."""
    table_params = [p for n, p in model.named_parameters() if ".table." in n]
    decay = [p for n, p in model.named_parameters() if ".table." not in n and p.dim() == 2]
    other = [p for n, p in model.named_parameters() if ".table." not in n and p.dim() != 2]
    groups = [
        {"params": decay, "lr": settings.lr, "weight_decay": settings.weight_decay},
        {"params": other, "lr": settings.lr, "weight_decay": 0.0},
    ]
    if table_params:
        groups.append({"params": table_params, "lr": settings.table_lr, "weight_decay": 0.0})
    return torch.optim.AdamW(groups, betas=(0.9, 0.95))


def _train_steps(
    model: TinyEngramLM, corpus: Corpus, windows: torch.Tensor, seed: int, settings: TrainSettings, progress: bool
) -> dict[str, list]:
    """The training loop; returns the history: train loss per step and held-out probes
    (``eval_shut``: the same with the Engram gates forced to 0, Engram models only)."""
    opt = _optimizer(model, settings)
    base = [g["lr"] for g in opt.param_groups]
    offsets = batch_offsets(len(corpus.train), settings.seq_len, settings.batch, settings.steps, seed)
    history: dict[str, list] = {"train_step": [], "train_loss": [], "eval_step": [], "eval_loss": [], "eval_shut": []}
    use_engram = model.lm.use_engram
    bar = progress_bar(
        range(settings.steps),
        desc=f"train-tiny seed {seed}{'' if use_engram else ' no-engram'}",
        disable=not progress,
        mininterval=2.0,
    )
    for step in bar:
        scale = lr_at(step, settings)
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * scale
        x = windows_at(corpus.train, offsets[step], settings.seq_len)
        loss = model.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history["train_step"].append(step)
        history["train_loss"].append(float(loss.detach()))
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps:
            probe = windows if step + 1 == settings.steps else windows[:PROBE_WINDOWS]
            history["eval_step"].append(step + 1)
            history["eval_loss"].append(heldout_loss(model, probe))
            if use_engram:
                history["eval_shut"].append(heldout_loss(model, probe, shut_gates=True))
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", heldout=f"{history['eval_loss'][-1]:.3f}")
    return history


def train_tiny(
    out: str | Path,
    seed: int = 0,
    use_engram: bool = True,
    settings: TrainSettings = TrainSettings(),
    progress: bool = True,
    corpus: Corpus | None = None,
) -> dict:
    """Train, export (fp8 Engram tensors) and evaluate; writes the model folder, ``metrics.json`` and
    ``loss_curve.png`` into ``out`` and returns the metrics. ``corpus`` (default: ``build_corpus``
    with the settings' vocabulary) lets experiments tokenise once.

    ``out`` is all or nothing, like ``report`` and ``corpus`` (``_files.atomic_folder``, marker
    ``metrics.json``): checked and locked before training starts (a non-empty folder of something
    else is refused), built beside ``out`` and swapped in whole when complete, so a failed or
    interrupted run leaves the earlier run (or nothing); the earlier run's ``MODEL_CARD.md``, written
    by hand, is kept. ``seed``: an integer from 0 to 2**64 - 1 (``--seed``)."""
    _check_int("train-tiny seed (--seed)", seed, 0, SEED_MAX)
    seed = int(seed)
    with atomic_folder(out, marker="metrics.json") as build:
        card = Path(out) / MODEL_CARD
        if card.is_file():
            atomic_write_bytes(build / MODEL_CARD, card.read_bytes())
        return _train_into(build, seed, use_engram, settings, progress, corpus)


def _train_into(
    out: Path, seed: int, use_engram: bool, settings: TrainSettings, progress: bool, corpus: Corpus | None
) -> dict:
    """The whole run, written into ``out`` (the folder being built)."""
    torch.set_num_threads(settings.threads)
    torch.manual_seed(seed)
    t_start = time.perf_counter()
    config = engram_config(settings.engram_vocab_size)
    tok = get_tokenizer(config)
    corpus = build_corpus(config, settings.vocab_rows) if corpus is None else corpus
    windows = heldout_windows(corpus.heldout, settings.seq_len)
    lm = TinyLMConfig(vocab_rows=len(corpus.raw_ids), use_engram=use_engram)
    model = TinyEngramLM(config, tok.token_map, corpus.raw_ids, lm)
    t_train = time.perf_counter()
    history = _train_steps(model, corpus, windows, seed, settings, progress)
    train_s = time.perf_counter() - t_train

    provenance = {
        "seed": seed,
        "steps": settings.steps,
        "settings": settings.__dict__,
        "corpus": {
            "sources": list(TRAIN_SOURCES),
            "train_tokens": len(corpus.train),
            "heldout_tokens": len(corpus.heldout),
            **corpus.n_docs,
        },
    }
    save_tiny_model(model, out, {"training": provenance})
    exported = load_tiny_model(out)
    metrics = {
        **provenance,
        "use_engram": use_engram,
        "params": count_parameters(model),
        "train_wall_s": round(train_s, 1),
        "total_wall_s": None,
        "heldout_float": history["eval_loss"][-1],
        "heldout_float_gates_shut": history["eval_shut"][-1] if use_engram else None,
        "heldout_fp8": heldout_loss(exported, windows),
        "heldout_fp8_gates_shut": heldout_loss(exported, windows, shut_gates=True) if use_engram else None,
        "history": history,
    }
    metrics["total_wall_s"] = round(time.perf_counter() - t_start, 1)
    title = f"tiny Engram LM{'' if use_engram else ' (no Engram)'}, seed {seed}, {settings.steps} steps"
    plot_curves(history, out / "loss_curve.png", title)
    write_json(out / "metrics.json", metrics)
    return metrics
