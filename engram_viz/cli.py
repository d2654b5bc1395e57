"""``engram-viz`` command line: one sub-command per job, each a thin layer over the library."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Callable
from typing import NoReturn

import numpy as np
import torch

from engram_viz.analysis.corpus.documents import DocumentSpec
from engram_viz.analysis.corpus.spill import parse_memory_limit
from engram_viz.analysis.explain.explanation import explain
from engram_viz.apps.app import serve
from engram_viz.apps.corpus_job import run_corpus
from engram_viz.apps.quant_job import DEFAULT_CANDIDATES, summary_lines, write_quant_report
from engram_viz.apps.report_job import summary_text, write_report
from engram_viz.config import EngramConfig, load_config
from engram_viz.core.devices import resolve_device
from engram_viz.core.engram import param_counts
from engram_viz.core.hashing import hash_prompt
from engram_viz.core.layout import EngramLayout
from engram_viz.core.tokenizer import get_tokenizer
from engram_viz.errors import EngramVizError, MemoryLimitError
from engram_viz.run.pipeline import Pipeline
from engram_viz.tiny.train import TrainSettings, train_tiny
from engram_viz.weights.gguf_export import export_gguf
from engram_viz.weights.inspect import format_inspect, inspect_checkpoint
from engram_viz.weights.resolve import weights_config
from engram_viz.weights.tiny_folder import DEFAULT_DIR

WEIGHTS_RULE = "$ENGRAM_VIZ_CHECKPOINT when set, else the embedded default data/tiny-engram"


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help=f"preset (v41-flash, tiny) or path to a config.json (default: the config of the weights: {WEIGHTS_RULE})",
    )


def _checkpoint_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help=f"checkpoint folder (default: {WEIGHTS_RULE})")


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``engram-viz corpus: error: argument
    --top: ...``) and exit code 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


# The shared argparse types of the numeric options: digits only (no 1e3, 0x10, 1_000, 1.0), each
# bounded, so nothing past argparse meets NaN, inf, an overflow, a negative or a zero it cannot use.
INT_LIMITS: dict[str, tuple[int, int]] = {}  # the name of each integer type -> its (lowest, highest)
_DIGITS = re.compile(r"[+-]?[0-9]+")


def int_range(lo: int, hi: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lo`` to ``hi`` written in decimal digits."""
    what = f"an integer from {lo:,} to {hi:,}"

    def parse(text: str) -> int:
        digits = text.strip()
        if not _DIGITS.fullmatch(digits):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if len(digits.lstrip("+-0")) > len(str(max(abs(lo), abs(hi)))):  # before int(): no 5,000-digit parse
            raise argparse.ArgumentTypeError(f"expected {what}, got a number {len(digits)} digits long")
        value = int(digits)
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = f"int_{lo}_{hi}".replace("-", "minus")
    INT_LIMITS[parse.__name__] = (lo, hi)
    return parse


POSITIVE = int_range(1, 2**62)  # counts of things: tokens
TOKEN_INDEX = int_range(-(2**31), 2**31 - 1)  # explain's --position (negative from the end)
LAYER = int_range(0, 2**31 - 1)
TOP = int_range(0, 1_000_000)  # hot rows per layer (0: none)
WORKERS = int_range(1, 1024)
SEED = int_range(0, 2**32 - 1)  # a 32-bit seed
STEPS = int_range(1, 10_000_000)
PORT = int_range(0, 65535)  # 0: any free port


def byte_size(text: str) -> int:
    """An argparse type: a memory size, bytes or a number with a unit (2GB, 512MiB), 1 byte to 1EiB."""
    try:
        size = parse_memory_limit(text)
    except MemoryLimitError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    assert size is not None  # a string is never None
    return size


def _device(value: str) -> str | None:
    """An argparse type: auto (None: the Pipeline picks CUDA when available) or a device this
    machine has (:func:`engram_viz.core.devices.resolve_device`)."""
    try:
        device = resolve_device(value)
    except EngramVizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    return None if value.strip().lower() == "auto" else str(device)


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default=None,
        type=_device,
        help="auto, cpu, cuda, cuda:N or mps, where available (default: auto, cuda when available)",
    )


def _config(args: argparse.Namespace) -> EngramConfig:
    """``--config`` loaded, or the config of the weights the one rule picks when it is not given."""
    return load_config(args.config) if args.config is not None else weights_config()


