"""A real picture beside its placeholder twin: how much the image features move the gates after it.

The twin is the same prompt with ``<image:WxHpx>`` of each picture's size in its place: the same span
(same grid, positions and token types), the same hashes and the same shut gates inside it, but no image
features. Every difference in the gates of the text after the span comes from the picture's features
reaching that text through the blocks (block 0's attention window, for ``streams="block0"``). On streams
that merge no image features (the tiny LM, ``"embedding"``) the twins agree exactly, and the frames'
streams label says so.

- :func:`picture_vs_placeholder` ``(pipe, before, picture, after)``: one picture between two texts;
- :func:`prompt_vs_placeholder` ``(pipe, prompt)``: any prompt holding real pictures (a dict, a Prompt);
- :func:`picture_twins` ``(pipe, prompts)``: the first prompts of a set that hold real pictures
  (what the report's section shows); :func:`twin_summary` the largest differences per prompt and layer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from engram_viz.errors import InputError
from engram_viz.run.images import PLACEHOLDER, ImageSpan
from engram_viz.run.pipeline import Pipeline

TWIN_COLUMNS = [
    "prompt",
    "position",
    "k_after_image",
    "token",
    "layer",
    "stream",
    "gate_picture",
    "gate_placeholder",
    "difference",
]
MAX_TWINS = 4  # prompts with pictures the report compares


def _field(p: Any, key: str, default: Any = None) -> Any:
    return p.get(key, default) if isinstance(p, dict) else getattr(p, key, default)


def twin_text(text: str, spans: Sequence[ImageSpan]) -> str:
    """``text`` with each real picture's placeholder (``<image:path>`` or a bare ``<image>``)
    replaced by ``<image:WxHpx>`` of its size; ``spans``: the built prompt's spans, in text order."""
    found = iter(spans)

    def swap(match: Any) -> str:
        span = next(found)
        if span.picture is None:
            return match.group(0)
        w, h = span.picture.size
        return f"<image:{w}x{h}px>"

    return PLACEHOLDER.sub(swap, text)


def prompt_vs_placeholder(pipe: Pipeline, prompt: Any) -> pd.DataFrame:
    """Gates of the text after the first real picture of ``prompt`` (a dict or Prompt with ``text``
    and, for bare ``<image>``, ``images``) beside its placeholder twin's. One row per (position,
    layer, stream) of the text after that span (image positions of later spans left out):
    ``TWIN_COLUMNS``; ``k_after_image`` counts from the end of the latest picture before the position.
    The frame's attrs carry the run's provenance (its streams label says which spans had features)."""
    built = pipe.build([prompt])[0]
    stops = [s.stop for s in built.spans if s.picture is not None]
    if not stops:
        raise InputError(f"prompt {built.id!r} holds no real picture (<image:path> or <image> with images=[...])")
    twin = {"id": f"{built.id} (placeholder twin)", "text": twin_text(str(_field(prompt, "text")), built.spans)}
    trace = pipe.run([prompt, twin])
    gates = trace.to_frame("gates")
    keys = ["position", "layer", "stream"]
    after = gates[(gates["position"] >= stops[0]) & ~gates["is_image"].astype(bool)]
    real = after[after["prompt"] == built.id].set_index(keys)
    placeholder = after[after["prompt"] == twin["id"]].set_index(keys)
    out = real[["token"]].assign(gate_picture=real["gate"], gate_placeholder=placeholder["gate"]).reset_index()
    out["difference"] = out["gate_picture"] - out["gate_placeholder"]
    last_stop = np.asarray(stops)[np.searchsorted(stops, out["position"].to_numpy(), side="right") - 1]
    out.insert(0, "prompt", built.id)
    out.insert(2, "k_after_image", out["position"] - last_stop)
    out = out[TWIN_COLUMNS]
    out.attrs = dict(gates.attrs)
    return out


def picture_vs_placeholder(pipe: Pipeline, before: str, picture: Any, after: str) -> pd.DataFrame:
    """Gates of the text after ``picture`` (a path, PNG/JPEG bytes or a Pillow image) in
    ``before <image> after`` beside its placeholder twin's (:func:`prompt_vs_placeholder`, prompt
    id ``"picture"``)."""
    return prompt_vs_placeholder(
        pipe, {"id": "picture", "category": "image", "text": f"{before}<image>{after}", "images": [picture]}
    )


def picture_twins(pipe: Pipeline, prompts: Sequence[Any], limit: int = MAX_TWINS) -> pd.DataFrame:
    """:func:`prompt_vs_placeholder` of the first ``limit`` prompts that hold a real picture, one
    frame (``TWIN_COLUMNS``); empty when none does."""
    parts = []
    for prompt in prompts:
        if len(parts) >= limit:
            break
        if _field(prompt, "text") is None or _field(prompt, "input_ids") is not None:
            continue  # random-token controls and pre-tokenized prompts name no pictures
        if any(s.picture is not None for s in pipe.build([prompt])[0].spans):
            parts.append(prompt_vs_placeholder(pipe, prompt))
    if not parts:
        return pd.DataFrame(columns=TWIN_COLUMNS)
    out = pd.concat(parts, ignore_index=True)
    out.attrs = dict(parts[0].attrs)
    return out


def twin_summary(twins: pd.DataFrame) -> pd.DataFrame:
    """Per prompt and layer: text positions after the picture, the largest and the 99th-percentile
    absolute gate difference over those positions and streams, and where the largest is (position, token)."""
    rows = []
    for (prompt, layer), part in twins.groupby(["prompt", "layer"], sort=False):
        size = part["difference"].abs()
        top = part.loc[size.idxmax()]
        rows.append(
            {
                "prompt": prompt,
                "layer": int(layer),
                "positions": int(part["position"].nunique()),
                "max_abs_difference": float(size.max()),
                "p99_abs_difference": float(np.percentile(size, 99)),
                "at_position": int(top["position"]),
                "at_token": top["token"],
            }
        )
    return pd.DataFrame(rows)
