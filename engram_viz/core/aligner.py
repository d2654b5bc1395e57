"""The aligner (reference ``vision.py``: ``Aligner``): ViT features -> image tokens of the model's width.

Each d x d cell of the patch grid (d = ``vision_downsample_ratio``; a grid that is not a multiple of d
is padded with zero features on the right and bottom, so partial cells count) becomes one token::

    x     = features viewed [n_h, n_w, vd] -> [vd, n_h, n_w], zero-padded to multiples of d
    cells = unfold(x, d, stride d) -> [L, vd * d * d]     L = ceil(n_h / d) * ceil(n_w / d), cells in
                                                           reading order; a cell's vector is channel-major
                                                           (channel c, then row r, then column s of the cell)
    out   = w2(gelu(w1(cells)))                           bf16 [L, dim]  (linears with biases, exact gelu)

The L rows fill the span's IMAGE slots in reading order (``core.image_merge``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engram_viz.core.vit import VisionSource


def aligner(features: torch.Tensor, n_h: int, n_w: int, src: VisionSource) -> torch.Tensor:
    """ViT features bf16 ``[n_h * n_w, vision_dim]`` -> image tokens bf16 ``[ceil(n_h/d) * ceil(n_w/d), dim]``."""
    d = src.config.vision_downsample_ratio
    with torch.no_grad():
        x = features.view(n_h, n_w, -1).permute(2, 0, 1)  # [vd, n_h, n_w]
        x = F.pad(x, (0, -n_w % d, 0, -n_h % d))
        cells = F.unfold(x.unsqueeze(0), d, stride=d).squeeze(0).transpose(0, 1)  # [L, vd * d * d]
        hidden = F.gelu(F.linear(cells, src.tensor("aligner.w1.weight"), src.tensor("aligner.w1.bias")))
        return F.linear(hidden, src.tensor("aligner.w2.weight"), src.tensor("aligner.w2.bias"))
