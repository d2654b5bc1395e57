"""The blocks' must-show grid: streams entering the last Engram layer vs the reference-structured model.

    python benchmarks/blocks_grid.py [--out benchmarks/results/blocks_grid.txt]

On the small checkpoints of tests/blocks_kit.py (Engram layers 1 and 6, compressed blocks 2-5, index_topk 16),
3 seeds x 2 widths x prompts of 8, 300 and 1,200 tokens (one image span past 20 tokens), two ways:

- "same Engram": engram_viz's blocks with the reference-structured model's own Engram layer between them;
- "own Engram": ``Pipeline(streams="model")``, engram_viz's blocks chained with its own Engram layers
  (``core.engram``, their wkv on the blocks' float32 GEMM operands: ``run.block_streams.ENGRAM_GEMM``).

Printed per case: the largest stream difference in bf16 steps and the share of bit-equal values, the
layer-6 gate difference (max, p99) and whether the row ids are identical.

First, the cause of the divergence the "own Engram" cases showed before the Engram layers took the blocks'
GEMM (``--cause``: dim 64, seed 1, 1,200 tokens): our layer-1 Engram with the bf16-operand wkv GEMM (what
``gemm="auto"`` picks on a CPU with bf16 kernels) and with the float32 one against the reference's, then
block by block how far the streams after it drift and at how many queries the indexer chooses other
compressed positions.

Last, on a small-width checkpoint with V4.1-Flash's own layer numbers (Engram layers 1 and 14, 14 blocks,
kv / index sources 2 and 8), ``engram-viz report --streams model`` and the streams label it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from blocks_kit import SMALL_V41, engram_config, our_streams, prompt, reference_engram_streams, write
from reference_blocks import Transformer

from engram_viz.cli import main as cli
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.blocks import BlockPass
from engram_viz.core.engram import Engram
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.core.wkv import native_bf16
from engram_viz.errors import Bf16GemmError
from engram_viz.settings import CACHE
from engram_viz.weights.blocks_reader import open_blocks
from engram_viz.weights.checkpoint import open_checkpoint
from engram_viz.weights.synthetic import write_synthetic_checkpoint


def steps(a: torch.Tensor, b: torch.Tensor) -> float:
    step = torch.maximum(b.float().abs(), b.float().abs().amax(-1, keepdim=True) * 2**-8) * 2**-7
    return float(((a.float() - b.float()).abs() / step).max())


def case(folder: Path, dim: int, seed: int, tokens: int) -> list[str]:
    ids, types = prompt(tokens, seed, image_at=3 if tokens > 20 else None)
    cfg = engram_config(dim)
    ref = Transformer(folder, cfg, get_tokenizer(cfg).token_map)
    want, want_gates = ref.streams(ids, types)
    out = []
    for how, (got, gates, rows) in (
        ("same Engram", reference_engram_streams(folder, ids, types, ref)),
        ("own Engram", our_streams(folder, ids, types)),
    ):
        d = (gates[6] - want_gates[6]).abs().flatten()
        same_rows = torch.equal(rows.long(), ref.hasher(ids, 0, types < 0).long())
        out.append(
            f"dim {dim:3d} seed {seed} T {tokens:4d} {how:11s}: streams L6 {steps(got[6], want[6]):9.2f} bf16 steps, "
            f"{float((got[6] == want[6]).float().mean()):7.2%} bit-equal; gates L6 max {float(d.max()):.2e} "
            f"p99 {float(d.quantile(0.99)):.2e}; row ids identical {same_rows}"
        )
    return out


def _pass_with(folder: Path, ids: torch.Tensor, types: torch.Tensor, engram1) -> list[tuple]:
    """(block, streams after it, indexer's chosen positions or None) of blocks 1-5, continuing from
    ``engram1(streams entering layer 1)``; entry 0 is the layer-1 Engram output itself."""
    src = open_blocks(folder)
    seen: list[tuple] = []

    def record(n: int) -> None:
        if n >= 1:
            chosen = run.shared.chosen if n in src.config.index_source_layers else None
            seen.append((n, run.h.clone(), None if chosen is None else chosen.clone()))

    run = BlockPass(src, ids, types >= 0, on_block=record)
    with torch.no_grad():
        out = engram1(run.streams_entering(1)).to(torch.bfloat16)
    seen.append((0, out, None))
    run.engram_output(out)
    run.streams_entering(6)
    return seen


def cause(folder: Path, dim: int, seed: int, tokens: int) -> list[str]:
    """Where "own Engram" first differed from the model and how the blocks after layer 1 grow it (docstring)."""
    ids, types = prompt(tokens, seed, image_at=3)
    cfg = engram_config(dim)
    ref = Transformer(folder, cfg, get_tokenizer(cfg).token_map)
    rows = hash_prompt(cfg, get_tokenizer(cfg).token_map, ids, types < 0)[:, :, 0]
    want = _pass_with(folder, ids, types, lambda x: ref.engrams[1](x, rows, types < 0))
    ckpt = open_checkpoint(folder)
    head = f"dim {dim} seed {seed} T {tokens}, CPU bf16 kernels {native_bf16(torch.device('cpu'))}"
    out = []
    for gemm in ("bf16", "float32"):
        e = Engram.from_weights(ckpt.config, ckpt.layer(1), mode="fp8", device="cpu", gemm=gemm)
        try:
            with torch.no_grad():
                kv, kv_ref = (
                    e.wkv(e.gather(rows).flatten(-2)),
                    ref.engrams[1].wkv(ref.engrams[1].embed(rows).flatten(-2)),
                )
        except Bf16GemmError as err:
            out.append(f"{head}, wkv gemm {gemm}: {err}")
            continue
        got = _pass_with(folder, ids, types, lambda x, e=e: e(x, rows, types < 0))
        out.append(
            f"{head}, wkv gemm {gemm}: layer-1 kv {int((kv != kv_ref).sum())} of {kv.numel():,} values differ "
            f"(max {steps(kv, kv_ref):.2f} bf16 steps)"
        )
        for (n, h, chosen), (_, h_ref, chosen_ref) in zip(got, want, strict=True):
            where = (h != h_ref).flatten(2).any(-1)[0].nonzero().flatten().tolist()
            line = f"  {'layer-1 Engram output' if n == 0 else f'after block {n}'}: {int((h != h_ref).sum())} values"
            line += f" at {len(where)} positions differ (first {where[0] if where else '-'}), max {steps(h, h_ref):.2f} bf16 steps"
            if chosen is not None:
                line += f"; indexer chooses other positions for {int((chosen != chosen_ref).any(-1).sum())} queries"
            out.append(line)
    return out


def v41_layout_report(tmp: Path) -> str:
    raw = load_config("tiny").to_dict()
    raw.pop("name")
    raw.update(n_layers=40, engram_layer_ids=[1, 14])
    ecfg = EngramConfig.from_dict(raw, "tiny-v41-layout")
    folder = write_synthetic_checkpoint(tmp / "v41-layout", ecfg, seed=0, blocks=SMALL_V41)
    prompts = tmp / "p.jsonl"
    texts = ["Alexander the Great was a king of Macedon.", "The Great Wall of China <image:28x28px> is long."]
    prompts.write_text(
        "".join(json.dumps({"id": f"q{i}", "category": "t", "text": t}) + "\n" for i, t in enumerate(texts))
    )
    out = tmp / "report"
    rc = cli(
        [
            "report",
            "--checkpoint",
            str(folder),
            "--streams",
            "model",
            "--prompts",
            str(prompts),
            "--out",
            str(out),
            "--device",
            "cpu",
            "--quiet",
        ]
    )
    prov = json.loads((out / "manifest.json").read_text())["provenance"]
    return f"report exit {rc}; streams_mode {prov['streams_mode']!r}; label: {prov['streams']}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--tokens", type=int, nargs="*", default=[300, 1200, 8], help="prompt lengths (default all)")
    p.add_argument("--cause", action="store_true", help="only the cause section (dim 64, seed 1, 1,200 tokens)")
    args = p.parse_args()
    argv = " ".join(sys.argv[1:])
    lines = [f"# python benchmarks/blocks_grid.py {argv} ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"]

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        os.environ[CACHE] = str(Path(tmp) / "cache")  # the streams cache of these passes goes with them
        folders = {(d, s): write(Path(tmp) / f"c{d}-{s}", d, s) for d in (64, 128) for s in (0, 1, 2)}
        say("Cause (before the fix the own-Engram case below diverged):")
        for line in cause(folders[(64, 1)], 64, 1, 1200):
            say(line)
        if args.cause:
            return
        for tokens in args.tokens:  # the indexer's cases first
            for (dim, seed), folder in folders.items():
                for line in case(folder, dim, seed, tokens):
                    say(line)
        say("V4.1-Flash layer numbers at small widths: " + v41_layout_report(Path(tmp)))


if __name__ == "__main__":
    main()
