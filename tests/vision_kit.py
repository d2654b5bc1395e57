"""The vision path written with the reference's structure (seed: ``inference/vision.py`` and
``image_processor.py``), for the vision tests (not a test module).

Nothing here imports the suite's vision modules: ``RefViT`` / ``RefAligner`` are ``nn.Module`` trees
laid out as the reference's (patch embedding, blocks of RMSNorm + attention with 2-D RoPE + SwiGLU
MLP, a final norm; the aligner's unfold over d x d cells), built under a bf16 default dtype as the
reference runs them, and loaded by checkpoint name. ``fitted_canvas`` / ``patches_by_hand`` compute the
pre-processing independently: the fitted size by its own arithmetic, the grey canvas and the paste
with numpy, the normalisation in numpy float32, the patch order with explicit loops. Test images
(gradients, text drawn with Pillow) come from :func:`gradient` and :func:`text_card`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageDraw
from torch import nn

from engram_viz.core.vision_config import VisionConfig

SMALL_VISION = VisionConfig(
    dim=64, vision_n_layers=2, vision_dim=64, vision_n_heads=4, vision_inter_dim=96, vision_patch_size=14
)


class RefNorm(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x.float()
        y = y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + 1e-6)
        return (self.weight * y).to(x.dtype)


def ref_angles(n_h: int, n_w: int, rope_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    half = rope_dim // 2
    freq = torch.tensor([1.0 / theta ** (2 * j / rope_dim) for j in range(half)], dtype=torch.float32)
    ang = torch.zeros(n_h * n_w, rope_dim)
    for r in range(n_h):
        for c in range(n_w):
            ang[r * n_w + c, :half] = r * freq
            ang[r * n_w + c, half:] = c * freq
    return ang.cos()[:, None], ang.sin()[:, None]


def ref_rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    hd = x.shape[-1]
    a, b = x.float()[..., : hd // 2], x.float()[..., hd // 2 :]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], -1).to(x.dtype)


class RefAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.heads = cfg.vision_n_heads
        self.wqkv = nn.Linear(cfg.vision_dim, 3 * cfg.vision_dim)
        self.wo = nn.Linear(cfg.vision_dim, cfg.vision_dim)

    def forward(self, x, cos, sin):
        n, vd = x.shape
        q, k, v = self.wqkv(x).split(vd, -1)
        q, k, v = (t.reshape(n, self.heads, -1).transpose(0, 1) for t in (q, k, v))
        q, k = (
            ref_rotate(q, cos.transpose(0, 1), sin.transpose(0, 1)),
            ref_rotate(k, cos.transpose(0, 1), sin.transpose(0, 1)),
        )
        o = F.scaled_dot_product_attention(q, k, v)
        return self.wo(o.transpose(0, 1).reshape(n, vd))


class RefMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.vision_dim, 2 * cfg.vision_inter_dim, bias=False)
        self.w2 = nn.Linear(cfg.vision_inter_dim, cfg.vision_dim, bias=False)

    def forward(self, x):
        g, u = self.w1(x).split(self.w2.in_features, -1)
        return self.w2(F.silu(g) * u)


class RefBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1, self.attn = RefNorm(cfg.vision_dim), RefAttention(cfg)
        self.norm2, self.mlp = RefNorm(cfg.vision_dim), RefMLP(cfg)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class RefPatchEmbed(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.proj = nn.Linear(cfg.patch_pixels, cfg.vision_dim)


class RefViT(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = RefPatchEmbed(cfg)
        self.blocks = nn.ModuleList(RefBlock(cfg) for _ in range(cfg.vision_n_layers))
        self.norm = RefNorm(cfg.vision_dim)

    def forward(self, patches, n_h, n_w):
        x = self.patch_embed.proj(patches.reshape(patches.shape[0], -1))
        cos, sin = ref_angles(n_h, n_w, self.cfg.head_dim // 2, self.cfg.vision_rope_theta)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        return self.norm(x)


class RefAligner(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.d = cfg.vision_downsample_ratio
        self.w1 = nn.Linear(cfg.vision_dim * self.d**2, cfg.dim)
        self.w2 = nn.Linear(cfg.dim, cfg.dim)

    def forward(self, x, n_h, n_w):
        d, vd = self.d, x.shape[-1]
        gh, gw = -(-n_h // d), -(-n_w // d)
        grid = torch.zeros(gh * d, gw * d, vd, dtype=x.dtype)
        grid[:n_h, :n_w] = x.reshape(n_h, n_w, vd)
        cells = []
        for i in range(gh):
            for j in range(gw):  # channel-major inside a cell: c, then row, then column
                cells.append(grid[i * d : (i + 1) * d, j * d : (j + 1) * d].permute(2, 0, 1).reshape(-1))
        return self.w2(F.gelu(self.w1(torch.stack(cells))))


class RefVision(nn.Module):
    """``vision`` + ``aligner`` + the learned delimiters, under the checkpoint's names."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        prev = torch.get_default_dtype()
        torch.set_default_dtype(torch.bfloat16)  # as the reference's generate.py
        try:
            self.vision, self.aligner = RefViT(cfg), RefAligner(cfg)
            self.image_start = nn.Parameter(torch.empty(cfg.dim))
            self.image_end = nn.Parameter(torch.empty(cfg.dim))
            self.image_newline = nn.Parameter(torch.empty(cfg.dim))
        finally:
            torch.set_default_dtype(prev)

    @torch.inference_mode()
    def features(self, patches, n_h, n_w):
        return self.aligner(self.vision(patches, n_h, n_w), n_h, n_w)

    @torch.inference_mode()
    def merged(self, h: torch.Tensor, start: int, types: torch.Tensor, patches, n_h, n_w) -> torch.Tensor:
        """``h [T, dim]`` with one picture's span written as the reference's merge does."""
        h = h.clone()
        feats = iter(self.features(patches, n_h, n_w))
        for k, t in enumerate(types.tolist()):
            h[start + k] = (
                {0: self.image_start, 2: self.image_newline, 3: self.image_end}.get(t) if t != 1 else next(feats)
            )
        return h


