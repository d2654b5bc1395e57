"""The blocks' must-show grid: streams entering the last Engram layer vs the reference-structured model.

    python benchmarks/blocks_grid.py [--out benchmarks/results/blocks_grid.txt]

On the small checkpoints of tests/blocks_kit.py (Engram layers 1 and 6, compressed blocks 2-5, index_topk 16),
3 seeds x 2 widths x prompts of 8, 300 and 1,200 tokens (one image span past 20 tokens), two ways:

- "same Engram": engram_viz's blocks with the reference-structured model's own Engram layer between them
  (what tests/integration/test_blocks_streams.py asserts for 4 of these cases);
- "own Engram": engram_viz's blocks and its own Engram layer (``core.engram``) vs the model end to end. The two
  Engram implementations differ by fp32 summation order in ``wkv`` (one bf16 step in a few elements), which
  these random-weight stacks may amplify on long prompts.

Printed per case: the largest stream difference in bf16 steps and the share of bit-equal values, the
layer-6 gate difference (max, p99) and whether the row ids are identical. Then, on a small-width checkpoint
with V4.1-Flash's own layer numbers (Engram layers 1 and 14, 14 blocks, kv / index sources 2 and 8),
``engram-viz report --streams model`` and the streams label it prints.
"""

from __future__ import annotations

import argparse
import json
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
from engram_viz.core.tokenizer import get_tokenizer
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
    args = p.parse_args()
    lines = [f"# python benchmarks/blocks_grid.py  ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())})"]

    def say(s: str) -> None:
        print(s, flush=True)
        lines.append(s)
        if args.out:
            Path(args.out).write_text("\n".join(lines) + "\n")

    with tempfile.TemporaryDirectory() as tmp:
        folders = {(d, s): write(Path(tmp) / f"c{d}-{s}", d, s) for d in (64, 128) for s in (0, 1, 2)}
        for tokens in (300, 1200, 8):  # the indexer's cases first
            for (dim, seed), folder in folders.items():
                for line in case(folder, dim, seed, tokens):
                    say(line)
        say("V4.1-Flash layer numbers at small widths: " + v41_layout_report(Path(tmp)))


if __name__ == "__main__":
    main()
