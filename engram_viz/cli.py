"""``engram-viz`` command line: the parser here, each sub-command's work in the module it names.

The parser answers ``--help`` at once: this module imports the standard library and
``engram_viz.errors`` only. Each sub-command is one row of :data:`COMMANDS` (its group, one-line
summary, options and ``"module:function"`` target); :func:`main` imports the target's module with
``importlib`` only when that sub-command runs, so ``engram-viz corpus`` never loads torch or
matplotlib and ``engram-viz --help`` loads neither. This is the package's one exception to "imports
between own modules at module top" (``tests/unit/test_architecture.py`` allows it here and in the
front door ``engram_viz/__init__.py`` only); the targets themselves import at module top. Adding a
sub-command: docs/TEAM_NOTES.md.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import Any, NoReturn

from engram_viz import settings
from engram_viz.commands.listing import GROUPS, Command, examples, overview
from engram_viz.commands.option_types import (  # bounded integers and --version: the stdlib only
    LAYER,
    PORT,
    POSITIVE,
    SEED,
    STEPS,
    TOKEN_INDEX,
    TOP,
    WORKERS,
    Version,
)
from engram_viz.errors import EngramVizError

WEIGHTS_RULE = "$ENGRAM_VIZ_CHECKPOINT when set, else the embedded default data/tiny-engram"
JSON_HELP = "print one JSON object instead of text"


def _library(module: str, name: str) -> Any:
    """``name`` from one of the package's modules, imported now (an option's type that needs the
    library: it runs only when that option is given)."""
    return getattr(importlib.import_module(module), name)


class _Parser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one line (``engram-viz corpus: error: argument
    --top: ...``) and exit code 2, like every other user error."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())} (see {self.prog} --help)\n")


def byte_size(text: str) -> int:
    """An argparse type: a memory size, bytes or a number with a unit (2GB, 512MiB), 1 byte to 1EiB."""
    try:
        size = _library("engram_viz.analysis.corpus.spill", "parse_memory_limit")(text)
    except EngramVizError as err:  # a MemoryLimitError
        raise argparse.ArgumentTypeError(str(err)) from None
    assert size is not None  # a string is never None
    return size


def _device(value: str) -> str | None:
    """An argparse type: auto (None: the Pipeline picks CUDA when available) or a device this
    machine has (:func:`engram_viz.core.devices.resolve_device`, which needs torch)."""
    if value.strip().lower() == "auto":
        return None
    try:
        return str(_library("engram_viz.core.devices", "resolve_device")(value))
    except EngramVizError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


# ---- options shared by several sub-commands


def _config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--config",
        default=None,
        help=f"preset (v41-flash, tiny) or path to a config.json (default: the config of the weights: {WEIGHTS_RULE})",
    )
    p.add_argument(
        "--checkpoint",
        default=None,
        help="the weights whose config to use: folder, GGUF or hf://owner/repo (config only)",
    )
    _offline_arg(p)


def _checkpoint_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--checkpoint",
        default=None,
        help=f"checkpoint folder, GGUF file or hf://owner/repo[@revision] (default: {WEIGHTS_RULE})",
    )
    _offline_arg(p)


def _offline_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--offline", action="store_true", help="hf:// checkpoints from the local Hub cache only, no network")


def _device_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--device",
        default=None,
        type=_device,
        help="auto, cpu, cuda, cuda:N or mps, where available (default: auto, cuda when available)",
    )


def _mode_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", default="fp8", choices=["fp8", "bf16"], help="wkv mode (default: fp8, the reference)")


def _tokenizer_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--tokenizer", default=None, help="tokenizer.json or checkpoint folder (default: bundled V4 tokenizer)"
    )


def _json_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help=JSON_HELP)


def _quiet_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument("--quiet", action="store_true", help=f"no {what}")


def _theme_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--theme", default="light", choices=["light", "dark"], help="colours of figures (default: light)")


# ---- inspect: the layout, the hash and the weights, no model run


def _add_layout(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    _json_arg(p)


def _add_hash(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the text to tokenize and hash")
    _config_arg(p)
    _tokenizer_arg(p)
    p.add_argument("--bos", action="store_true", help="prepend the BOS token")
    _json_arg(p)


def _add_params(p: argparse.ArgumentParser) -> None:
    _config_arg(p)
    _json_arg(p)


def _add_inspect(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "checkpoint",
        help="checkpoint folder (model.safetensors.index.json + shards, or model{i}-mp{n}) or hf://owner/repo[@revision]",
    )
    _offline_arg(p)
    p.add_argument(
        "--config", default=None, help="preset or config.json to check against (default: the folder's config.json)"
    )
    p.add_argument(
        "--verify", action="store_true", help="also scan every Engram tensor whole for NaN/Inf (reads every byte)"
    )
    _json_arg(p)


# ---- corpus: statistics over text files


def _add_corpus(p: argparse.ArgumentParser) -> None:
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
    _tokenizer_arg(p)
    p.add_argument("--top", type=TOP, default=20, help="hot rows per layer (default: 20)")
    p.add_argument("--save-counts", action="store_true", help="also write ngram_counts.npz (for merging shards)")
    _quiet_arg(p, "progress bar")
    # the flag's old spelling, kept hidden so existing scripts keep working
    p.add_argument("--no-progress", dest="quiet", action="store_true", help=argparse.SUPPRESS)
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


def _add_cache_sim(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="*", metavar="FILE", help="text or JSONL files; none: the default Debian corpus")
    p.add_argument("--out", required=True, help="output folder for the tables, the figure and summary.json")
    _config_arg(p)
    p.add_argument(
        "--policy", default=None, help="comma-separated: LRU,LFU,ARC,S3-FIFO,SIEVE,W-TinyLFU,Belady (default: all)"
    )
    p.add_argument(
        "--sizes",
        default=None,
        help="comma-separated cache sizes a table: rows (16384), bytes (4MiB, 25GB), 10%%, table",
    )
    p.add_argument(
        "--chunk", type=POSITIVE, default=4096, help="prefill step in tokens, rows deduplicated (default 4096)"
    )
    p.add_argument("--no-orders", action="store_true", help="no cache per n-gram order, the shared cache only")
    p.add_argument("--max-tokens", type=POSITIVE, default=None, help="stop after N tokens")
    p.add_argument(
        "--io-tokens", type=POSITIVE, default=5_000, help="page I/O window: the last N tokens (default 5000)"
    )
    p.add_argument("--decode-rate", type=POSITIVE, default=1_000, help="target decode tokens/s for IOPS (default 1000)")
    p.add_argument("--prefill-rate", type=POSITIVE, default=20_000, help="target prefill tokens/s (default 20000)")
    p.add_argument("--workers", type=WORKERS, default=None, help="trace and simulate on a local Dask cluster")
    p.add_argument("--scheduler", default=None, help="trace and simulate on the Dask cluster at ADDRESS")
    p.add_argument("--keep-trace", action="store_true", help="keep the row-access trace files in OUT/trace")
    _quiet_arg(p, "progress bar")


# ---- run: a model over prompts


def _add_report(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument(
        "--prompts",
        default=None,
        help="prompt JSONL file (default: data/prompts/default.jsonl; paper.jsonl off the tiny LM)",
    )
    p.add_argument("--out", default="out/report", help="output folder (default: out/report)")
    p.add_argument(
        "--streams",
        default="auto",
        help="auto, model (the tiny LM's, or a checkpoint's own blocks: true streams for every Engram layer), "
        "embedding, block0 (the checkpoint's own block 0: real layer-1 streams) "
        "or a captured-streams .safetensors file (default: auto)",
    )
    _device_arg(p)
    _mode_arg(p)
    _theme_arg(p)
    _quant_arg(p)
    _quiet_arg(p, "progress messages")


def _quant_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--quant",
        default=None,
        help="comma-separated candidate tables (GGML types such as Q8_0,Q4_0, GGUF files, off): adds a section "
        "on what they cost the tiny LM (see quant-report)",
    )


def _add_quant_report(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument(
        "--candidates",
        default=None,
        help="comma-separated GGML types gguf can quantise (Q8_0, Q5_0, Q4_0, MXFP4, ...), GGUF files, or off "
        "(default: the study's own set, apps.quant_job.DEFAULT_CANDIDATES)",
    )
    p.add_argument("--prompts", default=None, help="prompt JSONL file (default: data/prompts/default.jsonl)")
    p.add_argument("--out", default="out/quant", help="output folder (default: out/quant)")
    _quiet_arg(p, "progress messages")


def _add_export_gguf(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", default=None, help="checkpoint folder (default: the embedded data/tiny-engram)")
    p.add_argument("--type", default="Q8_0", help="GGML type of the tables, one gguf quantises (default: Q8_0)")
    p.add_argument("--out", required=True, help="the .gguf file to write (atomically)")


def _add_explain(p: argparse.ArgumentParser) -> None:
    p.add_argument("text", help="the prompt")
    p.add_argument("--position", type=TOKEN_INDEX, required=True, help="token index (0 is BOS; negative from the end)")
    p.add_argument("--layer", type=LAYER, default=None, help="one Engram layer (default: all)")
    _checkpoint_arg(p)
    _device_arg(p)
    _mode_arg(p)
    _json_arg(p)


def _add_compare(p: argparse.ArgumentParser) -> None:
    p.add_argument("a", metavar="A", help="the first prompt (the reference)")
    p.add_argument("b", metavar="B", help="the second prompt, compared per aligned token against A")
    p.add_argument("--layer", type=LAYER, default=None, help="Engram layer to compare (default: the first)")
    p.add_argument(
        "--out",
        default=None,
        metavar="FILE",
        help="also write the comparison: .html (token text coloured by gate B - gate A), or .pdf, .svg, "
        ".png (a heatmap of every stream); written whole or not at all",
    )
    _checkpoint_arg(p)
    _device_arg(p)
    _mode_arg(p)
    _theme_arg(p)
    _json_arg(p)


def _add_train_tiny(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder (weights, config, metrics.json, loss_curve.png)")
    p.add_argument("--seed", type=SEED, default=0, help="random seed, 0 to 2**32 - 1 (default: 0)")
    p.add_argument("--no-engram", action="store_true", help="the same architecture without its Engram layers")
    p.add_argument("--steps", type=STEPS, default=None, help="training steps (default: the committed recipe)")
    _quiet_arg(p, "progress bar")


# ---- apps: pages to explore in a browser


def _add_app(p: argparse.ArgumentParser) -> None:
    _checkpoint_arg(p)
    p.add_argument("--port", type=PORT, default=8866, help="TCP port (default 8866; 0: any free port)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument(
        "--streams", default="auto", help="as report's --streams (block0: uploaded pictures get image features)"
    )


_INSPECT = "engram_viz.commands.inspect_commands"
_RUN = "engram_viz.commands.run_commands"
COMMANDS: dict[str, Command] = {
    "report": Command(
        "run",
        "the main job: run a prompt set -> tidy tables, figures, one offline HTML report",
        _add_report,
        f"{_RUN}:report",
        "engram-viz report --out out/report",
    ),
    "compare": Command(
        "run",
        "two prompts side by side: where gate B - gate A moves, per aligned token",
        _add_compare,
        f"{_RUN}:compare",
        'engram-viz compare "The Great Wall of China" "The Great Wall of Chile" --out diff.pdf',
    ),
    "explain": Command(
        "run",
        "why a gate opened: the 24 rows of one position with shares and left-out gates",
        _add_explain,
        f"{_RUN}:explain",
        'engram-viz explain "Alexander the Great" --position -1',
    ),
    "train-tiny": Command(
        "run",
        "train the tiny Engram LM on the CPU (deterministic) and export it",
        _add_train_tiny,
        f"{_RUN}:train_tiny",
        "engram-viz train-tiny --out out/tiny --seed 1",
    ),
    "quant-report": Command(
        "run",
        "what quantised tables (GGUF types, GGUF files, off) cost gates and loss",
        _add_quant_report,
        f"{_RUN}:quant_report",
        "engram-viz quant-report --candidates Q8_0,Q4_0,off --out out/quant",
    ),
    "export-gguf": Command(
        "run",
        "write a checkpoint's Engram (a tiny LM whole) as a GGUF file",
        _add_export_gguf,
        f"{_RUN}:export_gguf",
        "engram-viz export-gguf --type Q4_0 --out out/tiny_q4.gguf",
    ),
    "layout": Command("inspect", "multipliers, primes, offsets and rows per layer", _add_layout, f"{_INSPECT}:layout"),
    "hash": Command(
        "inspect",
        "tokenize TEXT and print raw, compressed and row ids",
        _add_hash,
        f"{_INSPECT}:hash_text",
        'engram-viz hash "The the THE" --json',
    ),
    "params": Command(
        "inspect", "parameter counts per Engram component, from the shapes", _add_params, f"{_INSPECT}:params"
    ),
    "inspect": Command(
        "inspect",
        "Engram tensors of a checkpoint folder: dtypes, shapes, shards, sizes, config check",
        _add_inspect,
        f"{_INSPECT}:inspect",
        "engram-viz inspect /path/to/DeepSeek-V4.1-Flash --verify",
    ),
    "corpus": Command(
        "corpus",
        "row usage and hash collisions over text/JSONL files -> tidy tables",
        _add_corpus,
        "engram_viz.commands.corpus_command:corpus",
        "engram-viz corpus a.jsonl b.txt.gz --out out/mine --max-tokens 5000000",
    ),
    "cache-sim": Command(
        "corpus",
        "row-cache hit rate against size per policy (libCacheSim) and the disk the misses need",
        _add_cache_sim,
        "engram_viz.commands.cache_sim_command:cache_sim",
        "engram-viz cache-sim --out out/caches --policy LRU,S3-FIFO,Belady --sizes 16384,4MiB,25GB",
    ),
    "app": Command(
        "apps",
        "serve the prompt-comparison app as a web page and print its URL",
        _add_app,
        "engram_viz.commands.app_command:app",
        "engram-viz app --port 9000",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    """The whole parser: every sub-command's options, nothing of the library imported."""
    parser = _Parser(
        prog="engram-viz",
        usage="engram-viz [-h] [--version] COMMAND [options]",
        description="Look inside the Engram memory of DeepSeek-V4.1-Flash.\n\n" + overview(COMMANDS, GROUPS),
        epilog=examples(COMMANDS) + "\n\n'engram-viz COMMAND --help' lists a command's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=Version, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help=argparse.SUPPRESS)
    for name, command in COMMANDS.items():
        p = sub.add_parser(
            name,
            prog=f"engram-viz {name}",
            description=command.summary,
            epilog=f"example:\n  {command.example}" if command.example else None,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        command.add_arguments(p)
        p.set_defaults(target=command.target)
    return parser


def _run(args: argparse.Namespace) -> None:
    """Import the sub-command's module (only now) and call its function with the arguments."""
    module, function = args.target.split(":")
    getattr(importlib.import_module(module), function)(args)


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
    if getattr(args, "offline", False):
        os.environ[settings.OFFLINE] = "1"  # read by weights.hub wherever a command resolves weights
    try:
        _run(args)
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
