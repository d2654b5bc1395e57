"""Checkpoints on the Hugging Face Hub: ``hf://owner/repo[@revision]``, fetched as far as a run needs.

:func:`hub_folder` reads the repository's index file first (``model.safetensors.index.json``), then
downloads ``config.json``, ``tokenizer.json`` and, only when the streams need them, the shards of the
blocks asked for (block 0 and ``embed.weight`` for ``streams="block0"``). The Engram-path tensors
(tables, ``wkv``, the gate weights ``q_weight``/``k_weight``, ``embed.weight``) are not downloaded:
the scan finds their shards missing from the snapshot folder and reads them by byte ranges
(``hub_shards.py``: headers; ``remote_rows.py``: the rows a run gathers, kept in a row cache on
disk). Every file after the index is fetched at the index's commit, so the folder is one revision
even if the branch moves meanwhile. It returns the local snapshot folder, which the rest of the
weights layer opens like any checkpoint folder.

Downloads go through ``huggingface_hub`` into its cache (``HF_HUB_CACHE``, ``HF_HOME``; a file is
fetched once, an interrupted one resumes, each shows a progress bar) with ``HF_ENDPOINT`` and the
token (``HF_TOKEN``, ``hf auth login``) read when called. Offline (``offline=True``, ``--offline``,
``ENGRAM_VIZ_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``) only the local cache is used. Nothing is written
outside the Hub cache; a failure raises one :class:`~engram_viz.errors.HubError` line.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engram_viz import settings
from engram_viz.core.schema import EMBED_NAME, ENGRAM_RE
from engram_viz.errors import HubError
from engram_viz.weights.index import INDEX_FILE, read_json

HUB_PREFIX = "hf://"
CONFIG_FILE = "config.json"
OPTIONAL_FILES = ("tokenizer.json", "SYNTHETIC.json")  # beside the shards when the repository has them
DOWNLOAD_WORKERS = 4  # shards fetched at once
_REPO_RE = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


@dataclass(frozen=True)
class HubRef:
    """A repository on the Hub: ``repo_id`` (``owner/name``) and ``revision`` (branch, tag or
    commit; None: ``main``)."""

    repo_id: str
    revision: str | None = None

    def __str__(self) -> str:
        return f"{HUB_PREFIX}{self.repo_id}" + (f"@{self.revision}" if self.revision else "")


def is_hub_ref(checkpoint: object) -> bool:
    """True for a string that names a Hub repository (``hf://...``)."""
    return isinstance(checkpoint, str) and checkpoint.startswith(HUB_PREFIX)


def parse_hub_ref(text: str) -> HubRef:
    """``hf://owner/repo`` or ``hf://owner/repo@revision`` -> :class:`HubRef`."""
    body = text.removeprefix(HUB_PREFIX)
    repo_id, at, revision = body.partition("@")
    if not _REPO_RE.match(repo_id) or ".." in repo_id or (at and not revision):
        raise HubError(f"checkpoint {text!r}: expected hf://owner/repo or hf://owner/repo@revision")
    return HubRef(repo_id, revision or None)


def shards_needed(weight_map: dict[str, str], blocks: Iterable[int] = ()) -> list[str]:
    """The shard files to download whole: those holding a tensor of ``blocks`` (``layers.{b}.*``)
    and, with any block, ``embed.weight`` (the blocks' readers take it from its file), from an
    index's ``weight_map`` (tensor name -> shard file). The Engram layers' tensors are read by rows,
    so a shard holding only those of a block's Engram (``layers.1.engram.*``) stays on the Hub."""
    prefixes = tuple(f"layers.{b}." for b in blocks)
    if not prefixes:
        return []
    wanted = (n for n in weight_map if n == EMBED_NAME or (n.startswith(prefixes) and not ENGRAM_RE.match(n)))
    return sorted({weight_map[n] for n in wanted})


def hub_folder(checkpoint: str | HubRef, *, blocks: Iterable[int] = (), offline: bool | None = None) -> Path:
    """The local snapshot folder of the Hub checkpoint ``checkpoint``: the index, ``config.json``,
    the tokenizer and the shards ``blocks`` need (:func:`shards_needed`), downloaded when not yet in
    the Hub cache. The Engram shards stay on the Hub (read by rows, ``remote_rows.py``)."""
    ref = checkpoint if isinstance(checkpoint, HubRef) else parse_hub_ref(checkpoint)
    offline = settings.offline() if offline is None else offline
    index = _fetch(ref, INDEX_FILE, ref.revision, offline)
    pinned = ref.revision if offline else index.parent.name  # a snapshot folder is named by its commit
    weight_map = read_json(index, "index file").get("weight_map")
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise HubError(f"{ref}: index file {INDEX_FILE} is corrupt: expected a 'weight_map' object of name -> shard")
    _fetch(ref, CONFIG_FILE, pinned, offline)
    for name in OPTIONAL_FILES:
        _fetch(ref, name, pinned, offline, optional=True)
    shards = shards_needed(weight_map, blocks)
    with ThreadPoolExecutor(max_workers=DOWNLOAD_WORKERS) as pool:
        list(pool.map(lambda shard: _fetch(ref, shard, pinned, offline), shards))
    return index.parent


def hub_config_file(checkpoint: str | HubRef, *, offline: bool | None = None) -> Path:
    """The ``config.json`` of a Hub checkpoint, fetched alone (what ``--config``-less commands read)."""
    ref = checkpoint if isinstance(checkpoint, HubRef) else parse_hub_ref(checkpoint)
    return _fetch(ref, CONFIG_FILE, ref.revision, settings.offline() if offline is None else offline)


def hub_snapshot(folder: Path) -> tuple[str, str] | None:
    """``(repo_id, commit)`` of a snapshot folder of the Hub cache
    (``.../models--owner--repo/snapshots/<commit>``), else None."""
    repo = folder.parent.parent.name
    if folder.parent.name != "snapshots" or not repo.startswith("models--"):
        return None
    return repo.removeprefix("models--").replace("--", "/", 1), folder.name


def hub_name(folder: Path) -> str | None:
    """``hf://owner/repo@commit`` for a snapshot folder of the Hub cache, else None: what labels show
    instead of the path."""
    found = hub_snapshot(folder)
    return None if found is None else f"{HUB_PREFIX}{found[0]}@{found[1][:12]}"


def _fetch(ref: HubRef, filename: str, revision: str | None, offline: bool, optional: bool = False) -> Path:
    """One file of the repository from the Hub cache, downloaded first unless ``offline``. An
    ``optional`` file the repository (or, offline, the cache) lacks is skipped: ``Path()``."""
    from huggingface_hub import hf_hub_download  # optional at import: only Hub checkpoints need it
    from huggingface_hub.errors import EntryNotFoundError

    with hub_errors(ref, filename, offline):
        try:
            path = hf_hub_download(
                ref.repo_id,
                filename,
                revision=revision,
                cache_dir=os.environ.get("HF_HUB_CACHE") or None,
                endpoint=os.environ.get("HF_ENDPOINT") or None,
                local_files_only=offline,
            )
        except EntryNotFoundError:
            if optional:
                return Path()
            raise
    return Path(path)


@contextmanager
def hub_errors(ref: HubRef | str, filename: str, offline: bool) -> Iterator[None]:
    """huggingface_hub's and the network's exceptions as one :class:`HubError` line each."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    token = "set HF_TOKEN or run `hf auth login`"
    try:
        yield
    except GatedRepoError:
        raise HubError(
            f"{ref} is a gated repository: accept its conditions on the Hub with your account, then give a token "
            f"({token}); no access to {filename} without one"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(f"{ref}: no such repository on the Hub (or a private one: {token})") from None
    except RevisionNotFoundError:
        raise HubError(f"{ref}: no revision {getattr(ref, 'revision', None)!r} in this repository") from None
    except RemoteEntryNotFoundError:
        raise HubError(f"{ref}: the repository holds no {filename}; expected a safetensors checkpoint") from None
    except LocalEntryNotFoundError:
        why = (
            "--offline (or ENGRAM_VIZ_OFFLINE / HF_HUB_OFFLINE) forbids the network"
            if offline
            else "the Hub cannot be reached"
        )
        raise HubError(f"{ref}: {filename} is not in the local Hub cache, and {why}; run once online") from None
    except HfHubHTTPError as err:
        raise HubError(f"{ref}: the Hub answered HTTP {_status(err)} for {filename}") from None
    except HubError:
        raise
    except Exception as err:  # a connection dropped mid-file (after huggingface_hub's retries), a full disk
        if not isinstance(err, OSError) and not type(err).__module__.startswith(("httpx", "httpcore")):
            raise  # anything else is a bug: its traceback shows
        raise HubError(
            f"{ref}: the download of {filename} broke off ({type(err).__name__}: {_first_line(err)}); nothing was "
            "written outside the Hub cache: run again to retry"
        ) from None


def _status(err: Exception) -> str:
    response = getattr(err, "response", None)
    return str(getattr(response, "status_code", "?"))


def _first_line(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [""])[0][:200]
