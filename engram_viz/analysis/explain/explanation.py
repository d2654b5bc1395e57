"""Explain the gates of one prompt: run it through a Pipeline, attribute every Engram layer
(:mod:`engram_viz.analysis.explain.attribution`) and lay the result out as tidy frames with each row's
owner and decoded n-gram.

``explain(pipeline, "Alexander the Great", positions=[3])`` works for every checkpoint a Pipeline
reads (the tiny LM with its own streams, synthetic or real Engram layers on embedding, captured or
user streams): it reads the streams each Engram module was called with (a forward pre-hook) and
the gathered rows (``engram.L{n}.rows``) during one ordinary ``Pipeline.run``, then computes the
shares of every position asked; the left-out gates and Shapley values (the gate arithmetic re-run
on the keys with rows left out) are computed when a frame or :meth:`LayerAttribution.left_out`
first asks for a position, and kept. Frames:

- :meth:`Explanation.rows_frame`: one row per (position, layer, column, stream): prompt,
  position, token, layer, order, head, column, row, ngram, stream, gate, dot, dot_share,
  value_norm, value_proj, loo_gate (the gate with that row left out).
- :meth:`Explanation.groups_frame`: one row per (position, layer, kind, group, stream), kind
  ``order`` (group = n-gram order) or ``head``: dot_share, value_norm, value_proj, loo_gate and,
  for orders, shapley.

Which n-gram orders drive the gate on which tokens: ``order_profile(pipeline, prompts)`` explains every text position of every prompt
(:func:`engram_viz.analysis.explain.explanation.explain`) and returns one row per (prompt, position, layer,
order): prompt, category, position, token, token_class, layer, order, shapley (mean over the
streams), gate (mean over the streams). The classes are a plain rule, stated in
:func:`token_class`, not a tagger.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from engram_viz.analysis.corpus.ngram_text import NgramDecoder
from engram_viz.analysis.corpus.windows import sequence_windows, window_ngrams
from engram_viz.analysis.explain.attribution import LayerAttribution, attribute_layer
from engram_viz.analysis.row_stats.trace_ngrams import trace_sequences
from engram_viz.core.layout import EngramLayout
from engram_viz.core.token_text import joined_text
from engram_viz.errors import AttributionError
from engram_viz.run.pipeline import Pipeline
from engram_viz.run.provenance import Provenance, provenance_of

ROW_COLUMNS = (
    "prompt",
    "position",
    "token",
    "layer",
    "order",
    "head",
    "column",
    "row",
    "ngram",
    "stream",
    "gate",
    "dot",
    "dot_share",
    "value_norm",
    "value_proj",
    "loo_gate",
)
GROUP_COLUMNS = (
    "prompt",
    "position",
    "token",
    "layer",
    "kind",
    "group",
    "stream",
    "gate",
    "dot_share",
    "value_norm",
    "value_proj",
    "loo_gate",
    "shapley",
)


@dataclass
class Explanation:
    """The attribution of some positions of one prompt: ``positions [P]`` (token indices),
    ``pieces`` (every token's text), ``row_ids [P, n_layers, 24]``, ``ngrams[p][order]`` (decoded
    text of the n-gram each column of that order hashes), ``layers`` (layer id ->
    :class:`LayerAttribution` over the P positions)."""

    prompt: str
    text: str
    model_label: str
    positions: np.ndarray
    pieces: list[str]
    row_ids: np.ndarray
    ngrams: list[dict[int, str]]
    layers: dict[int, LayerAttribution]
    provenance: Provenance | None = None  # of the run; every frame carries it in its attrs

    def _tagged(self, df: pd.DataFrame) -> pd.DataFrame:
        return self.provenance.tag(df) if self.provenance is not None else df

    def index(self, position: int) -> int:
        """Where token ``position`` (negative counts from the end) sits among :attr:`positions`."""
        position = _index("position", position)
        p = position + len(self.pieces) if position < 0 else position
        hits = np.flatnonzero(self.positions == p)
        if not hits.size:
            raise AttributionError(
                f"position {position} was not explained; the prompt has positions 0..{len(self.pieces) - 1} "
                f"and {len(self.positions)} of them were explained"
            )
        return int(hits[0])

    def _selection(self, position: int | None, layer: int | None) -> tuple[list[int], list[int]]:
        idx = list(range(len(self.positions))) if position is None else [self.index(position)]
        layer = None if layer is None else _index("layer", layer)
        if layer is not None and layer not in self.layers:
            raise AttributionError(f"layer {layer} is not an Engram layer; expected one of {list(self.layers)}")
        return idx, list(self.layers) if layer is None else [layer]

    def rows_frame(self, position: int | None = None, layer: int | None = None) -> pd.DataFrame:
        """The tidy per-row frame (:data:`ROW_COLUMNS`), optionally for one position / layer."""
        idx, layers = self._selection(position, layer)
        parts = []
        for layer_id in layers:
            a = self.layers[layer_id]
            li = list(self.layers).index(layer_id)
            n_cols, hc = a.dot_share.shape[1:]
            shape = (len(idx), n_cols, hc)
            pos = self.positions[idx]
            cols = {
                "position": np.broadcast_to(pos[:, None, None], shape),
                "layer": np.full(shape, layer_id),
                "order": np.broadcast_to(a.orders[None, :, None], shape),
                "head": np.broadcast_to(a.heads[None, :, None], shape),
                "column": np.broadcast_to(np.arange(n_cols)[None, :, None], shape),
                "row": np.broadcast_to(self.row_ids[idx, li][:, :, None], shape),
                "stream": np.broadcast_to(np.arange(hc)[None, None, :], shape),
                "gate": a.gate[idx].unsqueeze(1).expand(shape).numpy(),
                "dot": a.dot[idx].unsqueeze(1).expand(shape).numpy(),
                "dot_share": a.dot_share[idx].numpy(),
                "value_norm": a.value_norm[idx].unsqueeze(-1).expand(shape).numpy(),
                "value_proj": a.value_proj[idx].unsqueeze(-1).expand(shape).numpy(),
                "loo_gate": a.left_out(idx).loo_row.numpy(),
            }
            parts.append(pd.DataFrame({k: np.asarray(v).reshape(-1) for k, v in cols.items()}))
        df = pd.concat(parts, ignore_index=True)
        df["token"] = [self.pieces[p] for p in df["position"]]
        df["ngram"] = [self.ngrams[self.index(p)][o] for p, o in zip(df["position"], df["order"])]
        df["prompt"] = self.prompt
        return self._tagged(df[list(ROW_COLUMNS)])

    def position_table(self, position: int, layer: int | None = None) -> pd.DataFrame:
        """One position's rows, streams side by side (what ``engram-viz explain`` prints): layer,
        order, head, row, ngram, ``share_s{i}`` (share of stream i's dot), value_norm, value_proj,
        ``loo_s{i}`` (stream i's gate with the row left out)."""
        df = self.rows_frame(position, layer)
        keys = ["layer", "order", "head", "row", "ngram", "value_norm", "value_proj"]
        wide = df.pivot_table(index=["layer", "column"], columns="stream", values=["dot_share", "loo_gate"])
        out = df.drop_duplicates(["layer", "column"]).set_index(["layer", "column"])[keys[1:]]
        for (name, stream), col in wide.items():
            out[f"{'share' if name == 'dot_share' else 'loo'}_s{stream}"] = col
        return self._tagged(out.reset_index().drop(columns="column"))

    def position_summary(self, position: int) -> dict[str, Any]:
        """Plain-JSON summary of one position: token, gates, dots, the rounding left over, per layer."""
        i = self.index(position)
        left = {layer: a.left_out([i]) for layer, a in self.layers.items()}
        return {
            "prompt": self.prompt,
            "model": self.model_label,
            "position": int(self.positions[i]),
            "token": self.pieces[self.positions[i]],
            "layers": {
                str(layer): {
                    "gate": a.gate[i].tolist(),
                    "dot": a.dot[i].tolist(),
                    "dot_rounding": a.dot_rounding[i].tolist(),
                    "shapley": {str(o): left[layer].shapley[0, k].tolist() for k, o in enumerate(a.order_ids)},
                    "loo_order": {str(o): left[layer].loo_order[0, k].tolist() for k, o in enumerate(a.order_ids)},
                }
                for layer, a in self.layers.items()
            },
        }

    def groups_frame(
        self, position: int | None = None, layer: int | None = None, *, left_out: bool = True
    ) -> pd.DataFrame:
        """The tidy per-order and per-head frame (:data:`GROUP_COLUMNS`). With ``left_out=False``
        only the shares (loo_gate and shapley NaN): nothing is re-run, so it costs no more than the
        explanation itself (what the token HTML's tooltips need)."""
        idx, layers = self._selection(position, layer)
        parts = []
        for layer_id in layers:
            a = self.layers[layer_id]
            left = a.left_out(idx) if left_out else None
            for kind, ids, loo, norm in (
                ("order", a.order_ids, left.loo_order if left else None, a.order_value_norm[idx]),
                ("head", a.head_ids, left.loo_head if left else None, a.head_value_norm[idx]),
            ):
                share = a.group(a.dot_share, kind)[idx]  # [P, G, hc]
                shape = tuple(share.shape)
                shapley = left.shapley.numpy() if left and kind == "order" else np.full(shape, np.nan)
                cols = {
                    "position": np.broadcast_to(self.positions[idx][:, None, None], shape),
                    "layer": np.full(shape, layer_id),
                    "kind": np.full(shape, kind),
                    "group": np.broadcast_to(np.asarray(ids)[None, :, None], shape),
                    "stream": np.broadcast_to(np.arange(shape[2])[None, None, :], shape),
                    "gate": a.gate[idx].unsqueeze(1).expand(shape).numpy(),
                    "dot_share": share.numpy(),
                    "value_norm": norm.unsqueeze(-1).expand(shape).numpy(),
                    "value_proj": a.group(a.value_proj.unsqueeze(-1), kind)[idx].expand(shape).numpy(),
                    "loo_gate": loo.numpy() if loo is not None else np.full(shape, np.nan),
                    "shapley": shapley,
                }
                parts.append(pd.DataFrame({k: np.asarray(v).reshape(-1) for k, v in cols.items()}))
        df = pd.concat(parts, ignore_index=True)
        df["token"] = [self.pieces[p] for p in df["position"]]
        df["prompt"] = self.prompt
        return self._tagged(df[list(GROUP_COLUMNS)])


def _decoded_ngrams(trace: Any, decoder: NgramDecoder, positions: np.ndarray, max_ngram: int) -> list[dict[int, str]]:
    """``{order: text}`` of the n-gram each position hashes, per explained position."""
    c, text = trace_sequences(trace)[0]
    windows, _ = sequence_windows(c, int(trace.meta["pad_compressed"]), max_ngram, text)
    longest = window_ngrams(windows[positions], max_ngram)  # [P, max_ngram], oldest first
    pieces = np.asarray(decoder.pieces(longest.ravel()), dtype=object).reshape(longest.shape)
    # the n-gram of order o is the last o pieces of the longest one
    return [{o: joined_text(row[max_ngram - o :]) for o in range(2, max_ngram + 1)} for row in pieces.tolist()]


def _index(name: str, value: Any) -> int:
    """``value`` as a Python int; a bool, float, string or anything else not an integer: AttributionError."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise AttributionError(f"{name} must be integers, got {value!r} ({type(value).__name__})")
    return int(value)


def _indices(name: str, values: Any) -> list[int]:
    """``positions`` or ``layers`` as a non-empty list of ints (None is handled by the caller)."""
    items = values.tolist() if isinstance(values, (np.ndarray, torch.Tensor)) else values
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise AttributionError(f"{name} must be a list of integers or None, got {values!r} ({type(values).__name__})")
    if len(items) == 0:
        raise AttributionError(f"{name} is empty; give at least one, or None for all")
    return [_index(name, v) for v in items]


def _run_capturing(pipeline: Pipeline, prompt: Any) -> tuple[Any, dict[int, torch.Tensor]]:
    """``Pipeline.run`` of one prompt with each Engram layer's input streams (``engram.L{n}.streams``),
    rows, key, value and dot captured: ``(trace, {layer: x [T, hc, dim]})``."""
    trace = pipeline.run([prompt], names=[f"engram.*.{site}" for site in ("streams", "rows", "key", "value", "dot")])
    return trace, {n: x[0] for n, x in trace.captured("streams").items()}


def explain(
    pipeline: Pipeline,
    prompt: Any,
    *,
    positions: Sequence[int] | None = None,
    layers: Sequence[int] | None = None,
    decoder: NgramDecoder | None = None,
) -> Explanation:
    """Attribute the gates of one ``prompt`` (a string or a prompt dict) at ``positions`` (token
    indices, negative from the end; default all) and ``layers`` (default all Engram layers)."""
    asked = None if positions is None else _indices("positions", positions)
    layer_ids = list(pipeline.layer_ids) if layers is None else _indices("layers", layers)
    trace, xs = _run_capturing(pipeline, prompt)
    n = int(trace.lengths[0])
    bad = [p for p in asked or [] if not -n <= p < n]
    if bad:
        raise AttributionError(
            f"position {bad[0]} is outside the prompt; it has {n} tokens (positions 0..{n - 1}, or -{n}..-1 from the end)"
        )
    pos = np.arange(n) if asked is None else np.asarray([p + n if p < 0 else p for p in asked], np.int64)
    missing = [x for x in layer_ids if x not in pipeline.engrams]
    if missing:
        raise AttributionError(f"layer {missing[0]} is not an Engram layer; expected one of {list(pipeline.layer_ids)}")
    mask = trace.token_types[0, :n] < 0
    layout = EngramLayout(pipeline.config)
    sel = torch.from_numpy(pos)
    got = {site: trace.captured(site) for site in ("rows", "key", "value", "dot", "gate")}
    attributions = {
        layer: attribute_layer(
            pipeline.engrams[layer],
            xs[layer][sel],
            got["rows"][layer][0, sel],
            mask[sel],
            layout,
            forward={site: got[site][layer][0, sel] for site in ("key", "value", "dot", "gate")},
        )
        for layer in layer_ids
    }
    decoder = decoder or NgramDecoder(pipeline.tokenizer)
    li = [pipeline.layer_ids.index(x) for x in layer_ids]
    return Explanation(
        prompt=trace.prompt_ids[0],
        text=trace.texts[0],
        model_label=trace.model_label,
        positions=pos,
        pieces=list(trace.pieces[0]),
        row_ids=trace.row_ids[0, pos][:, li].numpy(),
        ngrams=_decoded_ngrams(trace, decoder, pos, pipeline.config.engram_max_ngram_size),
        layers=attributions,
        provenance=trace.provenance,
    )


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


def order_profile(pipeline: Pipeline, prompts: Iterable[Any]) -> pd.DataFrame:
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
    return provenance_of(pipeline).tag(pd.concat(frames, ignore_index=True))
