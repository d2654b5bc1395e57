"""Shared rows: what a row shared by several n-grams does to each that reads it (collision
interference), and what an edit of it does to the others (collateral).

Two n-grams that land in the same row of one head read the same memory there. For every position
of some prompts and every one of its 24 rows this measures the row's effect at that layer by
taking it out: the *one-head-out* change in gate (mean ``|change|`` over the streams) and in value
(L2) when that one row reads zeros, everything else (the layer's input streams, the other 23
rows) as in the run. Per (position, order) it also takes out all of that order's heads whose row
is a collision bucket of a corpus (``analysis.row_stats.row_index.RowIndex``) at once: the gate change
against the number of colliding heads is the figure ``viz.edit_plots.gate_change_vs_colliding_heads``.
These are direct effects at the layer (its own input streams held fixed), exact re-runs of the
Engram forward (``core.engram.engram_steps`` through the module, rows zeroed at the ``rows`` hook).

How often all 8 heads of an order collide, over a corpus, beside a uniform hash's expectation, is
``analysis.row_stats.collisions.CollisionStats.heads_shared`` (drawn by ``viz.heads_shared_vs_expected``).

Collateral of an edit: a row is shared by every n-gram hashed into it (a collision bucket), so editing one memory edits
theirs too. :func:`collateral_ngrams` lists, from a corpus :class:`~engram_viz.analysis.row_stats.row_index.RowIndex`,
every corpus n-gram in the edited rows; :func:`collateral_reads` takes a re-run
(``run.counterfactual.EditEffect``) and keeps the edited rows read by n-grams other than the edit's
own targets, with the change they saw at that position (gate, value, loss).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from engram_viz.analysis.row_stats.row_index import RowIndex
from engram_viz.core.hooks import hook_name
from engram_viz.run.counterfactual import EditEffect
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.provenance import provenance_of
from engram_viz.run.trace import token_pieces

INPUT_SITES = ("streams", "hash_ids", "token_mask")  # what an Engram layer's forward takes


def engram_inputs(pipeline: Pipeline, prompt) -> tuple[object, dict[int, tuple]]:
    """One prompt run through ``pipeline``; ``(PromptInput, {layer: (x, hash_ids, token_mask)})``:
    what each Engram layer received (its ``streams``, ``hash_ids`` and ``token_mask`` hook sites)."""
    p = pipeline.build([prompt])[0]
    ids, types = torch.from_numpy(p.input_ids)[None], torch.from_numpy(p.token_types)[None]
    names = [f"engram.*.{site}" for site in INPUT_SITES]
    _, cache = pipeline.registry.run_with_cache(lambda: pipeline.forward(ids, types), names, device=None)
    return p, {n: tuple(cache[hook_name(n, site)] for site in INPUT_SITES) for n in pipeline.layer_ids}


def rows_out(engram, inputs: tuple, masks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The layer re-run once per variant with rows zeroed where ``masks`` bool ``[V, T, 24]`` is True:
    ``(gate float32 [V, T, hc], value float32 [V, T, dim])``."""
    x, hid = inputs[0], inputs[1]
    mask = inputs[2] if len(inputs) > 2 and inputs[2] is not None else torch.ones(x.shape[:2], dtype=torch.bool)
    v = masks.shape[0]
    keep = (~masks.to(engram.device)).unsqueeze(-1)
    got: dict[str, torch.Tensor] = {}

    def zero(rows: torch.Tensor, name: str) -> torch.Tensor:
        return rows * keep.to(rows.dtype)

    handles = [engram.hook_rows.add_hook(zero)]
    for site in ("gate", "value"):
        handles.append(getattr(engram, f"hook_{site}").add_hook(lambda t, name, s=site: got.__setitem__(s, t)))
    try:
        with torch.no_grad():
            engram(x.expand(v, *x.shape[1:]), hid.expand(v, *hid.shape[1:]), mask.expand(v, *mask.shape[1:]))
    finally:
        for h in handles:
            h.remove()
    return got["gate"].float().cpu(), got["value"].float().cpu()


