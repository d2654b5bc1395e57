"""``engram-viz train-tiny``: train the tiny Engram LM on the CPU, deterministically, and export it.

Data: the King James Bible (Debian ``bible-kjv-text``, public domain) and the Chinese
translation of the Debian Reference (Debian ``debian-reference-zh-cn``). Each document (a Bible
chapter; a ~1,000-character run of Chinese paragraphs) is tokenised with the V4 tokenizer, BOS
first. Every 25th document (index % 25 == 12) is held out; the rest are concatenated into one
training stream. A training batch is ``batch`` windows of ``seq_len + 1`` tokens starting at
offsets drawn from a ``torch.Generator`` seeded with the seed; held-out loss is the mean over
fixed non-overlapping windows of the held-out stream. Every window hashes as a fresh prompt.
"""

from __future__ import annotations

import gzip
import math
import re
import subprocess
import time
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engram_viz.config import load_config
from engram_viz.core.tokenizer import BOS_ID, get_tokenizer

HOLDOUT_EVERY, HOLDOUT_AT = 25, 12
PROBE_WINDOWS = 64  # held-out windows scored during training (the final score uses all of them)
ZH_DOC_CHARS = 1000
VOCAB_ROWS = 4096  # the small vocabulary: unknown row 0 + the 4,095 commonest raw ids of the training split


@dataclass(frozen=True)
class TrainSettings:
    steps: int = 400
    batch: int = 16
    seq_len: int = 128
    lr: float = 5e-3
    table_lr: float = 1e-2
    warmup: int = 30
    weight_decay: float = 0.01
    eval_every: int = 100
    threads: int = 1  # see MODEL_CARD.md: on a shared 2-core machine 2 threads ran ~4x slower than 1


# ---------------------------------------------------------------------------------------- data


def _kjv_text() -> str:
    """The whole KJV as printed by Debian's ``bible`` program (bible-kjv)."""
    try:
        out = subprocess.run(["bible", "gen1:1-rev22:21"], capture_output=True, text=True, check=True)
    except FileNotFoundError:
        raise FileNotFoundError("the `bible` program is missing: apt-get install bible-kjv bible-kjv-text") from None
    return out.stdout


def kjv_documents(text: str | None = None) -> list[str]:
    """One document per chapter: ``"Genesis 1\\nIn the beginning ..."``, verse numbers dropped."""
    text = _kjv_text() if text is None else text
    docs, title, verses = [], None, []
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" ") and re.match(r"^[1-3]?\s?[A-Za-z ]+ \d+$", line.strip()):
            if title is not None:
                docs.append(title + "\n" + " ".join(verses))
            title, verses = line.strip(), []
            continue
        m = re.match(r"^\s+\d+\s+(.*)$", line)
        verses.append((m.group(1) if m else line).strip())
    if title is not None:
        docs.append(title + "\n" + " ".join(verses))
    return docs


ZH_REFERENCE = Path("/usr/share/debian-reference/debian-reference.zh-cn.txt.gz")
_CJK = re.compile(r"[\u4e00-\u9fff]")


def zh_documents(path: Path = ZH_REFERENCE) -> list[str]:
    """Chinese prose paragraphs of the Debian Reference (tables, code lines and paragraphs
    without Chinese characters dropped), grouped into documents of ~1,000 characters."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: apt-get install debian-reference-zh-cn")
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        raw = unicodedata.normalize("NFC", fh.read()).replace("\u00a0", " ")
    paras, cur = [], []
    for line in raw.splitlines():
        s = line.strip()
        if not s or s[0] in "|+-$#" or s.startswith("*"):
            if cur:
                paras.append("".join(cur) if _CJK.search("".join(cur)) else "")
                cur = []
            continue
        cur.append(s if not cur or _CJK.match(s[0]) else " " + s)
    if cur:
        paras.append("".join(cur))
    docs, acc = [], ""
    for p in (p for p in paras if p and _CJK.search(p)):
        acc = acc + "\n" + p if acc else p
        if len(acc) >= ZH_DOC_CHARS:
            docs.append(acc)
            acc = ""
    if acc:
        docs.append(acc)
    return docs


@dataclass
class Corpus:
    """Token streams (raw V4 ids, int64) of the fixed split, and the small vocabulary."""

    train: torch.Tensor
    heldout: torch.Tensor
    raw_ids: torch.Tensor  # [V] raw id of each small-vocab row; raw_ids[0] = -1 (unknown)
    n_docs: dict


def build_corpus(config="tiny", vocab_rows: int = VOCAB_ROWS) -> Corpus:
    """Tokenise both sources, split every 25th document off, build the vocabulary from train: the
    ``vocab_rows - 1`` commonest raw ids (ties: lower id first), sorted by id, after the unknown row."""
    tok = get_tokenizer(load_config(config))
    docs = [("en", d) for d in kjv_documents()] + [("zh", d) for d in zh_documents()]
    enc = tok.backend.encode_batch([d for _, d in docs], add_special_tokens=False)
    train, held = [], []
    n_docs = {"en_train": 0, "en_heldout": 0, "zh_train": 0, "zh_heldout": 0}
    for i, ((lang, _), e) in enumerate(zip(docs, enc)):
        is_held = i % HOLDOUT_EVERY == HOLDOUT_AT
        (held if is_held else train).append([BOS_ID, *e.ids])
        n_docs[f"{lang}_{'heldout' if is_held else 'train'}"] += 1
    train_ids = torch.tensor([t for d in train for t in d], dtype=torch.int64)
    held_ids = torch.tensor([t for d in held for t in d], dtype=torch.int64)
    counts = torch.bincount(train_ids, minlength=tok.vocab_size)
    order = np.lexsort((np.arange(len(counts)), -counts.numpy()))  # by count desc, then id
    kept = torch.from_numpy(np.sort(order[: vocab_rows - 1]))
    raw_ids = torch.cat([torch.tensor([-1]), kept])
    return Corpus(train_ids, held_ids, raw_ids, n_docs)


def batch_offsets(n_tokens: int, seq_len: int, batch: int, steps: int, seed: int) -> torch.Tensor:
    """``[steps, batch]`` window starts, a pure function of the seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_tokens - seq_len - 1, (steps, batch), generator=g)


