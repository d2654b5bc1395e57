"""Which n-gram orders drive the gate on which tokens: the orders' Shapley values of many positions,
each position labelled with a token class (entity, function word, other).

``order_profile(pipeline, prompts)`` explains every text position of every prompt
(:func:`engram_viz.analysis.explain.explain`) and returns one row per (prompt, position, layer,
order): prompt, category, position, token, token_class, layer, order, shapley (mean over the
streams), gate (mean over the streams). The classes are a plain rule, stated in
:func:`token_class`, not a tagger.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from engram_viz.analysis.explain import explain

# Closed-class words of English and Chinese (articles, pronouns, prepositions, conjunctions,
# auxiliaries, particles): what the rule calls a function word.
_ENGLISH = (
    "a an the and or but nor of to in on at by for with from into out up as than that this these those "
    "it its he she they them his her their we us our you your i me my is are was were be been being "
    "have has had do does did not no so if then when which who whom whose what there here also all "
    "shall will would should can could may might unto upon"
)
_CHINESE = "的 了 和 与 也 是 在 都 就 而 及 或 之 其 这 那 我 你 他 她 它 们 从 到 把 被 曰 为 以 于 乎 者"
FUNCTION_WORDS = frozenset(_ENGLISH.split()) | frozenset(_CHINESE.split())
ENTITY_CATEGORIES = ("english_entities", "chinese_entities", "unseen_names")


def token_class(piece: str, category: str = "") -> str:
    """``function`` (a closed-class word or punctuation), ``entity`` (a capitalised word, or a CJK
    token, in a prompt of an entity category), else ``other``."""
    word = piece.strip()
    if not word or all(not ch.isalnum() for ch in word) or word.lower() in FUNCTION_WORDS:
        return "function"
    is_cjk = any("\u4e00" <= ch <= "\u9fff" for ch in word)
    if category in ENTITY_CATEGORIES and (word[0].isupper() or is_cjk):
        return "entity"
    return "other"


def order_profile(pipeline: Any, prompts: Iterable[Any]) -> pd.DataFrame:
    """The orders' Shapley values at every text position (BOS and image positions left out) of
    ``prompts`` (strings, dicts or Prompt objects with text)."""
    frames = []
    for p in prompts:
        category = str(getattr(p, "category", None) or (p.get("category", "") if isinstance(p, dict) else ""))
        ex = explain(pipeline, p)
        g = ex.groups_frame()
        g = g[(g["kind"] == "order") & (g["position"] > 0)]
        g = g.groupby(["prompt", "position", "token", "layer", "group"], as_index=False)[["shapley", "gate"]].mean()
        g = g[g["gate"] > 0]  # image positions: the gate is shut in every coalition
        g = g.rename(columns={"group": "order"})
        g.insert(1, "category", category)
        g.insert(4, "token_class", [token_class(t, category) for t in g["token"]])
        frames.append(g)
    return pd.concat(frames, ignore_index=True)
