"""The row lens: everything about one table row, and what a position's memory says.

For a row id of an Engram layer, :func:`row_lens` gathers:

- its owner: the (layer, order, head) column and bucket (``core.layout.EngramLayout.owner``);
- the corpus n-grams landing in it with their counts and whether it is a collision bucket
  (``analysis.row_stats.row_index.RowIndex``);
- for a model with an LM head (the tiny LM): the tokens its value contribution promotes and
  suppresses. ``wkv`` is linear in the 24 gathered rows, so row r (in slot c of its owner's
  column) adds ``v_r = W_value[:, c * head_dim : (c + 1) * head_dim] @ row_r`` (float32, before the
  bf16 rounding of the value and without the fp8 activation quantisation of the reference path)
  to the value. That value is added to every stream scaled by the gate; the tiny LM reads the mean
  of its streams and the residual carries it unchanged to the final norm, so its *direct* effect
  on the logits is ``(gate * v_r * rstd * norm.weight) @ E.T`` (the logit lens of the value;
  later blocks reading it are left out). Without a position, gate * rstd is a positive factor and
  the ranking is that of ``(v_r * norm.weight) @ E.T``.

:func:`position_lens` does the same for a whole position's memory: the captured value at that
position, times its mean gate and the position's own final-norm rstd, and splits it into the 24
rows' parts (their sum equals the value before rounding).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from engram_viz.analysis.row_stats.row_index import RowIndex
from engram_viz.core.layout import EngramLayout, RowOwner
from engram_viz.errors import LensError
from engram_viz.run.pipeline import Pipeline


@dataclass
class RowLens:
    """One row: ``owner``; ``n_ngrams`` / ``collision`` (None without an index); ``ngrams``
    (the index's frame of its n-grams); ``promoted`` / ``suppressed`` (token, raw_id, logit; None
    without a model)."""

    layer: int
    row: int
    owner: RowOwner
    n_ngrams: int | None
    collision: bool | None
    ngrams: pd.DataFrame | None
    promoted: pd.DataFrame | None
    suppressed: pd.DataFrame | None


def slot_values(engram, rows: torch.Tensor, columns) -> torch.Tensor:
    """Value parts float32 ``[..., dim]`` of rows bf16 ``[..., head_dim]`` sitting in hash columns
    ``columns`` (int, same leading shape): ``W_value[:, col * head_dim:(col + 1) * head_dim] @ row``."""
    hc, dim, hd = engram.hc_mult, engram.dim, engram.head_dim
    w = engram.wkv.weight.detach().float()[hc * dim :].reshape(dim, -1, hd)  # [dim, 24, hd]
    cols = torch.as_tensor(columns, dtype=torch.int64, device=w.device)
    wc = w.permute(1, 0, 2)[cols]  # [..., dim, hd]
    return (wc @ rows.to(w.device).float().unsqueeze(-1)).squeeze(-1)


def row_value(engram, row: int) -> torch.Tensor:
    """float32 ``[dim]``: the value contribution of table row ``row`` of ``engram``'s layer, in the
    slot of the column that owns it (module docstring)."""
    owner = EngramLayout(engram.config).owner(engram.layer_id, row)
    return slot_values(engram, engram.table(torch.tensor([row])), torch.tensor([owner.column]))[0]


def logit_lens(model, vec: torch.Tensor, tokenizer, k: int = 10) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The direct logit effect ``(vec * norm.weight) @ E.T`` of a residual direction ``vec`` ``[dim]``
    of the tiny LM: its ``k`` most promoted and most suppressed tokens (token, raw_id, logit)."""
    logits = (vec.float().to(model.norm.weight.device) * model.norm.weight.float()) @ model.embed.weight.float().T
    logits = logits.detach().cpu()
    raw = model.raw_ids.cpu().numpy()

    def frame(idx: torch.Tensor) -> pd.DataFrame:
        ids = raw[idx.numpy()]
        pieces = tokenizer.pieces(np.maximum(ids, 0).tolist())
        names = ["<unk>" if int(j) == 0 else p for j, p in zip(idx.tolist(), pieces)]
        return pd.DataFrame({"token": names, "raw_id": ids, "logit": logits[idx].numpy().astype(np.float64)})

    return frame(torch.topk(logits, k).indices), frame(torch.topk(-logits, k).indices)


