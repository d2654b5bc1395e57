"""A file of a Hub repository read by HTTP byte ranges, pinned to one commit and one ETag.

:class:`HubFile` names the file at a commit (``resolve/<commit>/<file>``, so a branch that moves
meanwhile changes nothing) with the ETag and size its ``HEAD`` gave (:func:`hub_file`). :func:`read_ranges`
asks for many ``[start, end)`` spans at once, ``RANGE_WORKERS`` requests in flight, through
``huggingface_hub``'s HTTP session and headers (``HF_ENDPOINT``, the token). When the Hub redirects
the file to its storage, the range requests go to that (signed, content-addressed) URL, found with one
``HEAD`` a process and again when it expires, so they do not pass the Hub's request limits; the token
goes to the Hub alone. Every answer is checked: ``206`` with the bytes asked for, and where the Hub
answers itself, the ETag (its ``X-Linked-Etag``: the file's sha256) and commit of the pinned file, so a
file whose bytes changed under the same revision is refused rather than mixed with rows read before.

Transient failures (the connection dropped or refused, a body cut short, a timeout, HTTP 429 or
5xx) are retried ``TRIES`` times with exponential backoff from ``BACKOFF_S``; then, as for every
other failure, one :class:`~engram_viz.errors.HubError` line. Nothing is written here.
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from engram_viz.errors import HubError, TransientReadError
from engram_viz.weights.hub import HUB_PREFIX, hub_errors
from engram_viz.weights.row_store import store_root

RANGE_WORKERS = 16  # range requests in flight: each waits a round trip, not the CPU
TRIES = 4  # attempts per range before a transient failure is final
BACKOFF_S = 0.25  # sleep before the second attempt, doubled before each later one
TIMEOUT_S = 30.0
_ETAG_HEADERS = ("X-Linked-Etag", "ETag")  # the Hub's header for the stored file first, as huggingface_hub does
_LOCATIONS: dict[tuple[HubFile, str], str] = {}  # (file, resolve URL) -> where its bytes are served (_location)
_LOCK = threading.Lock()


@dataclass(frozen=True)
class HubFile:
    """``filename`` of ``repo_id`` at ``commit``, whose ETag was ``etag`` and size ``size`` bytes."""

    repo_id: str
    filename: str
    commit: str
    etag: str
    size: int

    @property
    def label(self) -> str:
        return f"{HUB_PREFIX}{self.repo_id}@{self.commit[:12]}/{self.filename}"

    def url(self) -> str:
        from huggingface_hub import hf_hub_url  # optional at import: only Hub checkpoints need it

        return hf_hub_url(self.repo_id, self.filename, revision=self.commit, endpoint=_endpoint())


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None


def hub_file(repo_id: str, filename: str, commit: str) -> HubFile:
    """``filename`` of ``repo_id`` at ``commit``, with the ETag and size a ``HEAD`` request gives."""
    from huggingface_hub import hf_hub_url

    url = hf_hub_url(repo_id, filename, revision=commit, endpoint=_endpoint())
    meta = _head(url, f"{HUB_PREFIX}{repo_id}@{commit[:12]}", filename)
    if not meta.etag or meta.size is None:
        raise HubError(
            f"{HUB_PREFIX}{repo_id}@{commit[:12]}: the Hub gave no ETag or size for {filename}; expected both to pin it"
        )
    file = HubFile(repo_id, filename, commit, meta.etag, int(meta.size))
    with _LOCK:
        _LOCATIONS[file, url] = meta.location
    return file


def _head(url: str, ref: str, filename: str) -> Any:
    from huggingface_hub import get_hf_file_metadata

    with hub_errors(ref, filename, offline=False):
        return get_hf_file_metadata(url, endpoint=_endpoint(), retry_on_errors=True)


def _location(file: HubFile) -> str:
    """Where the file's bytes are served: the storage URL the Hub redirects its resolve URL to (signed,
    asked for once a process and again when it expires, so the many range requests go to storage
    and not through the Hub's request limits), or the resolve URL itself when no redirect comes."""
    key = (file, file.url())  # the endpoint may change between calls (HF_ENDPOINT is read when called)
    with _LOCK:
        if key in _LOCATIONS:
            return _LOCATIONS[key]
    meta = _head(key[1], f"{HUB_PREFIX}{file.repo_id}@{file.commit[:12]}", file.filename)
    _check_pinned(file, meta.etag, meta.commit_hash)
    with _LOCK:
        _LOCATIONS[key] = meta.location
    return meta.location


