"""``engram-viz inspect``: what a checkpoint folder holds and whether it matches a config."""

from __future__ import annotations

from pathlib import Path

from engram_viz.config import ConfigError, EngramConfig
from engram_viz.weights.errors import CheckpointError
from engram_viz.weights.scan import scan_checkpoint
from engram_viz.weights.validate import resolve_config, validated_parts


def inspect_checkpoint(path: str | Path, config: EngramConfig | str | Path | None = None) -> dict:
    """What ``engram-viz inspect`` reports: the Engram-path tensors found (dtype, shape, files, bytes)
    and whether they match the config (``valid``: True / False, or None when no config is known).
    Reads headers only. Raises ``CheckpointError`` when the folder cannot even be scanned."""
    scan = scan_checkpoint(path)
    out = scan.describe()
    out.update(config=None, valid=None, error=None, label=None)
    try:
        cfg = resolve_config(scan, config)
    except (CheckpointError, ConfigError) as err:
        out["error"] = str(err)
        return out
    out["config"] = cfg.name
    out["label"] = scan.label(cfg)
    try:
        validated_parts(scan, cfg)
        out["valid"] = True
    except CheckpointError as err:
        out["valid"], out["error"] = False, str(err)
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
    if report["valid"] is True:
        lines.append(f"check against config {report['config']}: ok (every dtype and shape as expected)")
    elif report["valid"] is False:
        lines.append(f"check against config {report['config']}: FAILED: {report['error']}")
    else:
        lines.append(f"not checked against a config: {report['error']}")
    return "\n".join(lines)
