"""Per-position gates and losses of the tiny LM: what the gate-versus-memory analysis reads.

:func:`probe_windows` runs windows ``[N, T + 1]`` of raw ids (each a fresh prompt from position
0) and returns, per position of the first T tokens, the mean gate over the streams of each Engram
layer and the next-token loss with the gates open and forced to 0 (through the
``engram.L{n}.gate`` hooks). :func:`random_windows` draws the random-token controls.
"""

from __future__ import annotations

from contextlib import nullcontext as _nothing

import torch
import torch.nn.functional as F

from engram_viz.tiny.model import TinyEngramLM, gates_forced


def _token_losses(model: TinyEngramLM, w: torch.Tensor) -> torch.Tensor:
    logits = model(w[:, :-1])
    target = model.index_ids(w[:, 1:])
    return F.cross_entropy(logits.transpose(1, 2), target, reduction="none")  # [B, T]


@torch.no_grad()
def probe_windows(model: TinyEngramLM, windows: torch.Tensor, batch: int = 32) -> dict[str, torch.Tensor]:
    """``{'gate_L{n}': [N, T] mean gate over streams, 'loss_open': [N, T], 'loss_shut': [N, T]}``
    for windows ``[N, T + 1]`` (loss at t: predicting token t + 1; gate at t: position t)."""
    was = model.training
    model.eval()
    out: dict[str, list[torch.Tensor]] = {"loss_open": [], "loss_shut": []}
    out |= {f"gate_L{key}": [] for key in model.engrams}

    def keep(key: str):
        return lambda g, name: out[f"gate_L{key}"].append(g.mean(-1).float()) or g

    handles = [e.hook_gate.add_hook(keep(key)) for key, e in model.engrams.items()]
    try:
        for i in range(0, len(windows), batch):
            out["loss_open"].append(_token_losses(model, windows[i : i + batch]))
    finally:
        for h in handles:
            h.remove()
    with gates_forced(model, 0.0):
        for i in range(0, len(windows), batch):
            out["loss_shut"].append(_token_losses(model, windows[i : i + batch]))
    model.train(was)
    return {k: torch.cat(v) for k, v in out.items()}


def random_windows(raw_ids: torch.Tensor, n: int, length: int, seed: int = 0) -> torch.Tensor:
    """``[n, length]`` raw ids drawn uniformly (with a seeded generator) from the model's known
    raw ids (``raw_ids[1:]``; row 0 is the unknown token)."""
    g = torch.Generator().manual_seed(seed)
    known = raw_ids[1:]
    return known[torch.randint(0, len(known), (n, length), generator=g)]


@torch.no_grad()
def prompt_loss_saved(model: TinyEngramLM, input_ids: torch.Tensor, token_mask: torch.Tensor) -> torch.Tensor:
    """Per position t of one prompt (raw ids ``[T]``, text mask ``[T]``): the loss of predicting
    token t + 1 with every Engram gate forced to 0 minus the loss with the gates open (nats);
    NaN at the last position and where token t + 1 is an image position."""
    ids, mask = input_ids[None].cpu(), token_mask[None].cpu()
    target = model.index_ids(ids[:, 1:])
    losses = []
    for shut in (False, True):
        ctx = gates_forced(model, 0.0) if shut else _nothing()
        with ctx:
            logits = model(ids, token_mask=mask)[:, :-1]
        losses.append(F.cross_entropy(logits.transpose(1, 2), target, reduction="none")[0])
    saved = torch.full((ids.shape[1],), float("nan"))
    saved[:-1] = torch.where(mask[0, 1:], losses[1] - losses[0], torch.tensor(float("nan")))
    return saved