def cmd_layout(args: argparse.Namespace) -> None:
    layout = EngramLayout(_config(args))
    summary = layout.summary()
    if args.json:
        print(json.dumps(summary))
        return
    print(f"config {summary['config']}: compressed vocab {summary['compressed_vocab_size']:,}")
    for li, layer in enumerate(summary["layer_ids"]):
        print(f"\nEngram layer {layer}: {summary['rows_per_layer'][li]:,} rows")
        print("  multipliers " + ", ".join(str(m) for m in summary["multipliers"][li]))
        for oi, order in enumerate(layout.config.ngram_orders):
            cols = range(oi * layout.n_heads, (oi + 1) * layout.n_heads)
            primes = summary["primes"][li][oi]
            offsets = [summary["offsets"][li][c] for c in cols]
            print(f"  {order}-gram primes  " + " ".join(f"{p:>10}" for p in primes))
            print(f"  {order}-gram offsets " + " ".join(f"{o:>10}" for o in offsets))


def cmd_hash(args: argparse.Namespace) -> None:
    config = _config(args)
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


def cmd_params(args: argparse.Namespace) -> None:
    config = _config(args)
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


def cmd_corpus(args: argparse.Namespace) -> None:
    config = _config(args)
    result = run_corpus(
        args.files or None,
        args.out,
        config=config,
        tokenizer=get_tokenizer(config, args.tokenizer),
        max_tokens=args.max_tokens,
        spec=DocumentSpec(text_field=args.text_field, doc_mode=args.doc_mode, bos=not args.no_bos),
        top=args.top,
        save_counts=args.save_counts,
        progress=not args.no_progress,
        workers=args.workers,
        scheduler=args.scheduler,
        memory_limit=args.memory_limit,
    )
    s = result.summary
    print(
        f"config {s['config']}: {s['tokens']:,} tokens in {s['documents']:,} documents "
        f"({s['tokens_per_s']:,} tokens/s counting, {s['analysis_s']:.1f} s analysis, peak {s['peak_rss_mb']:,.0f} MiB)"
    )
    print("distinct n-grams: " + ", ".join(f"{n}-grams {k:,}" for n, k in s["distinct_ngrams"].items()))
    print(f"wrote {len(s['tables'])} tables (parquet + csv) and summary.json to {result.out_dir}")


def cmd_inspect(args: argparse.Namespace) -> None:
    report = inspect_checkpoint(args.checkpoint, args.config, verify=args.verify, progress=not args.json)
    print(json.dumps(report) if args.json else format_inspect(report))
    if report["valid"] is False:
        raise SystemExit(1)


def cmd_report(args: argparse.Namespace) -> None:
    def log(msg: str) -> None:
        print(f"engram-viz report: {msg}", file=sys.stderr, flush=True)

    report = write_report(
        args.out,
        checkpoint=args.checkpoint,
        prompts=args.prompts,
        device=args.device,
        mode=args.mode,
        theme=args.theme,
        streams=args.streams,
        log=None if args.quiet else log,
        quant=[c.strip() for c in args.quant.split(",") if c.strip()] if args.quant else None,
    )
    print(summary_text(report), end="")


def cmd_export_gguf(args: argparse.Namespace) -> None:
    path = export_gguf(args.checkpoint or DEFAULT_DIR, args.out, args.type)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; tables as {args.type.upper()})")


def cmd_quant_report(args: argparse.Namespace) -> None:
    def log(msg: str) -> None:
        print(f"engram-viz quant-report: {msg}", file=sys.stderr, flush=True)

    candidates = [c.strip() for c in args.candidates.split(",") if c.strip()]
    summary = write_quant_report(args.out, args.checkpoint, candidates, args.prompts, log=None if args.quiet else log)
    print(summary_lines(summary) + f"wrote tables, quant_quality.png/.svg and summary.json to {args.out}")


def cmd_train_tiny(args: argparse.Namespace) -> None:
    settings = TrainSettings() if args.steps is None else TrainSettings(steps=args.steps)
    m = train_tiny(args.out, seed=args.seed, use_engram=not args.no_engram, settings=settings, progress=not args.quiet)
    shut = m["heldout_fp8_gates_shut"]
    print(
        f"trained in {m['train_wall_s']:.0f} s ({m['total_wall_s']:.0f} s in all); held-out loss (nats/token): "
        f"float {m['heldout_float']:.4f}, exported fp8 {m['heldout_fp8']:.4f}"
        + (f", fp8 with gates forced to 0 {shut:.4f}" if shut is not None else "")
        + f"; wrote {args.out}"
    )