def read_ranges(file: HubFile, spans: list[tuple[int, int]]) -> list[bytes]:
    """The bytes of each ``[start, end)`` span of ``file``, in order, read concurrently."""
    if not spans:
        return []
    with ThreadPoolExecutor(max_workers=min(RANGE_WORKERS, len(spans)), thread_name_prefix="engram-viz-range") as pool:
        return list(pool.map(lambda span: _read_with_retries(file, *span), spans))


def _read_with_retries(file: HubFile, start: int, end: int) -> bytes:
    why = ""
    for attempt in range(TRIES):
        if attempt:
            time.sleep(BACKOFF_S * 2 ** (attempt - 1))
        try:
            return _read_once(file, start, end)
        except TransientReadError as err:
            why = str(err)
    raise HubError(
        f"{file.label}: bytes {start}-{end - 1} could not be read after {TRIES} tries ({why}); "
        "no row of them was kept: run again to retry"
    )


def _read_once(file: HubFile, start: int, end: int) -> bytes:
    """One range request, checked (see the module docstring); ``TransientReadError`` when worth retrying."""
    from huggingface_hub import get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    target = _location(file)
    on_hub = target == file.url()  # the Hub itself answers; otherwise its storage (no token sent there)
    asked = {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"}
    headers = build_hf_headers(headers=asked) if on_hub else asked
    with hub_errors(f"{HUB_PREFIX}{file.repo_id}@{file.commit[:12]}", file.filename, offline=False):
        try:
            response = get_session().get(target, headers=headers, follow_redirects=True, timeout=TIMEOUT_S)
            body = response.content
        except Exception as err:
            if isinstance(err, OSError) or type(err).__module__.startswith(("httpx", "httpcore")):
                raise TransientReadError(f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:120]}") from None
            raise
        if response.status_code == 429 or response.status_code >= 500:
            raise TransientReadError(f"HTTP {response.status_code}")
        if not on_hub and response.status_code in (401, 403, 410):  # the signed storage URL expired
            with _LOCK:
                _LOCATIONS.pop((file, file.url()), None)
            raise TransientReadError(f"HTTP {response.status_code} from storage")
        hf_raise_for_status(response)
    if on_hub:  # storage URLs are content-addressed; the Hub's own answer names the file it served
        first = (list(response.history) or [response])[0]
        etag = next((first.headers[h] for h in _ETAG_HEADERS if h in first.headers), None)
        _check_pinned(file, etag.removeprefix("W/").strip('"') if etag else None, first.headers.get("X-Repo-Commit"))
    if response.status_code != 206:
        raise HubError(f"{file.label}: the server answered HTTP {response.status_code} to a byte range; expected 206")
    if len(body) != end - start:
        raise TransientReadError(f"{len(body)} of {end - start} bytes came")
    return body


def _check_pinned(file: HubFile, etag: str | None, commit: str | None) -> None:
    """Refuse an answer about a file other than the pinned one: another ETag or commit."""
    if (etag and etag != file.etag) or (commit and commit != file.commit):
        raise HubError(
            f"{file.label} changed under revision {file.commit[:12]}: the Hub now gives ETag {etag} "
            f"(commit {commit}), the rows read before came from ETag {file.etag}; refused, no row of it kept "
            f"(delete the row cache {store_root()} and run again to use the new bytes)"
        )
