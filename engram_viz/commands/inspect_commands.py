"""``engram-viz layout | hash | params | inspect``: the layout, the hash and the weights, no model run."""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

from engram_viz.commands.arguments import config_of
from engram_viz.core.engram import param_counts
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.weights.inspect import format_inspect, inspect_checkpoint


def layout(args: argparse.Namespace) -> None:
    built = EngramLayout(config_of(args))
    summary = built.summary()
    if args.json:
        print(json.dumps(summary))
        return
    print(f"config {summary['config']}: compressed vocab {summary['compressed_vocab_size']:,}")
    for li, layer in enumerate(summary["layer_ids"]):
        print(f"\nEngram layer {layer}: {summary['rows_per_layer'][li]:,} rows")
        print("  multipliers " + ", ".join(str(m) for m in summary["multipliers"][li]))
        for oi, order in enumerate(built.config.ngram_orders):
            cols = range(oi * built.n_heads, (oi + 1) * built.n_heads)
            primes = summary["primes"][li][oi]
            offsets = [summary["offsets"][li][c] for c in cols]
            print(f"  {order}-gram primes  " + " ".join(f"{p:>10}" for p in primes))
            print(f"  {order}-gram offsets " + " ".join(f"{o:>10}" for o in offsets))


def hash_text(args: argparse.Namespace) -> None:
    config = config_of(args)
    tok = get_tokenizer(config, args.tokenizer)
    raw = tok.encode(args.text, bos=args.bos)
    if not raw:
        raise SystemExit("engram-viz hash: TEXT produced no tokens; give a non-empty text")
    rows = hash_prompt(config, tok.token_map, torch.tensor([raw]))[0]
    out = {"raw_ids": raw, "compressed_ids": tok.compress(raw).tolist(), "row_ids": rows.tolist()}
    if args.json:
        print(json.dumps(out))
        return
    pieces = tok.pieces(raw)
    print(
        f"config {config.name}: {len(raw)} tokens, row ids [T={len(raw)}, layers={config.n_engram_layers}, {config.n_hash_cols}]"
    )
    for t, (r, c, piece) in enumerate(zip(raw, out["compressed_ids"], pieces)):
        print(f"{t:>4} {piece!r:>16} raw {r:>6} compressed {c:>6}")
        for li, layer in enumerate(config.engram_layer_ids):
            print(f"       L{layer}: " + " ".join(str(x) for x in np.asarray(out["row_ids"][t][li])))


def params(args: argparse.Namespace) -> None:
    config = config_of(args)
    counts = param_counts(config)
    if args.json:
        print(json.dumps({"config": config.name, "layers": {str(k): v for k, v in counts.items()}}))
        return
    labels = {"table": "Engram table", "wkv": "key and value projection (wkv)", "gate_weights": "gate weights (q, k)"}
    print(f"config {config.name}: parameters per Engram instance, from the tensor shapes (fp8 scales not counted)")
    for layer, c in counts.items():
        print(f"\nEngram layer {layer}")
        for key, label in labels.items():
            print(f"  {label:<32} {c[key]:>18,}")
        print(f"  {'per-instance total':<32} {c['total']:>18,}")
        print(f"  {'(fp8 scales, not counted)':<32} {c['scales_not_counted']:>18,}")


def inspect(args: argparse.Namespace) -> None:
    report = inspect_checkpoint(args.checkpoint, args.config, verify=args.verify, progress=not args.json)
    print(json.dumps(report) if args.json else format_inspect(report))
    if report["valid"] is False:
        raise SystemExit(1)
