"""``engram-viz inspect``: what a checkpoint folder holds and whether it matches a config.

Fast by default: headers, the small tensors (read and checked finite, as opening does) and
``tokenizer.json``; ``--verify`` adds a whole scan of every Engram-path tensor (``verify.py``)."""

from __future__ import annotations

from pathlib import Path

from engram_viz.config import ConfigError, EngramConfig
from engram_viz.core.schema import EMBED_NAME, is_table_name
from engram_viz.core.tokenizer import EngramTokenizer
from engram_viz.errors import CheckpointError, EngramVizError, HubError
from engram_viz.weights.gguf_file import is_gguf_path
from engram_viz.weights.gguf_inspect import inspect_gguf
from engram_viz.weights.hub_shards import is_remote_shard
from engram_viz.weights.nonfinite_scan import verify_tensors
from engram_viz.weights.remote_rows import read_small
from engram_viz.weights.safetensors import TensorInfo
from engram_viz.weights.scan import CheckpointScan, scan_checkpoint
from engram_viz.weights.schema_check import resolve_config, validated_parts


def _check_small_tensors(parts: dict[str, list[TensorInfo]]) -> None:
    """Read the small tensors (``wkv`` and its scales, ``q_weight``, ``k_weight``) as opening does,
    checking them finite; tables and the embedding stay unread (``--verify`` scans them)."""
    for name, tensor_parts in parts.items():
        if not is_table_name(name) and name != EMBED_NAME:
            read_small(tensor_parts[0])  # by rows from the Hub when its shard stayed there


def _check_tokenizer(scan: CheckpointScan, cfg: EngramConfig) -> dict | None:
    """The folder's ``tokenizer.json`` loaded as a run would load it (``tokenizers``, then its ids
    against the config's ``vocab_size`` and the compressed map); None when the folder has none."""
    path = scan.tokenizer_path
    if path is None:
        return None
    try:
        tok = EngramTokenizer(cfg, path)  # not the shared cache: the file as it is now
    except (EngramVizError, OSError) as err:
        return {"path": str(path), "ok": False, "error": str(err)}
    return {"path": str(path), "ok": True, "ids": tok.backend.get_vocab_size(with_added_tokens=True)}


def _problems(scan: CheckpointScan, cfg: EngramConfig, out: dict) -> list[str]:
    """Everything wrong with a scanned folder against a config: tensors, small tensors' values, tokenizer."""
    problems = []
    try:
        _check_small_tensors(validated_parts(scan, cfg))
    except CheckpointError as err:
        problems.append(str(err))
    out["tokenizer"] = _check_tokenizer(scan, cfg)
    if out["tokenizer"] is not None and not out["tokenizer"]["ok"]:
        problems.append(out["tokenizer"]["error"])
    return problems


def _verify_problems(findings: dict, folder: Path) -> list[str]:
    return [
        f"{folder / b['files'][0]}: tensor {b['name']!r}: {b['nonfinite_values']:,} non-finite values "
        f"({b['what']}) in {b['rows']:,} rows, first rows {b['first_rows']}"
        for b in findings["bad"]
    ]


def inspect_checkpoint(
    path: str | Path, config: EngramConfig | str | Path | None = None, verify: bool = False, progress: bool = True
) -> dict:
    """What ``engram-viz inspect`` reports: the Engram-path tensors found (dtype, shape, files, bytes)
    and whether they match the config (``valid``: True / False, or None when no config is known;
    ``error`` the first problem, ``problems`` all of them). Reads the headers, the small tensors
    (checked finite, as opening does) and ``tokenizer.json`` when present; with ``verify``, scans
    every Engram-path tensor whole for NaN/Inf (``verify.py``; a progress bar unless not
    ``progress``). Raises ``CheckpointError`` when the folder cannot even be scanned. A GGUF file:
    ``gguf_inspect.inspect_gguf`` (no ``verify``)."""
    if is_gguf_path(path):
        return inspect_gguf(path, config)
    scan = scan_checkpoint(path)
    out = scan.describe()
    out.update(config=None, valid=None, error=None, problems=[], label=None, tokenizer=None, verify=None)
    problems = []
    try:
        cfg = resolve_config(scan, config)
    except (CheckpointError, ConfigError) as err:
        out["error"] = str(err)
        cfg = None
    if cfg is not None:
        out["config"], out["label"] = cfg.name, scan.label(cfg)
        problems = _problems(scan, cfg, out)
    if verify:
        remote = [f.name for f in scan.files if is_remote_shard(f)]
        if remote:  # every byte of the tables by byte ranges is no verification anyone wants
            raise HubError(
                f"{scan.label(cfg) if cfg else scan.path}: --verify reads every byte of the Engram tensors, and "
                f"{len(remote)} shards ({remote[0]}, ...) are on the Hub; download the repository and inspect its folder"
            )
        out["verify"] = verify_tensors(scan, progress=progress)
        problems += _verify_problems(out["verify"], scan.path)
    out["problems"] = problems
    if problems:
        out["valid"], out["error"] = False, problems[0]
    elif cfg is not None:
        out["valid"] = True
    return out


def _size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"


def format_inspect(report: dict) -> str:
    """Human-readable table of an ``inspect_checkpoint`` report."""
    head = (
        f"checkpoint {report['path']}: {report['layout']} layout, {len(report['files'])} files, "
        f"{report['n_tensors']:,} tensors listed, {len(report['tensors'])} on the Engram path"
    )
    lines = [head]
    if report["synthetic"]:
        lines.append("SYNTHETIC: random weights written by engram-viz, not trained")
    rows = [("tensor", "dtype", "shape", "size", "file(s)")]
    for t in report["tensors"]:
        if t["parts"] > 1:
            how = "rows split" if t["split"] else "replicated"
            files = f"{t['files'][0]} .. {t['files'][-1]} ({how} over {t['parts']})"
        else:
            files = t["files"][0]
        rows.append((t["name"], t["dtype"], str(t["shape"]), _size(t["bytes"]), files))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:4], widths)) + "  " + r[4])
    lines.append(f"Engram-path bytes: {_size(report['engram_bytes'])}")
    tok = report.get("tokenizer")
    if tok and tok["ok"]:
        lines.append(f"tokenizer {tok['path']}: ok ({tok['ids']:,} ids)")
    found = report.get("verify")
    if found is not None:
        state = "ok (no NaN or Inf)" if not found["bad"] else f"{len(found['bad'])} tensors hold NaN/Inf"
        lines.append(f"verify: {found['tensors']} tensors, {_size(found['bytes'])} scanned whole: {state}")
    if report["valid"] is True:
        lines.append(f"check against config {report['config']}: ok (every dtype and shape as expected)")
    elif report["valid"] is False:
        what = f"check against config {report['config']}" if report["config"] else "check"
        lines.append(f"{what}: FAILED: {report['error']}")
        lines.extend(f"  also: {p}" for p in report["problems"][1:])
    else:
        lines.append(f"not checked against a config: {report['error']}")
    return "\n".join(lines)