def _layer_frames(pipeline, p, layer, inputs, index, pieces) -> tuple[pd.DataFrame, pd.DataFrame]:
    engram, heads = pipeline.engrams[layer], pipeline.config.engram_n_heads
    hid = inputs[1][0].cpu().numpy()  # [T, 24]
    t_len, n_slots = hid.shape
    eye = torch.eye(n_slots, dtype=torch.bool)
    masks = torch.cat(
        [torch.zeros(1, t_len, n_slots, dtype=torch.bool), eye[:, None, :].expand(n_slots, t_len, n_slots)]
    )
    coll = index.is_collision(layer, hid.reshape(-1)).reshape(t_len, n_slots)
    orders = pipeline.config.ngram_orders
    slot_order = np.arange(n_slots) // heads + 2
    for o in orders:  # one variant per order: all its colliding heads out, position by position
        masks = torch.cat([masks, torch.from_numpy(coll & (slot_order == o))[None]])
    gate, value = rows_out(engram, inputs, masks)
    # a position whose rows a variant leaves alone is unchanged by definition: exactly 0 there
    # (the batched re-run may reduce another batch row in another order, a last-bit difference)
    touched = masks[1:].any(-1)  # [V-1, T]
    d_gate = torch.where(touched, (gate[1:] - gate[:1]).abs().mean(-1), 0.0).numpy()  # [V-1, T]
    d_value = torch.where(touched, (value[1:] - value[:1]).norm(dim=-1), 0.0).numpy()
    slots = np.arange(n_slots)
    heads_frame = pd.DataFrame(
        {
            "prompt": p.id,
            "position": np.repeat(np.arange(t_len), n_slots),
            "token": np.repeat(pieces, n_slots),
            "layer": layer,
            "order": np.tile(slot_order, t_len),
            "head": np.tile(slots % heads, t_len),
            "row": hid.reshape(-1),
            "n_ngrams": index.n_ngrams(layer, hid.reshape(-1)),
            "collision": coll.reshape(-1),
            "d_gate": d_gate[:n_slots].T.reshape(-1),
            "d_value": d_value[:n_slots].T.reshape(-1),
        }
    )
    order_frame = pd.DataFrame(
        {
            "prompt": p.id,
            "position": np.tile(np.arange(t_len), len(orders)),
            "token": np.tile(pieces, len(orders)),
            "layer": layer,
            "order": np.repeat(orders, t_len),
            "n_colliding": np.concatenate([(coll & (slot_order == o)).sum(-1) for o in orders]),
            "d_gate": d_gate[n_slots:].reshape(-1),
            "d_value": d_value[n_slots:].reshape(-1),
        }
    )
    return heads_frame, order_frame


def collision_interference(pipeline: Pipeline, prompts, index: RowIndex) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(heads, orders)`` frames over every text position of ``prompts`` (module docstring).

    heads: prompt, position, token, layer, order, head, row, n_ngrams (corpus n-grams in the row),
    collision, d_gate (one-head-out, mean ``|change|`` over streams), d_value (L2).
    orders: prompt, position, token, layer, order, n_colliding (heads of the order whose row is a
    collision bucket), d_gate / d_value with all of them out at once (0 where none collides)."""
    heads, orders = [], []
    if isinstance(prompts, (str, dict)):
        prompts = [prompts]
    for prompt in prompts:
        p, seen = engram_inputs(pipeline, prompt)
        text = p.token_types < 0
        pieces = token_pieces(pipeline.tokenizer, p.input_ids.tolist(), p.token_types.tolist())
        for layer in pipeline.layer_ids:
            h, o = _layer_frames(pipeline, p, layer, seen[layer], index, pieces)
            heads.append(h[text[h["position"].to_numpy()]])
            orders.append(o[text[o["position"].to_numpy()]])
    prov = provenance_of(pipeline)  # the frames carry it, so their figures stamp themselves
    return prov.tag(pd.concat(heads, ignore_index=True)), prov.tag(pd.concat(orders, ignore_index=True))


def collateral_ngrams(index: RowIndex, rows: dict[int, object], decoder=None) -> pd.DataFrame:
    """Every corpus n-gram kept by ``index`` in the rows ``{layer: rows}``: layer, row, order, head,
    n_ngrams, collision, ngram, count (and text with a ``decoder``), most frequent first per row."""
    parts = [index.row_frame(layer, np.asarray(list(r), dtype=np.int64), decoder) for layer, r in rows.items()]
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def collateral_reads(
    effect: EditEffect, own: pd.DataFrame | None = None, own_prompt: str | None = None
) -> pd.DataFrame:
    """Edited rows read at positions that are not the edit's own targets: ``effect.reads`` without
    the (position, layer, order, head) reads of ``own`` (e.g. ``EntityRows.ngrams``) in prompt
    ``own_prompt``, joined with that position's d_gate_max, value_change and (whole models) d_loss."""
    reads = effect.reads
    if own is not None and own_prompt is not None:
        keys = ["position", "layer", "order", "head"]
        mine = own[keys].assign(prompt=own_prompt, _own=True)
        reads = reads.merge(mine, on=["prompt", *keys], how="left")
        reads = reads[reads["_own"].isna()].drop(columns="_own")
    cols = ["prompt", "position", "layer", "token", "d_gate_max", "value_change"]
    out = reads.merge(effect.positions[cols], on=["prompt", "position", "layer"], how="left")
    if effect.loss is not None:
        out = out.merge(effect.loss[["prompt", "position", "d_loss"]], on=["prompt", "position"], how="left")
    return out.reset_index(drop=True)
