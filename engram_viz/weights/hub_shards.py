"""Shards a Hub checkpoint leaves on the Hub: their headers read by byte ranges, their pins kept.

A Hub snapshot folder (``hub.hub_folder``) lacks the shards of the Engram layers; the scan opens
each one with :func:`remote_header` instead of from disk. The first time, a ``HEAD`` pins the file
(:class:`~engram_viz.weights.hub_ranges.HubFile`: commit, ETag, size) and two range requests read
its header (the 8-byte length, then the JSON), checked like a local header
(``safetensors.parse_safetensors_header``). The pin and the header are kept beside the row cache
(``row_store``; ``shard.json`` with its sha256 sidecar), so a later run, offline too, opens the
shard with no request and reads its rows under the same pin (:func:`remote_file`).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from engram_viz import settings
from engram_viz._cache import cached
from engram_viz.errors import HubError
from engram_viz.weights.hub import HUB_PREFIX, hub_snapshot
from engram_viz.weights.hub_ranges import HubFile, hub_file, read_ranges
from engram_viz.weights.row_store import store_folder
from engram_viz.weights.safetensors import MAX_HEADER_BYTES, SafetensorsHeader, parse_safetensors_header

PIN_FILE = "shard.json"


def is_remote_shard(path: Path) -> bool:
    """True for a shard path inside a Hub snapshot folder whose file was not downloaded."""
    return not path.is_file() and _where(path) is not None


def _where(path: Path) -> tuple[str, str, str] | None:
    """``(repo_id, commit, filename)`` of a path inside a Hub snapshot folder, else None."""
    for folder in path.parents:
        found = hub_snapshot(folder)
        if found is not None:
            return (*found, path.relative_to(folder).as_posix())
    return None


def _pinned(path: Path) -> tuple[HubFile, str]:
    """The file's pin and its raw JSON header, kept from the first run or read now."""
    where = _where(path)
    if where is None:
        raise HubError(f"{path} is not inside a Hub snapshot folder; expected a shard of an hf:// checkpoint")
    repo_id, commit, filename = where

    def fetch() -> dict:
        if settings.offline():
            raise HubError(
                f"{HUB_PREFIX}{repo_id}@{commit[:12]}: the header of {filename} is not in the row cache, and "
                "--offline (or ENGRAM_VIZ_OFFLINE / HF_HUB_OFFLINE) forbids the network; run once online"
            )
        file = hub_file(repo_id, filename, commit)
        (prefix,) = read_ranges(file, [(0, min(8, file.size))])
        n = struct.unpack("<Q", prefix)[0] if len(prefix) == 8 else -1
        if not 0 <= n <= min(MAX_HEADER_BYTES, file.size - 8):
            raise HubError(f"{file.label}: corrupt safetensors header: length prefix {n} does not fit the file")
        (raw,) = read_ranges(file, [(8, 8 + n)])
        return {"etag": file.etag, "size": file.size, "header": raw.decode("latin-1")}  # byte for byte

    def read(p: Path) -> dict | None:
        doc = json.loads(p.read_text(encoding="utf-8"))
        return doc if isinstance(doc, dict) and {"etag", "size", "header"} <= doc.keys() else None

    def write(doc: dict, tmp: Path) -> None:
        tmp.write_text(json.dumps(doc), encoding="utf-8")

    doc = cached(store_folder(repo_id, commit, filename) / PIN_FILE, read, fetch, write)
    return HubFile(repo_id, filename, commit, str(doc["etag"]), int(doc["size"])), str(doc["header"])


def remote_header(path: Path) -> SafetensorsHeader:
    """The checked header of the shard ``path`` of a Hub snapshot folder, read from the Hub (once)."""
    file, raw = _pinned(path)
    return parse_safetensors_header(path, file.size, raw.encode("latin-1"))


def remote_file(path: Path) -> HubFile:
    """The pinned Hub file behind the shard ``path`` (after :func:`remote_header` opened it)."""
    return _pinned(path)[0]
