"""Issue 25's must-show numbers: a real picture's features, streams and layer-1 gates against the
reference-structured model, and how far its placeholder twin's gates are.

    python benchmarks/vision_must_show.py [--out benchmarks/results/vision_must_show.txt]

On the small synthetic checkpoint of tests/integration/test_vision_streams.py (tiny config without its
minimum area, block 0 of tests/block0_kit.SMALL: window 8, vision tower tests/vision_kit.SMALL_VISION, seed 0)
and the prompt "Look at this: <image> It shows the Great Wall of China, a long wall on the hills.", for
pictures of several sizes made here (a gradient, text drawn with Pillow):

- features: ``core.image_merge.encode_image`` vs the reference-structured tower (tests/vision_kit.RefVision):
  largest difference in bf16 steps and the share of bit-equal values;
- streams of the text after the picture: ``core.block0.block0_streams`` with the tower vs the float64 block 0
  (tests/block0_kit.F64Block0) started from the reference's merged embeddings: bf16 steps (max) and the
  relative error per position (median, max);
- layer-1 gates of the text after the picture, ours vs the float64 streams: max and p99 |difference|;
- the placeholder twin (the same span, no image features) vs the float64 streams: max and p99 |difference|
  over the text after the picture, over the positions block 0's window still reaches from the span, and the
  largest beyond them (where the twins read the same streams again).
"""

from __future__ import annotations

import argparse
import io
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch
from PIL import Image

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from block0_kit import SMALL, F64Block0, load_all
from vision_kit import SMALL_VISION, gradient, load_ref_vision, text_card

from engram_viz.config import load_config
from engram_viz.core.block0 import block0_streams
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.image_merge import ImageInput, encode_image
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.run.images import build_input
from engram_viz.weights.block0_reader import open_block0
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint
from engram_viz.weights.vision_reader import open_vision

CONFIG = replace(load_config("tiny"), name="tiny-small-pictures", vision_min_pixels=0)
TEXT = "Look at this: <image> It shows the Great Wall of China, a long wall on the hills."
SIZES = [(gradient, 84, 56), (text_card, 150, 100), (text_card, 60, 200), (gradient, 640, 480)]


def steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| in bf16 steps of b (a step of each value, at least 2^-8 of its row's largest)."""
    step = torch.maximum(b.double().abs(), b.double().abs().amax(-1, keepdim=True) * 2**-8) * 2**-7
    return float(((a.double() - b.double()).abs() / step).max())


def p99(x: torch.Tensor) -> float:
    return float(torch.quantile(x.double().flatten(), 0.99))


def case(parts, engram, make, w: int, h: int) -> str:
    b0, vision, ref, f64 = parts
    buf = io.BytesIO()
    Image.fromarray(make(w, h)).save(buf, format="PNG")
    built = build_input(TEXT, config=CONFIG, images=[buf.getvalue()])
    (span,) = built.spans
    plan = span.picture.plan
    types = torch.from_numpy(built.token_types)
    img = ImageInput(span.start, types[span.start : span.stop], span.picture.patches, plan.vit_h, plan.vit_w)
    ids, types = torch.from_numpy(built.input_ids)[None], types[None]

    ours_f = encode_image(vision, img.patches, img.n_h, img.n_w)
    theirs_f = ref.features(img.patches, img.n_h, img.n_w)
    equal_f = float((ours_f.float() == theirs_f.float()).double().mean())

    image = types >= 0
    x = block0_streams(b0, ids, image, [[img]], vision)
    h0 = ref.merged(b0.embed(ids)[0].to(torch.bfloat16), img.start, img.types, img.patches, img.n_h, img.n_w)
    xr = f64.streams(ids, image, h0[None])
    after = slice(span.stop, ids.shape[1])
    rel = (x[0, after].double() - xr[0, after]).norm(dim=-1) / xr[0, after].norm(dim=-1)

    mask = ~image
    hashes = hash_prompt(CONFIG, get_tokenizer(CONFIG).token_map, ids, mask)
    gates = {}
    for name, s in (("ours", x), ("f64", xr.float()), ("placeholder", block0_streams(b0, ids, image))):
        with engram.hook_gate.add_hook(lambda t, n, name=name: gates.__setitem__(name, t[0, after].clone())):
            engram(s, hashes[:, :, 0], mask)
    ours = (gates["ours"] - gates["f64"]).abs()
    twin = (gates["placeholder"] - gates["f64"]).abs()
    near, far = twin[: SMALL.window_size], twin[SMALL.window_size :]
    return (
        f"{w:>4}x{h:<4} grid {span.width}x{span.height:<3} {ids.shape[1] - span.stop:>3} text positions after | "
        f"features: {steps(ours_f, theirs_f):.2f} steps max, {equal_f:.1%} bit-equal | "
        f"streams: {steps(x[0, after], xr[0, after]):.2f} steps max, rel err median {float(rel.median()):.1e} "
        f"max {float(rel.max()):.1e} | layer-1 gates: max {float(ours.max()):.1e} p99 {p99(ours):.1e} | "
        f"placeholder twin: max {float(twin.max()):.3f} p99 {p99(twin):.3f} "
        f"(the {len(near)} positions block 0's window reaches from the span: max {float(near.max()):.3f} "
        f"p99 {p99(near):.3f}; the {len(far)} beyond it: max {float(far.max()):.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="also write the lines to this file")
    args = parser.parse_args()
    lines = [
        (
            f"checkpoint: SYNTHETIC {CONFIG.name} (seed 0), block 0 of tests/block0_kit.SMALL (window "
            f"{SMALL.window_size}), vision tower tests/vision_kit.SMALL_VISION ({SMALL_VISION.vision_n_layers} "
            f"layers, width {SMALL_VISION.vision_dim}); torch {torch.__version__}, {torch.get_num_threads()} threads"
        ),
        f"prompt: {TEXT!r}",
        "command: PYTHONPATH=. python benchmarks/vision_must_show.py --out benchmarks/results/vision_must_show.txt",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_synthetic_checkpoint(Path(tmp) / "ckpt", CONFIG, seed=0, block0=SMALL, vision=SMALL_VISION)
        tensors = load_all(folder)
        parts = (
            open_block0(folder),
            open_vision(folder),
            load_ref_vision(SMALL_VISION, tensors),
            F64Block0(tensors, SMALL),
        )
        ckpt = open_checkpoint(folder)
        engram = Engram.from_weights(ckpt.config, ckpt.layer(1), mode="fp8", device="cpu")
        for make, w, h in SIZES:
            lines.append(case(parts, engram, make, w, h))
            print(lines[-1], flush=True)
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
