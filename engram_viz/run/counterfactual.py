"""Re-running prompts under a counterfactual edit: what moved, position by position.

:func:`compare_edit` runs each prompt twice through a :class:`~engram_viz.run.pipeline.Pipeline`:
once as stored, once with table rows edited (``weights.row_edits.edit_tables``: nothing written)
and/or editing hooks (e.g. ``force_gate(0.0)`` on ``engram.*.gate``: Engram off). It reports, per
prompt, position and Engram layer, the change in gate (per stream), value and output; for a whole
model (the tiny LM) also the next-token loss at every position.

Which positions may move (column ``touched``): a position of layer L reads 24 rows; it
``reads_edit`` when one of them is edited. With Engram-only streams (each layer fed its own
streams, positions independent) only those positions can change. In a whole model, attention
carries a change forward: position t of layer L is ``touched`` when a position <= t read an edited
row in a layer <= L (the loss at t: in any layer). Untouched positions are bit-identical to the
unedited run (tested), so every nonzero change is the edit's.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from engram_viz.run.capture import HookFn
from engram_viz.run.pipeline import Pipeline, PromptInput
from engram_viz.run.provenance import provenance_of
from engram_viz.run.trace import token_pieces
from engram_viz.weights.row_edits import RowOverlay, edit_tables
from engram_viz.weights.tables import EngramTable

SITES = ("hash_ids", "gate", "value", "out")


@dataclass
class EditEffect:
    """What an edit moved. ``positions``: one row per (prompt, position, layer): token,
    edited_slots (of the 24 read), reads_edit, touched, gate / gate_edited (mean over streams),
    d_gate_max (max ``|change|`` over streams), value_change (L2 of the value change), out_change
    (max ``|change|`` of the output). ``gates``: (prompt, position, layer, stream, gate, gate_edited,
    d_gate). ``reads``: one row per edited row read: (prompt, position, layer, order, head, row,
    ngram: the n-gram's text there). ``loss`` (whole models only, else None): (prompt, position,
    token, next_token, loss, loss_edited, d_loss, touched) in nats, the last position left out."""

    positions: pd.DataFrame
    gates: pd.DataFrame
    reads: pd.DataFrame
    loss: pd.DataFrame | None
    model_label: str


def engram_tables(pipeline: Pipeline) -> dict[int, EngramTable]:
    """{layer: the table each Engram layer of ``pipeline`` gathers from}."""
    # cast: Engram.table is typed as any row gatherer; a Pipeline's loaders give each layer an EngramTable
    return {n: cast(EngramTable, e.table) for n, e in pipeline.engrams.items()}


def _run(pipeline: Pipeline, p: PromptInput, hooks: Mapping[str, HookFn] | None) -> tuple[dict, dict]:
    ids = torch.from_numpy(p.input_ids).reshape(1, -1)
    types = torch.from_numpy(p.token_types).reshape(1, -1)
    names = [f"engram.L{n}.{s}" for n in pipeline.layer_ids for s in SITES]
    outs, cache = pipeline.registry.run_with_cache(lambda: pipeline.forward(ids, types), names, "cpu", hooks)
    caps = {(n, s): cache[f"engram.L{n}.{s}"][0] for n in pipeline.layer_ids for s in SITES}
    return outs, caps


def _token_loss(pipeline: Pipeline, p: PromptInput, logits: torch.Tensor) -> np.ndarray:
    """Next-token loss (nats) at positions 0..T-2: float64 ``[T - 1]``."""
    ids = torch.from_numpy(p.input_ids)
    assert pipeline.lm is not None  # called only for a whole model (run_edit's whole_model)
    target = pipeline.lm.index_ids(ids[1:].to(logits.device))
    return F.cross_entropy(logits[0, :-1].float(), target, reduction="none").double().cpu().numpy()


def _reads(overlays: dict[int, RowOverlay], base: dict, layers: tuple[int, ...]) -> dict[int, np.ndarray]:
    """{layer: bool [T, 24]}: which of the rows read at each position are edited."""
    out = {}
    for n in layers:
        hid = base[(n, "hash_ids")].numpy()
        out[n] = overlays[n].covers(hid) if n in overlays else np.zeros(hid.shape, dtype=bool)
    return out


def _touched(reads: dict[int, np.ndarray], layers: tuple[int, ...], whole_model: bool) -> dict[int, np.ndarray]:
    out, upstream = {}, None
    for n in layers:
        here = reads[n].any(-1)
        if whole_model:
            upstream = here if upstream is None else upstream | here
            out[n] = np.maximum.accumulate(upstream)
        else:
            out[n] = here
    return out


def _prompt_frames(pipeline, p, base, edit, reads, touched) -> tuple[list, list, list]:
    pieces = token_pieces(pipeline.tokenizer, p.input_ids.tolist(), p.token_types.tolist())
    t_len, heads = len(pieces), pipeline.config.engram_n_heads
    pos, gates, rd = [], [], []
    for n in pipeline.layer_ids:
        g0, g1 = base[(n, "gate")].double().numpy(), edit[(n, "gate")].double().numpy()
        dv = (edit[(n, "value")].double() - base[(n, "value")].double()).norm(dim=-1).numpy()
        do = (edit[(n, "out")].double() - base[(n, "out")].double()).abs().amax(dim=(-2, -1)).numpy()
        pos.append(
            pd.DataFrame(
                {
                    "prompt": p.id,
                    "position": np.arange(t_len),
                    "token": pieces,
                    "layer": n,
                    "edited_slots": reads[n].sum(-1),
                    "reads_edit": reads[n].any(-1),
                    "touched": touched[n],
                    "gate": g0.mean(-1),
                    "gate_edited": g1.mean(-1),
                    "d_gate_max": np.abs(g1 - g0).max(-1),
                    "value_change": dv,
                    "out_change": do,
                }
            )
        )
        hc = g0.shape[-1]
        gates.append(
            pd.DataFrame(
                {
                    "prompt": p.id,
                    "position": np.repeat(np.arange(t_len), hc),
                    "layer": n,
                    "stream": np.tile(np.arange(hc), t_len),
                    "gate": g0.reshape(-1),
                    "gate_edited": g1.reshape(-1),
                    "d_gate": (g1 - g0).reshape(-1),
                }
            )
        )
        hid = base[(n, "hash_ids")].numpy()
        for t, slot in zip(*np.nonzero(reads[n])):
            order = int(slot) // heads + 2
            rd.append(
                {
                    "prompt": p.id,
                    "position": int(t),
                    "layer": n,
                    "order": order,
                    "head": int(slot) % heads,
                    "row": int(hid[t, slot]),
                    "ngram": "".join(pieces[max(0, t - order + 1) : t + 1]),
                }
            )
    return pos, gates, rd


def _loss_frame(pipeline, p, base_outs, edit_outs, touched_any) -> pd.DataFrame:
    pieces = token_pieces(pipeline.tokenizer, p.input_ids.tolist(), p.token_types.tolist())
    l0, l1 = _token_loss(pipeline, p, base_outs[-1]), _token_loss(pipeline, p, edit_outs[-1])
    return pd.DataFrame(
        {
            "prompt": p.id,
            "position": np.arange(len(l0)),
            "token": pieces[:-1],
            "next_token": pieces[1:],
            "loss": l0,
            "loss_edited": l1,
            "d_loss": l1 - l0,
            "touched": touched_any[: len(l0)],
        }
    )


def compare_edit(
    pipeline: Pipeline,
    prompts,
    edits: Mapping[int, object] | None = None,
    hooks: Mapping[str, HookFn] | None = None,
) -> EditEffect:
    """Run ``prompts`` as stored and under ``edits`` ({layer: edits of ``weights.row_edits.edit_rows``})
    and/or editing ``hooks`` ({hook name or glob: fn}); see the module docstring and :class:`EditEffect`.
    Each prompt runs on its own (no padding)."""
    edits = {} if edits is None else edits  # validated by edit_tables (a RowEditError)
    whole_model = pipeline.lm is not None and pipeline.streams_mode == "model"
    pos, gates, reads, losses = [], [], [], []
    for p in pipeline.build(prompts):
        base_outs, base = _run(pipeline, p, None)
        with ExitStack() as stack:
            overlays = stack.enter_context(edit_tables(engram_tables(pipeline), edits))
            edit_outs, edit = _run(pipeline, p, hooks)
        rd = _reads(overlays, base, pipeline.layer_ids)
        touched = _touched(rd, pipeline.layer_ids, whole_model)
        if hooks:  # a hook may change any position: every one is touched
            touched = {n: np.ones_like(t) for n, t in touched.items()}
        a, b, c = _prompt_frames(pipeline, p, base, edit, rd, touched)
        pos += a
        gates += b
        reads += c
        if pipeline.lm is not None and -1 in base_outs:
            any_layer = np.logical_or.reduce([touched[n] for n in pipeline.layer_ids])
            losses.append(_loss_frame(pipeline, p, base_outs, edit_outs, np.maximum.accumulate(any_layer)))
    reads_cols = ["prompt", "position", "layer", "order", "head", "row", "ngram"]
    prov = provenance_of(pipeline)  # every frame carries it, so its figures stamp themselves
    return EditEffect(
        positions=prov.tag(pd.concat(pos, ignore_index=True)),
        gates=prov.tag(pd.concat(gates, ignore_index=True)),
        reads=prov.tag(pd.DataFrame(reads, columns=reads_cols)),
        loss=prov.tag(pd.concat(losses, ignore_index=True)) if losses else None,
        model_label=pipeline.model_label,
    )
