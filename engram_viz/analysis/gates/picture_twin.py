"""A real picture beside its placeholder twin: how much the image features move the gates after it.

The twin is the same prompt with ``<image:WxHpx>`` of the picture's size in its place: the same span
(same grid, positions and token types), the same hashes and the same shut gates inside it, but no image
features. Every difference in the gates of the text after the span comes from the picture's features
reaching that text through the blocks (block 0's attention window, for ``streams="block0"``).
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from engram_viz.run.pictures import open_image
from engram_viz.run.pipeline import Pipeline


def picture_vs_placeholder(pipe: Pipeline, before: str, picture: Any, after: str) -> pd.DataFrame:
    """Gates of the text after ``picture`` (a path, PNG/JPEG bytes or a Pillow image) in
    ``before <image> after``, beside its placeholder twin's. One row per (position, layer, stream) of
    the text after the span: position, k_after_image, token, layer, stream, gate_picture,
    gate_placeholder, difference (picture - placeholder). The frame's attrs carry the run's
    provenance (its streams label says which spans had image features)."""
    image, _ = open_image(picture)
    twin = f"<image:{image.width}x{image.height}px>"
    trace = pipe.run(
        [
            {"id": "picture", "category": "image", "text": f"{before}<image>{after}", "images": [picture]},
            {"id": "placeholder", "category": "image", "text": f"{before}{twin}{after}"},
        ]
    )
    stop = trace.meta["image_spans"]["picture"][0]["stop"]
    gates = trace.to_frame("gates")
    keys = ["position", "layer", "stream"]
    after_span = gates[gates["position"] >= stop]
    real = after_span[after_span["prompt"] == "picture"].set_index(keys)
    placeholder = after_span[after_span["prompt"] == "placeholder"].set_index(keys)
    out = real[["token"]].assign(gate_picture=real["gate"], gate_placeholder=placeholder["gate"]).reset_index()
    out["difference"] = out["gate_picture"] - out["gate_placeholder"]
    out.insert(1, "k_after_image", out["position"] - stop)
    out.attrs = dict(gates.attrs)
    return out