def load_ref_vision(cfg: VisionConfig, tensors: dict[str, torch.Tensor]) -> RefVision:
    model = RefVision(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(tensors[name].to(p.dtype))
    return model


# -- pre-processing, by hand -----------------------------------------------------------------------


def fitted_canvas(rgb: np.ndarray, canvas_w: int, canvas_h: int) -> np.ndarray:
    """The picture scaled (bicubic) to fit inside the canvas keeping its aspect ratio, centred on grey 127."""
    h, w = rgb.shape[:2]
    if w * canvas_h > h * canvas_w:  # wider than the canvas: full width
        new_w, new_h = canvas_w, round(h / w * canvas_w)
    elif w * canvas_h < h * canvas_w:
        new_w, new_h = round(w / h * canvas_h), canvas_h
    else:
        new_w, new_h = canvas_w, canvas_h
    scaled = np.asarray(Image.fromarray(rgb).resize((new_w, new_h), Image.Resampling.BICUBIC))
    out = np.full((canvas_h, canvas_w, 3), 127, dtype=np.uint8)
    x0, y0 = round((canvas_w - new_w) / 2), round((canvas_h - new_h) / 2)
    out[y0 : y0 + new_h, x0 : x0 + new_w] = scaled
    return out


def patches_by_hand(canvas: np.ndarray, p: int) -> torch.Tensor:
    """bf16 ``[n_h * n_w, 3, p, p]``: (v / 255 - 0.5) / 0.5 in float32 per pixel, patches in reading order."""
    x = ((canvas.astype(np.float32) / np.float32(255)) - np.float32(0.5)) / np.float32(0.5)
    n_h, n_w = canvas.shape[0] // p, canvas.shape[1] // p
    out = np.empty((n_h * n_w, 3, p, p), dtype=np.float32)
    for r in range(n_h):
        for c in range(n_w):
            out[r * n_w + c] = x[r * p : (r + 1) * p, c * p : (c + 1) * p].transpose(2, 0, 1)
    return torch.from_numpy(out).to(torch.bfloat16)


# -- test pictures ------------------------------------------------------------------------------


def gradient(width: int, height: int) -> np.ndarray:
    """RGB uint8 ``[height, width, 3]``: red across, green down, blue along the diagonal."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return np.stack([x, y, (x + y) / 2], -1).round().astype(np.uint8)


def text_card(width: int, height: int, text: str = "Engram sees pictures") -> np.ndarray:
    """RGB uint8: dark text drawn with Pillow's default font on a light background, with a frame."""
    img = Image.new("RGB", (width, height), (240, 236, 220))
    draw = ImageDraw.Draw(img)
    draw.rectangle([2, 2, width - 3, height - 3], outline=(30, 60, 120), width=3)
    for k in range(max(1, height // 40)):
        draw.text((8, 8 + 40 * k), f"{text} {k}", fill=(20, 20, 20))
    return np.asarray(img)


def span_size(w: int, h: int) -> int:
    return h * (w + 1) + 2


def cells(n: int, d: int) -> int:
    return math.ceil(n / d)
