"""Knowledge localisation on the tiny LM: ablate one entity's memory, measure the loss where it matters.

The Engram paper's "Engram off" (every gate shut) at the granularity of one memory: the rows of
an entity's n-grams (``analysis.edit_targets.entity_rows``: the n-grams wholly inside its tokens,
every layer, order and head) read zeros, nothing else changes; the next-token loss is compared on

- ``entity continuation``: positions predicting the entity's second .. last token,
- ``rest of the text``: the other positions of the same text,
- ``other texts``: texts without the entity (hashed rows shared by collision can still move them),

beside the same parts with Engram off entirely (``force_gate(0.0)`` on every layer). Loss in nats
per token, from ``run.counterfactual.compare_edit``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from engram_viz.analysis.edits.row_lens import LensError
from engram_viz.analysis.edits.targets import EntityRows, entity_rows
from engram_viz.run.capture import force_gate
from engram_viz.run.counterfactual import EditEffect, compare_edit
from engram_viz.run.pipeline import Pipeline

ENTITY_PROMPT = "entity"
PARTS = ("entity continuation", "rest of the text", "other texts")


@dataclass
class Localisation:
    """``loss``: prompt, position, token, next_token, part, loss, loss_ablated, loss_engram_off;
    ``summary``: per part, positions and mean losses (and their changes); ``effect``: the ablation run."""

    entity: EntityRows
    loss: pd.DataFrame
    summary: pd.DataFrame
    effect: EditEffect


def entity_localisation(
    pipeline: Pipeline, text: str, entity: str, others: list[str], occurrence: int = 0, scope: str = "inside"
) -> Localisation:
    """Ablate ``entity``'s rows (where ``text`` puts it; ``scope`` as in ``entity_rows``) and
    compare losses (module docstring)."""
    if pipeline.lm is None:
        raise LensError(f"knowledge localisation needs a model with an LM head; {pipeline.model_label!r} has none")
    target = entity_rows(pipeline.config, pipeline.tokenizer, text, entity, occurrence, pipeline.bos, scope)
    prompts = [{"id": ENTITY_PROMPT, "text": text}] + [{"id": f"other{i}", "text": t} for i, t in enumerate(others)]
    ablated = compare_edit(pipeline, prompts, target.rows)
    off = compare_edit(pipeline, prompts, hooks={"engram.*.gate": force_gate(0.0)})
    loss = ablated.loss.rename(columns={"loss_edited": "loss_ablated"}).drop(columns=["d_loss"])
    loss["loss_engram_off"] = off.loss["loss_edited"].to_numpy()
    own = loss["prompt"] == ENTITY_PROMPT
    cont = own & loss["position"].isin(target.continuation)
    loss["part"] = np.where(cont, PARTS[0], np.where(own, PARTS[1], PARTS[2]))
    summary = (
        loss.groupby("part", sort=False)
        .agg(
            positions=("loss", "size"),
            loss=("loss", "mean"),
            loss_ablated=("loss_ablated", "mean"),
            loss_engram_off=("loss_engram_off", "mean"),
        )
        .reindex([p for p in PARTS if p in set(loss["part"])])
        .reset_index()
    )
    summary["d_loss_ablated"] = summary["loss_ablated"] - summary["loss"]
    summary["d_loss_engram_off"] = summary["loss_engram_off"] - summary["loss"]
    return Localisation(target, loss, summary, ablated)


def localise_entities(
    pipeline: Pipeline, items: list[tuple[str, str]], others: list[str], scope: str = "inside"
) -> tuple[pd.DataFrame, dict[str, Localisation]]:
    """:func:`entity_localisation` for several ``(text, entity)`` pairs against the same ``others``:
    ``(summary with an entity column, {entity: Localisation})``."""
    runs = {entity: entity_localisation(pipeline, text, entity, others, scope=scope) for text, entity in items}
    frames = [loc.summary.assign(entity=entity) for entity, loc in runs.items()]
    summary = pd.concat(frames, ignore_index=True)
    return summary[["entity", *[c for c in summary.columns if c != "entity"]]], runs