def cmd_app(args: argparse.Namespace) -> None:
    serve(args.checkpoint, port=args.port, host=args.host)


def cmd_explain(args: argparse.Namespace) -> None:
    """The 24 rows of one position per layer: owner, decoded n-gram, shares and left-out gates."""
    pipe = Pipeline(args.checkpoint, device=args.device, mode=args.mode)
    layers = None if args.layer is None else [args.layer]
    ex = explain(pipe, args.text, positions=[args.position], layers=layers)
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


def _add_explain_command(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="why a gate opened: the 24 rows of one position with shares and left-out gates")
    p.add_argument("text", help="the prompt")
    p.add_argument("--position", type=TOKEN_INDEX, required=True, help="token index (0 is BOS; negative from the end)")
    p.add_argument("--layer", type=LAYER, default=None, help="one Engram layer (default: all)")
    _checkpoint_arg(p)
    _device_arg(p)
    p.add_argument("--mode", default="fp8", choices=["fp8", "bf16"], help="wkv mode (default: fp8, the reference)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_explain)


def _add_foundation_commands(sub: argparse._SubParsersAction) -> None:
    """layout, hash, params, inspect: the layout, the hash and the weights, no model run."""
    p = sub.add_parser("layout", help="multipliers, primes, offsets and rows per layer")
    _config_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_layout)

    p = sub.add_parser("hash", help="tokenize TEXT and print raw, compressed and row ids")
    p.add_argument("text")
    _config_arg(p)
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer.json or checkpoint folder (default: bundled V4 tokenizer)"
    )
    p.add_argument("--bos", action="store_true", help="prepend the BOS token")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_hash)

    p = sub.add_parser("params", help="parameter counts per Engram component, from the shapes")
    _config_arg(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_params)

    p = sub.add_parser(
        "inspect", help="Engram tensors of a checkpoint folder: dtypes, shapes, shards, sizes, config check"
    )
    p.add_argument("checkpoint", help="checkpoint folder (model.safetensors.index.json + shards, or model{i}-mp{n})")
    p.add_argument(
        "--config", default=None, help="preset or config.json to check against (default: the folder's config.json)"
    )
    p.add_argument(
        "--verify", action="store_true", help="also scan every Engram tensor whole for NaN/Inf (reads every byte)"
    )
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_inspect)


def _add_corpus_command(sub: argparse._SubParsersAction) -> None:
    """corpus: row usage and collisions over text files."""
    p = sub.add_parser("corpus", help="row usage and hash collisions over text/JSONL files -> tidy tables")
    p.add_argument(
        "files",
        nargs="*",
        metavar="FILE",
        help="text or JSONL files (.gz read transparently); none: the default Debian corpus "
        "(bible-kjv-text + debian-reference-zh-cn)",
    )
    p.add_argument("--out", required=True, help="output folder for the tables and summary.json")
    _config_arg(p)
    p.add_argument("--max-tokens", type=POSITIVE, default=None, help="stop after N tokens")
    p.add_argument("--text-field", default="text", help="JSONL field holding the text (default: text)")
    p.add_argument(
        "--doc-mode",
        choices=["paragraph", "line", "file"],
        default="paragraph",
        help="what a document (a sequence) is in plain text files (default: paragraph)",
    )
    p.add_argument("--no-bos", action="store_true", help="do not start each document with BOS")
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer.json or checkpoint folder (default: bundled V4 tokenizer)"
    )
    p.add_argument("--top", type=TOP, default=20, help="hot rows per layer (default: 20)")
    p.add_argument("--save-counts", action="store_true", help="also write ngram_counts.npz (for merging shards)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--workers",
        type=WORKERS,
        default=None,
        help="count on a local Dask cluster of N workers (needs the corpus extra)",
    )
    p.add_argument("--scheduler", default=None, help="count on the Dask cluster at ADDRESS (tcp://host:8786)")
    p.add_argument(
        "--memory-limit",
        default=None,
        type=byte_size,
        metavar="SIZE",
        help="budget for the distinct n-gram store per process (bytes or e.g. 2GB); past it sorted runs "
        "spill to disk and are merged back (same tables)",
    )
    p.set_defaults(func=cmd_corpus)


