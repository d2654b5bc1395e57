"""After an image, text hashes as a fresh sequence: the n-grams reaching into the image are blocked."""

from __future__ import annotations

import pandas as pd
import torch

from engram_viz.core.hashing import hash_prompt
from engram_viz.run.images import build_input
from engram_viz.run.pipeline import Pipeline


def after_image_vs_fresh_start(
    pipe: Pipeline, text_after: str, before: str = "A photo: ", grid: str = "4x3"
) -> pd.DataFrame:
    """The first tokens after an image hash as a sequence start: the row ids of ``text_after``
    following ``before <image:grid>`` against those of ``text_after`` run alone without BOS
    (a fresh sequence). One row per token of ``text_after``: position after the image, token,
    equal_rows (all 24 x n_layers row ids equal), and orders blocked (n-grams reaching into the
    image). Uses the hasher directly (no weights needed)."""
    with_img = build_input(f"{before}<image:{grid}>{text_after}", pipe.tokenizer, pipe.config, bos=True)
    alone = build_input(text_after, pipe.tokenizer, pipe.config, bos=False)
    start = with_img.spans[-1].stop
    ids_img = torch.from_numpy(with_img.input_ids)[None]
    rows_img = hash_prompt(pipe.config, pipe.tokenizer.token_map, ids_img, torch.from_numpy(with_img.token_mask)[None])
    rows_alone = hash_prompt(pipe.config, pipe.tokenizer.token_map, torch.from_numpy(alone.input_ids)[None])
    n = min(len(alone.input_ids), len(with_img.input_ids) - start)
    pieces = pipe.tokenizer.pieces(alone.input_ids[:n].tolist())
    recs = []
    for k in range(n):
        a, b = rows_img[0, start + k], rows_alone[0, k]
        recs.append(
            {
                "position": start + k,
                "k_after_image": k,
                "token": pieces[k],
                "same_token": bool(with_img.input_ids[start + k] == alone.input_ids[k]),
                "equal_rows": bool(torch.equal(a, b)),
                "orders_reaching_image": [o for o in pipe.config.ngram_orders if o - 1 > k],
            }
        )
    return pd.DataFrame(recs)
