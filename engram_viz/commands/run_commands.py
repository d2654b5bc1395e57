"""``engram-viz report | compare | explain | train-tiny``: the commands that run a model."""

from __future__ import annotations

import argparse
import json
import sys

from engram_viz.analysis.explain.explanation import explain as explain_position
from engram_viz.apps.compare_job import compare_prompts
from engram_viz.apps.quant_job import DEFAULT_CANDIDATES, summary_lines, write_quant_report
from engram_viz.apps.report_job import summary_text, write_report
from engram_viz.run.pipeline import Pipeline
from engram_viz.tiny.train import TrainSettings
from engram_viz.tiny.train import train_tiny as train
from engram_viz.weights.gguf_export import export_gguf as write_gguf
from engram_viz.weights.tiny_folder import DEFAULT_DIR


def report(args: argparse.Namespace) -> None:
    def log(msg: str) -> None:
        print(f"engram-viz report: {msg}", file=sys.stderr, flush=True)

    written = write_report(
        args.out,
        checkpoint=args.checkpoint,
        prompts=args.prompts,
        device=args.device,
        mode=args.mode,
        theme=args.theme,
        streams=args.streams,
        log=None if args.quiet else log,
        quant=_candidates(args.quant),
    )
    print(summary_text(written), end="")


def _candidates(text: str | None) -> list[str] | None:
    """``Q8_0,Q4_0, off`` -> ``["Q8_0", "Q4_0", "off"]``; None when not given."""
    return [c.strip() for c in text.split(",") if c.strip()] if text else None


def export_gguf(args: argparse.Namespace) -> None:
    path = write_gguf(args.checkpoint or DEFAULT_DIR, args.out, args.type)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; tables as {args.type.upper()})")


def quant_report(args: argparse.Namespace) -> None:
    def log(msg: str) -> None:
        print(f"engram-viz quant-report: {msg}", file=sys.stderr, flush=True)

    candidates = _candidates(args.candidates) or list(DEFAULT_CANDIDATES)
    summary = write_quant_report(args.out, args.checkpoint, candidates, args.prompts, log=None if args.quiet else log)
    print(summary_lines(summary) + f"wrote tables, quant_quality.png/.svg and summary.json to {args.out}")


def compare(args: argparse.Namespace) -> None:
    """One line: how B's gates differ from A's per aligned token; ``--out`` writes the view too."""
    pipe = Pipeline(args.checkpoint, device=args.device, mode=args.mode)
    result = compare_prompts(args.a, args.b, pipeline=pipe, layer=args.layer, theme=args.theme, out=args.out)
    if args.json:
        print(json.dumps({"layer": result.layer, "stream": "mean", **result.summary, "out": args.out}))
        return
    print(result.line() + (f"; wrote {args.out}" if args.out else ""))


def explain(args: argparse.Namespace) -> None:
    """The 24 rows of one position per layer: owner, decoded n-gram, shares and left-out gates."""
    pipe = Pipeline(args.checkpoint, device=args.device, mode=args.mode)
    layers = None if args.layer is None else [args.layer]
    ex = explain_position(pipe, args.text, positions=[args.position], layers=layers)
    summary = ex.position_summary(args.position)
    table = ex.position_table(args.position, args.layer)
    if args.json:
        print(json.dumps({**summary, "rows": table.to_dict(orient="records")}))
        return
    print(f"position {summary['position']} {summary['token']!r} of {args.text!r}; weights: {summary['model']}")
    for layer, s in summary["layers"].items():
        print(f"layer {layer}: gate per stream " + " ".join(f"{g:.3f}" for g in s["gate"]))
        for order, phi in s["shapley"].items():
            print(f"  {order}-gram Shapley " + " ".join(f"{v:+.3f}" for v in phi))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.3f}"))


def train_tiny(args: argparse.Namespace) -> None:
    settings = TrainSettings() if args.steps is None else TrainSettings(steps=args.steps)
    m = train(args.out, seed=args.seed, use_engram=not args.no_engram, settings=settings, progress=not args.quiet)
    shut = m["heldout_fp8_gates_shut"]
    print(
        f"trained in {m['train_wall_s']:.0f} s ({m['total_wall_s']:.0f} s in all); held-out loss (nats/token): "
        f"float {m['heldout_float']:.4f}, exported fp8 {m['heldout_fp8']:.4f}"
        + (f", fp8 with gates forced to 0 {shut:.4f}" if shut is not None else "")
        + f"; wrote {args.out}"
    )