def row_lens(
    pipeline: Pipeline, layer: int, row: int, index: RowIndex | None = None, decoder=None, k: int = 10
) -> RowLens:
    """The lens on ``row`` of Engram layer ``layer`` (module docstring). ``index``: a corpus
    :class:`RowIndex` for the n-grams; ``decoder``: an ``NgramDecoder`` for their text."""
    owner = EngramLayout(pipeline.config).owner(layer, row)
    n = coll = frame = None
    if index is not None:
        n = int(index.n_ngrams(layer, [row])[0])
        coll, frame = n >= 2, index.row_frame(layer, [row], decoder)
    promoted = suppressed = None
    if pipeline.lm is not None:
        v = row_value(pipeline.engrams[layer], row)
        promoted, suppressed = logit_lens(pipeline.lm, v, pipeline.tokenizer, k)
    return RowLens(layer, row, owner, n, coll, frame, promoted, suppressed)


@dataclass
class PositionLens:
    """A position's memory at one layer: ``gate`` (mean over streams), ``promoted`` /
    ``suppressed`` tokens of gate * value through the final norm, and ``rows``: one row per slot
    (order, head, row, value_norm, value_share: the part's projection on the value / ``|value|^2``)."""

    prompt: str
    position: int
    layer: int
    token: str
    gate: float
    promoted: pd.DataFrame
    suppressed: pd.DataFrame
    rows: pd.DataFrame


def position_lens(pipeline: Pipeline, text: str, position: int, layer: int, k: int = 10) -> PositionLens:
    """The lens on the memory read at ``position`` of ``text`` in Engram ``layer`` (tiny LM only)."""
    if pipeline.lm is None:
        raise LensError(f"position_lens needs a model with an LM head; {pipeline.model_label!r} has Engram layers only")
    p = pipeline.build([text])[0]
    if not 0 <= position < len(p.input_ids):
        raise LensError(f"position {position} out of range; the text has positions 0..{len(p.input_ids) - 1}")
    ids = torch.from_numpy(p.input_ids)[None]
    types = torch.from_numpy(p.token_types)[None]
    final: list[torch.Tensor] = []
    handle = pipeline.lm.norm.register_forward_pre_hook(lambda mod, args: final.append(args[0].detach()))
    names = [f"engram.L{layer}.{s}" for s in ("hash_ids", "rows", "gate", "value")]
    try:
        _, cache = pipeline.registry.run_with_cache(lambda: pipeline.forward(ids, types), names, "cpu")
    finally:
        handle.remove()
    engram = pipeline.engrams[layer]
    gate = float(cache[names[2]][0, position].mean())
    value = cache[names[3]][0, position].float()
    x = final[0][0, position].float().cpu()
    rstd = float(torch.rsqrt(x.square().mean() + pipeline.lm.norm.eps))
    promoted, suppressed = logit_lens(pipeline.lm, gate * rstd * value, pipeline.tokenizer, k)
    heads = pipeline.config.engram_n_heads
    parts = slot_values(engram, cache[names[1]][0, position], torch.arange(pipeline.config.n_hash_cols)).cpu()
    share = (parts @ value) / value.square().sum().clamp_min(1e-30)
    slots = np.arange(pipeline.config.n_hash_cols)
    rows = pd.DataFrame(
        {
            "order": slots // heads + 2,
            "head": slots % heads,
            "row": cache[names[0]][0, position].numpy(),
            "value_norm": parts.norm(dim=-1).numpy().astype(np.float64),
            "value_share": share.numpy().astype(np.float64),
        }
    )
    token = pipeline.tokenizer.pieces([int(p.input_ids[position])])[0]
    return PositionLens(p.id, position, layer, token, gate, promoted, suppressed, rows)
