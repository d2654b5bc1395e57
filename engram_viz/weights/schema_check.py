"""Checking a scanned checkpoint folder against an Engram config: presence, dtype and shape of
every tensor the config needs (per part in the ``mp`` layout)."""

from __future__ import annotations

from pathlib import Path

from engram_viz.config import ConfigError, EngramConfig, load_config, match_preset
from engram_viz.core.schema import EMBED_NAME, expected_tensors, is_table_name
from engram_viz.errors import CheckpointError
from engram_viz.weights.safetensors import TensorInfo
from engram_viz.weights.scan import LAYOUT_MP, SINGLE_FILE, CheckpointScan
from engram_viz.weights.tiny_folder_files import is_tiny_lm_folder


def resolve_config(scan: CheckpointScan, config: EngramConfig | str | Path | None) -> EngramConfig:
    """``config`` loaded when given, else the folder's ``config.json`` (matched to a preset)."""
    if config is not None:
        return load_config(config)
    if scan.config_path is None:
        raise CheckpointError(
            f"checkpoint {scan.path} has no config.json; pass config= (a preset name or a config.json path)"
        )
    try:
        cfg = load_config(scan.config_path)
    except ConfigError as err:
        raise CheckpointError(f"checkpoint {scan.path}: {err}") from None
    return match_preset(cfg)


def _check_entry(
    scan: CheckpointScan, config: EngramConfig, name: str, dtype: str, shape: tuple[int, ...]
) -> list[TensorInfo]:
    """Check one tensor's dtype and shape (per part in the mp layout); returns its parts."""
    entry = scan.tensors.get(name)
    if entry is None:
        where = scan.index_path or (scan.files[0] if scan.layout == LAYOUT_MP else scan.path / SINGLE_FILE)
        raise CheckpointError(f"{where}: tensor {name!r} not found (config {config.name!r} needs it)")
    for p in entry.parts:
        if p.dtype != dtype:
            raise CheckpointError(
                f"{p.path}: tensor {name!r} has dtype {p.dtype}, expected {dtype} (config {config.name!r})"
            )
    n = len(entry.parts)
    split = n > 1 and (is_table_name(name) or (name == EMBED_NAME and entry.parts[0].shape[0] != shape[0]))
    if not split:
        for p in entry.parts:
            if p.shape != shape:
                raise CheckpointError(
                    f"{p.path}: tensor {name!r} has shape {list(p.shape)}, expected {list(shape)} (config {config.name!r})"
                )
        return entry.parts[:1]
    rows, rest = shape[0], shape[1:]
    part = -(-rows // n)
    for i, p in enumerate(entry.parts):
        allowed = {part} if i < n - 1 else {part, rows - (n - 1) * part}
        if p.shape[1:] != rest or p.shape[0] not in allowed:
            want = " or ".join(str([r, *rest]) for r in sorted(allowed))
            raise CheckpointError(
                f"{p.path}: tensor {name!r} (part {i} of {n}) has shape {list(p.shape)}, expected {want} "
                f"(rows {list(shape)} of config {config.name!r} split over {n} parts)"
            )
    return entry.parts


def validated_parts(scan: CheckpointScan, cfg: EngramConfig) -> dict[str, list[TensorInfo]]:
    """Every tensor the config needs, checked for presence, dtype and shape: name -> parts to read.
    A tiny Engram LM folder (``tiny_model``) keeps its own compact token embedding instead of
    ``embed.weight``."""
    skip = (EMBED_NAME,) if is_tiny_lm_folder(scan.path) else ()
    return {
        name: _check_entry(scan, cfg, name, dtype, shape)
        for name, (dtype, shape) in expected_tensors(cfg).items()
        if name not in skip
    }
