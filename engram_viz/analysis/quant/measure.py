"""What a candidate table does to the tiny LM, against its reference fp8 table, prompt by prompt.

:func:`capture_prompt` runs the model once on one prompt (raw ids ``[T]``) and keeps, per Engram
layer, the hook values the study compares (``engram.L{n}.hash_ids`` ``[T, 24]``, ``.rows``
``[T, 24, head_dim]``, ``.key`` ``[T, hc, dim]``, ``.value`` ``[T, dim]``, ``.gate`` ``[T, hc]``,
``.streams`` and ``.out`` ``[T, hc, dim]``) and the next-token log-probabilities ``[T - 1, V]``.
:func:`compare` turns a reference capture and a candidate's into tidy rows:

- ``columns``: per (layer, order, head) the squared row error and squared reference norm summed
  over the text positions (the relative row error is the root of their ratio);
- ``positions``: per (layer, text position) the largest gate change over the streams, how many
  streams move by more than ``MOVED`` or cross 0.5, the relative key, value and output change
  (output: of the Engram's contribution ``out - streams``), and, on the position's next token, the
  loss with each table and the KL divergence of the candidate's next-token distribution from the
  reference's (nats).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from engram_viz.core.hooks import hook_name

SITES = ("hash_ids", "rows", "key", "value", "gate", "streams", "out")
MOVED = 0.05  # a gate "moves" when it changes by more than this
TINY = 1e-30  # keeps a relative error finite where the reference is exactly 0


@torch.no_grad()
def capture_prompt(model: Any, ids: np.ndarray, mask: np.ndarray) -> dict[str, torch.Tensor]:
    """One forward of ``model`` (a TinyEngramLM) on raw ids ``[T]`` (``mask``: bool ``[T]``, False
    at image positions): the :data:`SITES` of each Engram layer (batch dim dropped, float32 for
    floats) and ``logp`` ``[T - 1, V]`` of the next tokens with their ``target`` rows."""
    seen: dict[str, torch.Tensor] = {}
    handles = []
    for key, e in model.engrams.items():
        for site in SITES:
            name = hook_name(int(key), site)

            def keep(t: torch.Tensor, hook_name: str, name: str = name) -> torch.Tensor:
                seen[name] = t.detach()[0].float().cpu() if t.is_floating_point() else t.detach()[0].cpu()
                return t

            handles.append(getattr(e, f"hook_{site}").add_hook(keep))
    try:
        x = torch.as_tensor(ids, dtype=torch.int64)[None]
        logits = model(x, torch.as_tensor(mask, dtype=torch.bool)[None])[0].float()
    finally:
        for h in handles:
            h.remove()
    seen["logp"] = torch.log_softmax(logits[:-1], dim=-1).cpu()
    seen["target"] = model.index_ids(x[0, 1:]).cpu()
    return seen


def _rel(diff: torch.Tensor, ref: torch.Tensor) -> np.ndarray:
    """Per leading index: ||diff|| / ||ref|| over the other dims."""
    d = diff.flatten(1).norm(dim=1)
    r = ref.flatten(1).norm(dim=1)
    return (d / r.clamp_min(TINY)).numpy()


def _column_rows(ref: dict, cand: dict, layer: int, text: np.ndarray, n_heads: int) -> list[dict]:
    r = ref[hook_name(layer, "rows")][text]
    err = ((cand[hook_name(layer, "rows")][text] - r) ** 2).sum(dim=(0, 2)).numpy()  # [24]
    norm = (r**2).sum(dim=(0, 2)).numpy()
    return [
        {
            "layer": layer,
            "order": c // n_heads + 2,
            "head": c % n_heads,
            "sq_err": float(err[c]),
            "sq_ref": float(norm[c]),
        }
        for c in range(len(err))
    ]


def _position_frame(ref: dict, cand: dict, layer: int, text: np.ndarray) -> pd.DataFrame:
    g_ref, g = ref[hook_name(layer, "gate")], cand[hook_name(layer, "gate")]
    dg = (g - g_ref).abs()
    crossed = ((g > 0.5) != (g_ref > 0.5)).sum(-1)
    x = ref[hook_name(layer, "streams")]
    out_ref, out = ref[hook_name(layer, "out")], cand[hook_name(layer, "out")]
    frame = pd.DataFrame(
        {
            "layer": layer,
            "position": np.arange(len(dg)),
            "gate_ref": g_ref.mean(-1).numpy(),
            "gate_change": dg.max(-1).values.numpy(),
            "gate_change_mean": dg.mean(-1).numpy(),
            "streams_moved": (dg > MOVED).sum(-1).numpy(),
            "streams_crossed": crossed.numpy(),
            "key_error": _rel(
                cand[hook_name(layer, "key")] - ref[hook_name(layer, "key")], ref[hook_name(layer, "key")]
            ),
            "value_error": _rel(
                cand[hook_name(layer, "value")] - ref[hook_name(layer, "value")], ref[hook_name(layer, "value")]
            ),
            "out_change": _rel(out - out_ref, out_ref - x),
        }
    )
    return frame[text]


def _loss_columns(ref: dict, cand: dict, n: int) -> dict[str, np.ndarray]:
    """Next-token loss with each table and KL(ref || cand), at positions ``0..n-1`` (NaN at the last)."""
    lp_ref, lp = ref["logp"], cand["logp"]
    t = ref["target"][:, None]
    loss_ref = -lp_ref.gather(1, t)[:, 0].numpy()
    loss = -lp.gather(1, t)[:, 0].numpy()
    kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1).numpy()
    pad = np.full(n - len(kl), np.nan)
    return {
        "loss_ref": np.concatenate([loss_ref, pad]),
        "loss": np.concatenate([loss, pad]),
        "kl": np.concatenate([kl, pad]),
    }


def compare(
    ref: dict, cand: dict, layers: list[int], text: np.ndarray, n_heads: int
) -> tuple[list[dict], pd.DataFrame]:
    """``(column rows, positions frame)`` of one prompt (``text``: bool ``[T]``, True at text positions)."""
    columns, frames = [], []
    losses = _loss_columns(ref, cand, len(text))
    for layer in layers:
        columns += _column_rows(ref, cand, layer, text, n_heads)
        frame = _position_frame(ref, cand, layer, text)
        for k, v in losses.items():
            frame[k] = v[text]
        frames.append(frame)
    return columns, pd.concat(frames, ignore_index=True)
