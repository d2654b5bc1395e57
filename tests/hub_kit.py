"""A small Hugging Face Hub on 127.0.0.1 for tests: the part of the Hub's HTTP API that
``huggingface_hub.hf_hub_download`` speaks, over checkpoint folders on disk.

``HEAD`` / ``GET /{owner}/{name}/resolve/{revision}/{path}`` with the Hub's headers (``X-Repo-Commit``,
``ETag``: the file's sha256, ``Content-Length``, byte ranges ``bytes=a-b`` answered ``206`` with
``Content-Range``), and its errors as the Hub sends them (``X-Error-Code``: ``RepoNotFound`` 404,
``GatedRepo`` 401 without a token, ``RevisionNotFound``, ``EntryNotFound``). A repository may drop
the connection mid-transfer: ``drop="always"`` (every transfer of that file sends half its bytes,
then breaks off) or ``drop="once"`` (the first one, counted from when the mode is set). Every request is logged (method, file, status,
range, bytes sent): :meth:`HubServer.ranges` lists the range requests. Files are read per request,
so a test may change one under the same commit (its ETag follows). ``Repo(storage=True)`` answers
the resolve URL of a shard as the Hub does for large files: ``302`` to a storage URL on the same server
(``/storage/{owner}/{name}/{path}``, another ETag, no commit header) with ``X-Linked-Etag`` and
``X-Linked-Size``; :attr:`HubServer.expire` makes a file's storage URL answer ``403`` once (a signed
URL that expired). Point ``HF_ENDPOINT`` at :attr:`HubServer.url`.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HASHED_BYTES = 2**30  # files up to this size get their sha256 as ETag
_PATH = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_STORAGE = re.compile(r"^/storage/(?P<repo>[^/]+/[^/]+)/(?P<file>.+)$")
_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class Repo:
    folder: Path
    gated: bool = False
    drop: dict[str, str] = field(default_factory=dict)  # file name -> "always" | "once"
    commit: str = COMMIT
    storage: bool = False  # a shard's resolve answers 302 to this server's /storage/..., as the Hub's to its CDN


@dataclass
class Request:
    method: str
    repo: str
    file: str
    status: int
    sent: int  # body bytes written
    span: tuple[int, int] | None = None  # the byte range asked for, [start, end)
    storage: bool = False  # answered by the storage a Repo(storage=True) redirects to
    auth: bool = False  # the request carried a token


class HubServer:
    """``with HubServer({"owner/name": Repo(folder)}) as hub:`` serves them on a free port."""

    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.log: list[Request] = []
        self._etags: dict[tuple[Path, int, int], str] = {}
        self._dropped: set[tuple[str, str]] = set()
        self.expire: set[tuple[str, str]] = set()  # (repo, file): its storage URL answers 403 once
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> Self:
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def downloads(self, repo: str) -> list[str]:
        """The files whose bytes were sent (GET, 200 or 206), in order."""
        return [r.file for r in self.log if r.repo == repo and r.method == "GET" and r.status in (200, 206)]

    def bytes_sent(self, repo: str) -> int:
        return sum(r.sent for r in self.log if r.repo == repo)

    def ranges(self, repo: str, file: str | None = None) -> list[Request]:
        """The GET requests with a byte range (answered or broken off), of ``file`` or of every file."""
        return [r for r in self.log if r.repo == repo and r.method == "GET" and r.span and file in (None, r.file)]

    def etag(self, path: Path) -> str:
        """The file's sha256 (as the Hub's ETag of a stored file), computed again when its size or
        modification time changes; a file over ``HASHED_BYTES`` (a benchmark's sparse full-size table)
        gets the sha256 of its size and modification time instead, which also changes with it."""
        st = path.stat()
        key = (path, st.st_size, st.st_mtime_ns)
        with self._lock:
            if key not in self._etags:
                h = hashlib.sha256()
                if st.st_size > HASHED_BYTES:
                    h.update(f"{st.st_size}:{st.st_mtime_ns}".encode())
                else:
                    with open(path, "rb") as fh:
                        for block in iter(lambda: fh.read(1 << 20), b""):
                            h.update(block)
                self._etags[key] = h.hexdigest()
            return self._etags[key]

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _error(self, status: int, code: str, repo: str, file: str, commit: str | None = None) -> None:
                self.send_response(status)
                self.send_header("X-Error-Code", code)
                self.send_header("X-Error-Message", code)
                if commit:
                    self.send_header("X-Repo-Commit", commit)
                self.send_header("Content-Length", "0")
                self.end_headers()
                hub.log.append(Request(self.command, repo, file, status, 0))

            def _serve(self, body: bool) -> None:
                stored = _STORAGE.match(self.path.split("?")[0])
                if stored:  # the storage the Hub redirects to: no checks, no token needed
                    repo = hub.repos[stored["repo"]]
                    with hub._lock:
                        expired = (stored["repo"], stored["file"]) in hub.expire
                        hub.expire.discard((stored["repo"], stored["file"]))
                    if expired:
                        self.send_response(403)
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return self._log(stored["repo"], stored["file"], 403, 0, None, True)
                    return self._send(stored["repo"], repo, stored["file"], body, storage=True)
                m = _PATH.match(self.path.split("?")[0])
                if not m:
                    return self._error(404, "RepoNotFound", "", self.path)
                name, rev, file = m["repo"], m["rev"], m["file"]
                repo = hub.repos.get(name)
                if repo is None:
                    return self._error(404, "RepoNotFound", name, file)
                if repo.gated and not self.headers.get("Authorization"):
                    return self._error(401, "GatedRepo", name, file)
                if rev not in ("main", repo.commit):
                    return self._error(404, "RevisionNotFound", name, file)
                path = repo.folder / file
                if not path.is_file():
                    return self._error(404, "EntryNotFound", name, file, repo.commit)
                if repo.storage and file.endswith(".safetensors"):  # the Hub redirects its large (LFS) files
                    self.send_response(302)
                    self.send_header("Location", f"{hub.url}/storage/{name}/{file}")
                    self.send_header("X-Repo-Commit", repo.commit)
                    self.send_header("X-Linked-Etag", f'"{hub.etag(path)}"')
                    self.send_header("X-Linked-Size", str(path.stat().st_size))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return self._log(name, file, 302, 0, None, False)
                return self._send(name, repo, file, body, storage=False)

            def _log(self, name: str, file: str, status: int, sent: int, span, storage: bool) -> None:
                auth = bool(self.headers.get("Authorization"))
                hub.log.append(Request(self.command, name, file, status, sent, span, storage, auth))

            def _send(self, name: str, repo: Repo, file: str, body: bool, storage: bool) -> None:
                path = repo.folder / file
                size = path.stat().st_size
                start, end = 0, size - 1
                ranged = _RANGE.match(self.headers.get("Range", ""))
                if ranged:
                    start = int(ranged[1])
                    end = min(int(ranged[2]), size - 1) if ranged[2] else size - 1
                self.send_response(206 if ranged else 200)
                if not storage:
                    self.send_header("X-Repo-Commit", repo.commit)
                self.send_header("ETag", f'"{hub.etag(path)}"' if not storage else '"storage-etag"')
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(end - start + 1))
                if ranged:
                    self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
                self.end_headers()
                if not body:
                    return self._log(name, file, 200, 0, None, storage)
                with open(path, "rb") as fh:
                    fh.seek(start)
                    data = fh.read(end + 1 - start)
                span = (start, end + 1) if ranged else None
                mode = repo.drop.get(file)
                with hub._lock:
                    drop = mode == "always" or (mode == "once" and (name, file) not in hub._dropped)
                    if drop:
                        hub._dropped.add((name, file))
                if drop:
                    data = data[: len(data) // 2]
                    self.wfile.write(data)
                    self.wfile.flush()
                    self.close_connection = True
                    return self._log(name, file, -1, len(data), span, storage)  # -1: broken off
                self.wfile.write(data)
                return self._log(name, file, 206 if ranged else 200, len(data), span, storage)

        return Handler


def use_hub(server: HubServer, monkeypatch, tmp_path: Path) -> None:
    """Point huggingface_hub and the suite at ``server`` with caches of the test's own (the Hub
    cache, the row cache) and no token, offline switch or default checkpoint from the environment."""
    monkeypatch.setenv("HF_ENDPOINT", server.url)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub-cache"))
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))  # no stored token
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("ENGRAM_VIZ_CACHE", str(tmp_path / "cache"))
    for var in ("HF_TOKEN", "HF_HUB_OFFLINE", "ENGRAM_VIZ_OFFLINE", "ENGRAM_VIZ_CHECKPOINT", "ENGRAM_VIZ_ROW_CACHE_MB"):
        monkeypatch.delenv(var, raising=False)
