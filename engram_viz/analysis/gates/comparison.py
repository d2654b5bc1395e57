"""Two prompts compared per aligned token: the alignment, the per-prompt arrays and the gate difference.

**Alignment.** Prompt B's tokens are aligned to prompt A's by a longest-matching-blocks alignment
of their raw token ids (``difflib``; :func:`align_tokens`): tokens in matching blocks pair up, a
replaced block pairs position by position up to the shorter side, and inserted tokens have no
partner. Aligning tokens rather than raw positions keeps an edit from shifting every later
comparison.

**Difference.** Each paired B token gets ``gate_B - gate_A`` (same layer and stream, or every
layer x stream). Since a position's Engram gate reads only its own stream and the <= 4-token
n-grams ending there, the difference shows how far an edit reaches (with the embedding streams:
exactly 3 tokens past it; with a whole model's streams, further). :func:`gate_difference` is the
tidy table of all layers and streams; :class:`AlignedDifference` the values one view colours.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

STREAM_REDUCTIONS = ("mean", "max", "min")
DIFFERENCE_COLUMNS = [
    "pair",
    "kind",
    "position_a",
    "position_b",
    "token_a",
    "token_b",
    "is_image",
    "layer",
    "stream",
    "gate_a",
    "gate_b",
    "diff",
]

Pair = tuple[int | None, int | None, str]


def align_tokens(ids_a: Sequence[int], ids_b: Sequence[int]) -> list[Pair]:
    """Align two token sequences: ``[(position_a | None, position_b | None, kind)]`` in reading order,
    kind 'equal' (same token), 'replace' (paired position by position inside a replaced block),
    'insert' (only in B) or 'delete' (only in A). Longest matching blocks of ``difflib``, no junk
    heuristic, so the result depends only on the two sequences."""
    a, b = [int(x) for x in ids_a], [int(x) for x in ids_b]
    out: list[Pair] = []
    for op, i0, i1, j0, j1 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            out += [(i0 + k, j0 + k, "equal") for k in range(i1 - i0)]
        elif op == "replace":
            n = min(i1 - i0, j1 - j0)
            out += [(i0 + k, j0 + k, "replace") for k in range(n)]
            out += [(i, None, "delete") for i in range(i0 + n, i1)]
            out += [(None, j, "insert") for j in range(j0 + n, j1)]
        elif op == "delete":
            out += [(i, None, "delete") for i in range(i0, i1)]
        else:
            out += [(None, j, "insert") for j in range(j0, j1)]
    return out


@dataclass
class PromptResult:
    """One prompt as the comparison sees it: its single-prompt Trace and arrays, or its error."""

    text: str
    trace: Any = None  # engram_viz.run.trace.Trace with one prompt
    gates: np.ndarray | None = None  # float32 [T, n_layers, hc]
    input_ids: np.ndarray | None = None  # int64 [T]
    pieces: list[str] | None = None
    is_image: np.ndarray | None = None  # bool [T]
    error: str | None = None

    def __post_init__(self) -> None:
        self._frames: dict[Any, pd.DataFrame] = {}

    @classmethod
    def from_trace(cls, text: str, trace: Any, i: int = 0) -> PromptResult:
        """Prompt ``i`` of ``trace`` as the comparison sees it (a one-prompt Trace of it is kept)."""
        n = int(trace.lengths[i])
        return cls(
            text=text,
            trace=trace.select([trace.prompt_ids[i]]) if len(trace.prompt_ids) > 1 else trace,
            gates=trace.gates[i, :n].numpy().astype(np.float32),
            input_ids=trace.input_ids[i, :n].numpy(),
            pieces=list(trace.pieces[i]),
            is_image=trace.is_image[i, :n].numpy(),
        )

    @property
    def ok(self) -> bool:
        return self.error is None

    def layer_frame(self, layer: int, prompt: str) -> pd.DataFrame:
        """Tidy gates of one layer (prompt, position, token, is_image, layer, stream, gate), built
        straight from the arrays (cached): what ``viz.tokens.token_html`` reads."""
        key = (int(layer), prompt)
        if key not in self._frames:
            li = list(self.trace.layer_ids).index(int(layer))
            g = self.gates[:, li]  # [T, hc]
            n, hc = g.shape
            self._frames[key] = pd.DataFrame(
                {
                    "prompt": prompt,
                    "position": np.repeat(np.arange(n, dtype=np.int64), hc),
                    "token": np.repeat(np.array(self.pieces, dtype=object), hc),
                    "is_image": np.repeat(self.is_image, hc),
                    "layer": int(layer),
                    "stream": np.tile(np.arange(hc, dtype=np.int64), n),
                    "gate": g.reshape(-1).astype(np.float64),
                }
            )
        return self._frames[key]

    def frame(self, prompt: str) -> pd.DataFrame:
        """Tidy gates of every layer (``Trace.to_frame('gates')``), the prompt column set to ``prompt``."""
        if prompt not in self._frames:
            self._frames[prompt] = self.trace.to_frame("gates").assign(prompt=prompt)
        return self._frames[prompt]


def reduce_streams(g: np.ndarray, stream: int | str) -> np.ndarray:
    """``[..., hc] -> [...]``: one stream, or the mean / max / min over streams."""
    if isinstance(stream, str):
        return {"mean": np.mean, "max": np.max, "min": np.min}[stream](g, axis=-1)
    return g[..., int(stream)]


def gate_difference(
    a: PromptResult, b: PromptResult, layer_ids: Sequence[int], *, label_a: str = "A", label_b: str = "B"
) -> pd.DataFrame:
    """Tidy difference table of two prompts, one row per (aligned pair, layer, stream):
    pair, kind, position_a, position_b, token_a, token_b, is_image (B's position, or A's for a
    deletion), layer, stream, gate_a, gate_b, diff (``gate_b - gate_a``; NaN where a side has no
    partner). Image positions compare as 0 - 0."""
    pairs = align_tokens(a.input_ids, b.input_ids)
    n_layers, hc = a.gates.shape[1:]
    n = len(pairs)
    if n == 0:
        return pd.DataFrame(columns=DIFFERENCE_COLUMNS)
    missing = np.full((n_layers, hc), np.nan, np.float32)
    ga = np.stack([a.gates[i] if i is not None else missing for i, _, _ in pairs]).reshape(-1)
    gb = np.stack([b.gates[j] if j is not None else missing for _, j, _ in pairs]).reshape(-1)
    rep = n_layers * hc
    df = pd.DataFrame(
        {
            "pair": np.repeat(np.arange(n), rep),
            "kind": np.repeat(np.array([kind for *_, kind in pairs], dtype=object), rep),
            "position_a": np.repeat([-1 if i is None else i for i, _, _ in pairs], rep),
            "position_b": np.repeat([-1 if j is None else j for _, j, _ in pairs], rep),
            "token_a": np.repeat(np.array(["" if i is None else a.pieces[i] for i, _, _ in pairs], dtype=object), rep),
            "token_b": np.repeat(np.array(["" if j is None else b.pieces[j] for _, j, _ in pairs], dtype=object), rep),
            "is_image": np.repeat([bool(b.is_image[j] if j is not None else a.is_image[i]) for i, j, _ in pairs], rep),
            "layer": np.tile(np.repeat(np.asarray(layer_ids, dtype=np.int64), hc), n),
            "stream": np.tile(np.arange(hc), n * n_layers),
            "gate_a": ga.astype(np.float64),
            "gate_b": gb.astype(np.float64),
        }
    )
    df["diff"] = df["gate_b"] - df["gate_a"]
    df.attrs["prompts"] = (label_a, label_b)
    return df


@dataclass(frozen=True)
class AlignedDifference:
    """B against A per aligned token at one layer and stream (or at every layer x stream).

    ``pairs`` is :func:`align_tokens` of the two prompts, ``paired`` its (position_a, position_b)
    pairs with both sides; ``diff[k]`` is ``gate_B - gate_A`` of ``paired[k]``: float64 [P] for
    one layer and stream (``gate_a`` [T_a], ``gate_b`` [T_b] hold the compared values), or
    [P, n_layers, hc] for all gates (``gate_a``, ``gate_b`` None)."""

    pairs: list[Pair]
    paired: list[tuple[int, int]]
    diff: np.ndarray
    gate_a: np.ndarray | None
    gate_b: np.ndarray | None

    @property
    def all_gates(self) -> bool:
        return self.gate_a is None

    def magnitude(self, k: int) -> float:
        """The largest ``|gate_B - gate_A|`` of paired token ``k``."""
        return float(np.abs(self.diff[k]).max()) if self.all_gates else abs(float(self.diff[k]))

    def counts(self) -> dict[str, int]:
        """How many pairs of each kind: equal, replace, insert, delete."""
        return {
            kind: sum(1 for *_, kd in self.pairs if kd == kind) for kind in ("equal", "replace", "insert", "delete")
        }


def aligned_difference(
    a: PromptResult,
    b: PromptResult,
    layer_ids: Sequence[int],
    *,
    layer: int,
    stream: int | str = "mean",
    all_gates: bool = False,
) -> AlignedDifference:
    """``gate_B - gate_A`` per aligned token pair, at ``layer`` and ``stream`` (a stream index or a
    reduction of :data:`STREAM_REDUCTIONS`), or at every layer x stream when ``all_gates``."""
    pairs = align_tokens(a.input_ids, b.input_ids)
    paired = [(i, j) for i, j, kind in pairs if i is not None and j is not None]
    li = list(layer_ids).index(int(layer))
    if all_gates:
        da = np.stack([a.gates[i] for i, _ in paired]) if paired else np.zeros((0, *a.gates.shape[1:]))
        db = np.stack([b.gates[j] for _, j in paired]) if paired else np.zeros((0, *b.gates.shape[1:]))
        return AlignedDifference(pairs, paired, db - da, None, None)
    va, vb = reduce_streams(a.gates[:, li], stream), reduce_streams(b.gates[:, li], stream)
    d_sel = np.array([vb[j] - va[i] for i, j in paired], dtype=np.float64)
    return AlignedDifference(pairs, paired, d_sel, va, vb)