def heldout_windows(heldout: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Fixed non-overlapping windows ``[N, seq_len + 1]`` of the held-out stream."""
    n = (len(heldout) - 1) // seq_len
    idx = torch.arange(n)[:, None] * seq_len + torch.arange(seq_len + 1)[None, :]
    return heldout[idx]


def lr_at(step: int, s: TrainSettings) -> float:
    """Linear warm-up, cosine decay to 10%."""
    if step < s.warmup:
        return (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))


def now() -> float:
    return time.perf_counter()


# ------------------------------------------------------------------------------------ training


@torch.no_grad()
def heldout_loss(model, windows: torch.Tensor, batch: int = 64, shut_gates: bool = False) -> float:
    """Mean next-token cross-entropy (nats/token) over held-out windows ``[N, T + 1]``; with
    ``shut_gates`` every Engram gate is forced to 0 through the ``engram.L{n}.gate`` hooks."""
    from contextlib import nullcontext

    from engram_viz.tiny.model import gates_forced

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
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 3.6), dpi=120)
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
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def train_tiny(
    out: str | Path,
    seed: int = 0,
    use_engram: bool = True,
    settings: TrainSettings = TrainSettings(),
    progress: bool = True,
) -> dict:
    """Train, export (fp8 Engram tensors) and evaluate; writes the model folder, ``metrics.json`` and
    ``loss_curve.png`` into ``out`` and returns the metrics."""
    from tqdm import tqdm

    from engram_viz.tiny.model import (
        TinyEngramLM,
        TinyLMConfig,
        count_parameters,
        load_tiny_model,
        save_tiny_model,
        write_json,
    )

    out = Path(out)
    torch.set_num_threads(settings.threads)
    torch.manual_seed(seed)
    t_start = now()
    config = load_config("tiny")
    tok = get_tokenizer(config)
    corpus = build_corpus(config)
    windows = heldout_windows(corpus.heldout, settings.seq_len)
    lm = TinyLMConfig(vocab_rows=len(corpus.raw_ids), use_engram=use_engram)
    model = TinyEngramLM(config, tok.token_map, corpus.raw_ids, lm)
    table_params = [p for n, p in model.named_parameters() if ".table." in n]
    decay = [p for n, p in model.named_parameters() if ".table." not in n and p.dim() == 2]
    other = [p for n, p in model.named_parameters() if ".table." not in n and p.dim() != 2]
    groups = [
        {"params": decay, "lr": settings.lr, "weight_decay": settings.weight_decay},
        {"params": other, "lr": settings.lr, "weight_decay": 0.0},
    ]
    if table_params:
        groups.append({"params": table_params, "lr": settings.table_lr, "weight_decay": 0.0})
    base = [g["lr"] for g in groups]
    opt = torch.optim.AdamW(groups, betas=(0.9, 0.95))
    offsets = batch_offsets(len(corpus.train), settings.seq_len, settings.batch, settings.steps, seed)
    span = torch.arange(settings.seq_len + 1)
    history: dict[str, list] = {"train_step": [], "train_loss": [], "eval_step": [], "eval_loss": [], "eval_shut": []}
    t_train = now()
    bar = tqdm(
        range(settings.steps),
        desc=f"train-tiny seed {seed}{'' if use_engram else ' no-engram'}",
        disable=not progress,
        mininterval=2.0,
    )
    for step in bar:
        scale = lr_at(step, settings)
        for g, b in zip(opt.param_groups, base):
            g["lr"] = b * scale
        x = corpus.train[offsets[step][:, None] + span]
        loss = model.loss(x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        history["train_step"].append(step)
        history["train_loss"].append(float(loss.detach()))
        if (step + 1) % settings.eval_every == 0 or step + 1 == settings.steps:
            final = step + 1 == settings.steps
            probe = windows if final else windows[:PROBE_WINDOWS]
            history["eval_step"].append(step + 1)
            history["eval_loss"].append(heldout_loss(model, probe))
            if use_engram:
                history["eval_shut"].append(heldout_loss(model, probe, shut_gates=True))
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}", heldout=f"{history['eval_loss'][-1]:.3f}")
    train_s = now() - t_train

    provenance = {
        "seed": seed,
        "steps": settings.steps,
        "settings": settings.__dict__,
        "corpus": {"train_tokens": len(corpus.train), "heldout_tokens": len(corpus.heldout), **corpus.n_docs},
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
    metrics["total_wall_s"] = round(now() - t_start, 1)
    title = f"tiny Engram LM{'' if use_engram else ' (no Engram)'}, seed {seed}, {settings.steps} steps"
    plot_curves(history, out / "loss_curve.png", title)
    write_json(out / "metrics.json", metrics)
    return metrics