def _add_job_commands(sub: argparse._SubParsersAction) -> None:
    """report, train-tiny, app: the jobs that run a model."""
    p = sub.add_parser("report", help="the main job: run a prompt set -> tidy tables, figures, one offline HTML report")
    _checkpoint_arg(p)
    p.add_argument("--prompts", default=None, help="prompt JSONL file (default: data/prompts/default.jsonl)")
    p.add_argument("--out", default="out/report", help="output folder (default: out/report)")
    p.add_argument(
        "--streams",
        default="auto",
        help="auto, model, embedding, block0 (the checkpoint's own block 0: real layer-1 streams) "
        "or a captured-streams .safetensors file (default: auto)",
    )
    _device_arg(p)
    p.add_argument("--mode", default="fp8", choices=["fp8", "bf16"], help="wkv mode (default: fp8, the reference)")
    p.add_argument("--theme", default="light", choices=["light", "dark"])
    p.add_argument(
        "--quant",
        default=None,
        help="comma-separated candidate tables (GGML types such as Q8_0,Q4_0, GGUF files, off): adds a section "
        "on what they cost the tiny LM (see quant-report)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("export-gguf", help="write a checkpoint's Engram (a tiny LM whole) as a GGUF file")
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the embedded data/tiny-engram)")
    p.add_argument("--type", default="Q8_0", help="GGML type of the tables, one gguf quantises (default: Q8_0)")
    p.add_argument("--out", required=True, help="the .gguf file to write (atomically)")
    p.set_defaults(func=cmd_export_gguf)

    p = sub.add_parser("quant-report", help="what quantised tables (GGUF types, GGUF files, off) cost gates and loss")
    _checkpoint_arg(p)
    p.add_argument(
        "--candidates",
        default=",".join(DEFAULT_CANDIDATES),
        help="comma-separated GGML types gguf can quantise (Q8_0, Q5_0, Q4_0, MXFP4, ...), GGUF files, or off "
        f"(default: {','.join(DEFAULT_CANDIDATES)})",
    )
    p.add_argument("--prompts", default=None, help="prompt JSONL file (default: data/prompts/default.jsonl)")
    p.add_argument("--out", default="out/quant", help="output folder (default: out/quant)")
    p.add_argument("--quiet", action="store_true", help="no progress messages")
    p.set_defaults(func=cmd_quant_report)

    p = sub.add_parser("train-tiny", help="train the tiny Engram LM on the CPU (deterministic) and export it")
    p.add_argument("--out", required=True, help="output folder (weights, config, metrics.json, loss_curve.png)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed, 0 to 2**32 - 1 (default: 0)")
    p.add_argument("--no-engram", action="store_true", help="the same architecture without its Engram layers")
    p.add_argument("--steps", type=STEPS, default=None, help="training steps (default: the committed recipe)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train_tiny)

    p = sub.add_parser("app", help="serve the prompt-comparison app as a web page (Voila) and print its URL")
    _checkpoint_arg(p)
    p.add_argument("--port", type=PORT, default=8866, help="TCP port (default 8866; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.set_defaults(func=cmd_app)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="engram-viz", description="Look inside the Engram memory of DeepSeek-V4.1-Flash.")
    sub = parser.add_subparsers(dest="command", required=True)

    _add_foundation_commands(sub)
    _add_corpus_command(sub)
    _add_job_commands(sub)
    _add_explain_command(sub)
    return parser


def _one_line(err: BaseException) -> str:
    """The error's message on one line (a multi-line message joined with spaces); a bare OSError
    (``[Errno 21] Is a directory: 'x'``) reads ``x: Is a directory``."""
    if isinstance(err, OSError) and not isinstance(err, EngramVizError) and err.strerror and err.filename:
        names = " -> ".join(str(f) for f in (err.filename, err.filename2) if f is not None)
        return f"{names}: {err.strerror}"
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return " ".join(lines) or type(err).__name__


def main(argv: list[str] | None = None) -> int:
    """Run one sub-command; a user error (any ``EngramVizError``, a file that cannot be read or
    written) ends it with one line on stderr and exit code 2, without a traceback; Ctrl-C with one
    line and exit code 130 (an output folder is then left as it was). Anything else is a bug and
    keeps its traceback. A usage error (a bad option value) is one line and exit code 2 too."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as stop:  # argparse: a usage error (code 2, one line from _Parser.error) or --help (0)
        return stop.code if isinstance(stop.code, int) else 2
    try:
        args.func(args)
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"engram-viz {args.command}: interrupted", file=sys.stderr)
        return 130
    except (EngramVizError, OSError) as err:  # a bare ValueError or TypeError is a bug: its traceback shows
        print(f"engram-viz {args.command}: error: {_one_line(err)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
