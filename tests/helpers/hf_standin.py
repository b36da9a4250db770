"""A stand-in for the Hugging Face Hub's file API on 127.0.0.1, and the real llama.cpp ``-hf`` download against it.

:class:`HubStandin` serves ``{repo: {path: bytes}}`` exactly as far as llama.cpp's downloader reads the Hub
(common/hf-cache.cpp and common/download.cpp of the pinned tree, b11312):

- ``GET /api/models/<owner>/<name>/refs``: ``{"branches": [{"name": "main", "targetCommit": <40 hex>}]}``
  (get_repo_commit keeps a branch whose targetCommit is 40 hex digits, preferring ``main``);
- ``GET /api/models/<owner>/<name>/tree/<commit>?recursive=true``: a JSON array in the Hub's order (sorted paths
  unless the repo gives its own order): ``{"type": "directory", ...}`` for each folder (skipped by llama.cpp) and
  ``{"type": "file", "path", "oid": <git blob sha1>, "size", "lfs": {"oid": <sha256>, "size", "pointerSize"}}``
  per file. llama.cpp takes the lfs oid (else the oid), skips a file whose oid is not 40 or 64 hex digits, and
  stores the file as ``blobs/<oid>`` in its cache: two paths with the same bytes share one download;
- ``HEAD`` / ``GET /<owner>/<name>/resolve/<commit>/<path>``: the bytes, with ``Content-Length``, ``ETag`` and
  ``Accept-Ranges: bytes`` (a ``Range`` request gets 206). The downloader checks the status (HEAD 2xx, GET 200 /
  206) and keeps the ETag; it verifies no digest of the bytes.

Every request is logged (:attr:`HubStandin.requests`); :meth:`HubStandin.fetched` is the files whose bytes were
sent. :func:`llama_cpp_download` runs a real llama.cpp tool with ``-hf <repo>:<tag>`` against a fresh stand-in and
a fresh cache (``MODEL_ENDPOINT``, ``LLAMA_CACHE``) and returns what it fetched.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tempfile
import threading
from collections.abc import Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "ggufpipe-test/naming"


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Request(NamedTuple):
    method: str
    path: str  # as sent, query included
    status: int


class HubStandin:
    """A threaded HTTP server for ``repos`` = ``{"owner/name": {path: bytes}}`` (or ``{"owner/name": [(path,
    bytes), ...]}`` to list the files in that order instead of sorted). Use as a context manager; :attr:`endpoint`
    is ``http://127.0.0.1:<port>/``."""

    def __init__(self, repos: Mapping[str, Mapping[str, bytes] | Sequence[tuple[str, bytes]]], commit: str = COMMIT):
        self.commit = commit
        self.repos: dict[str, list[tuple[str, bytes]]] = {}
        for repo, files in repos.items():
            items = list(files) if not isinstance(files, Mapping) else sorted(files.items())
            self.repos[repo] = items
        self.requests: list[Request] = []
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.02,), daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/"

    def __enter__(self) -> HubStandin:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def tree(self, repo: str) -> list[dict]:
        out, folders = [], set()
        for path, data in self.repos[repo]:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                folder = "/".join(parts[:i])
                if folder not in folders:
                    folders.add(folder)
                    out.append({"type": "directory", "oid": git_blob_sha1(folder.encode()), "size": 0, "path": folder})
            out.append(
                {
                    "type": "file",
                    "oid": git_blob_sha1(data),
                    "size": len(data),
                    "path": path,
                    "lfs": {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134},
                }
            )
        return out

    def fetched(self, repo: str = REPO) -> list[str]:
        """Paths (in the repo) whose bytes a GET received, in request order, each once."""
        prefix = f"/{repo}/resolve/{self.commit}/"
        out: list[str] = []
        for r in self.requests:
            if r.method == "GET" and r.status in (200, 206) and r.path.startswith(prefix):
                p = unquote(r.path[len(prefix) :])
                if p not in out:
                    out.append(p)
        return out

    def _handler(self):
        standin = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _send(
                self,
                status: int,
                body: bytes = b"",
                ctype: str = "application/json",
                headers: Mapping[str, str] | None = None,
                head: bool = False,
            ) -> None:
                with standin._lock:
                    standin.requests.append(Request(self.command, self.path, status))
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(body)

            def _json(self, status: int, obj) -> None:
                self._send(status, json.dumps(obj).encode(), head=self.command == "HEAD")

            def _route(self, head: bool) -> None:
                url = urlsplit(self.path)
                path = unquote(url.path)
                for repo, files in standin.repos.items():
                    api = f"/api/models/{repo}/"
                    if path == api + "refs":
                        return self._json(
                            200,
                            {
                                "branches": [
                                    {"name": "main", "ref": "refs/heads/main", "targetCommit": standin.commit}
                                ],
                                "converts": [],
                                "tags": [],
                            },
                        )
                    if path == api + f"tree/{standin.commit}":
                        return self._json(200, standin.tree(repo))
                    resolve = f"/{repo}/resolve/{standin.commit}/"
                    if path.startswith(resolve):
                        data = dict(files).get(path[len(resolve) :])
                        if data is None:
                            return self._json(404, {"error": "Entry not found"})
                        etag = f'"{hashlib.sha256(data).hexdigest()}"'
                        headers = {"ETag": etag, "Accept-Ranges": "bytes"}
                        rng = self.headers.get("Range", "")
                        if rng.startswith("bytes=") and not head:
                            start = int(rng[6:].split("-")[0] or 0)
                            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
                            return self._send(206, data[start:], "application/octet-stream", headers)
                        # HEAD: the headers of the GET (Content-Length of the bytes), no body
                        return self._send(200, data, "application/octet-stream", headers, head)
                return self._json(404, {"error": "Repository not found"})

            def do_GET(self):
                self._route(head=False)

            def do_HEAD(self):
                self._route(head=True)

        return Handler


class Download(NamedTuple):
    fetched: list[str]  # repo paths whose bytes the tool downloaded
    returncode: int
    log: str  # the tool's stdout + stderr
    cache: Path  # its LLAMA_CACHE (removed when the call returns; kept for messages)


def standin_bytes(path: str) -> bytes:
    """Distinct content per path (equal bytes would share one blob, hence one download, in llama.cpp's cache)."""
    return b"GGUF-standin " + path.encode()


def run_download(
    toolchain,
    files: Mapping[str, bytes] | Sequence[tuple[str, bytes]],
    tag: str = "",
    draft_mtp: bool = False,
    repo: str = REPO,
    timeout: float = 60,
) -> Download:
    """Run the real pinned llama.cpp with ``-hf <repo>[:<tag>]`` against a stand-in Hub serving ``files`` and
    return what it downloaded (the run fails after the download when the bytes are no model: that is fine).

    Without ``draft_mtp``: ``llama-tokenize -hf ... -p x`` (common_params_parse downloads before main loads the
    model, vocab only). With it: ``llama-speculative-simple -hf ... --spec-type draft-mtp`` (``--spec-type`` is an
    option of the speculative examples only, common/arg.cpp), which also fetches the ``mtp-`` sidecar
    (common_models_handler_init: ``opts.download_mtp``)."""
    hf = f"{repo}:{tag}" if tag else repo
    if draft_mtp:
        cmd = [
            str(toolchain.tool("llama-speculative-simple")),
            "-hf",
            hf,
            "--spec-type",
            "draft-mtp",
            "-p",
            "x",
            "-n",
            "1",
        ]
    else:
        cmd = [str(toolchain.tool("llama-tokenize")), "-hf", hf, "-p", "x"]
    with tempfile.TemporaryDirectory(prefix="llama-hf-cache-") as cache, HubStandin({repo: files}) as hub:
        env = {
            k: v
            for k, v in os.environ.items()
            if k
            not in (
                "HF_TOKEN",
                "HF_ENDPOINT",
                "HF_HUB_CACHE",
                "HUGGINGFACE_HUB_CACHE",
                "HF_HOME",
                "LLAMA_ARG_HF_REPO",
                "LLAMA_ARG_HF_FILE",
                "LLAMA_ARG_MODEL",
                "LLAMA_OFFLINE",
            )
        }
        env.update(
            MODEL_ENDPOINT=hub.endpoint, LLAMA_CACHE=cache, HOME=cache, NO_PROXY="127.0.0.1", no_proxy="127.0.0.1"
        )
        res = subprocess.run(
            cmd, capture_output=True, text=True, env=env, timeout=timeout, stdin=subprocess.DEVNULL, cwd=cache
        )
        return Download(hub.fetched(repo), res.returncode, res.stdout + res.stderr, Path(cache))


def llama_cpp_download(toolchain, files: Mapping[str, bytes], tag: str, draft_mtp: bool = False) -> list[str]:
    """The repo paths the real llama.cpp ``-hf <repo>:<tag>`` fetched from a stand-in Hub serving ``files``
    (``--spec-type draft-mtp`` with ``draft_mtp``), in request order."""
    return run_download(toolchain, files, tag, draft_mtp).fetched
