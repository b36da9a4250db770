"""A staged install of the pinned tools (``make setup`` on a first run, ``python -m pipeline.tools install --staged``):
the targets the first jobs of a build run are compiled first and published, so that Snakemake starts while the
:data:`LATE` ones compile in a background process; a job that needs one of those waits for it.

The published folder's toolchain.json lists them under ``pending`` until the background compile has copied the last
one in (each binary renamed into place) and rewritten toolchain.json without it, byte for byte the file an
install in one go writes. The background process holds the folder's pending lock from before it starts until it is
done: a lookup of a pending tool (:func:`wait`) blocks on that lock, and finds the tool, or, when the compile died,
says so in one line. Standard library only, like pipeline/tools.py."""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

# Compiled after the rest, in this order: what a build runs last (the draft's acceptance and speed-up, llama-bench)
# and what only some recipes run (llama-imatrix, llama-gguf-split). llama-server alone is a quarter of the compile.
LATE = ("llama-speculative-simple", "llama-server", "llama-bench", "llama-imatrix", "llama-gguf-split")


def pending_lock(root: Path) -> Path:
    return root.parent / f".pending-{root.name}.lock"


def hold(root: Path) -> int:
    """Take the pending lock of the install into ``root`` (before the background process forks, which inherits it):
    its file descriptor."""
    fd = os.open(pending_lock(root), os.O_WRONLY | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def wait(root: Path, name: str) -> None:
    """Block until the background compile into ``root`` is over (its pending lock is free)."""
    path = pending_lock(root)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            t0 = time.monotonic()
            print(f"[tools] {name}: waiting for the background compile of llama.cpp's last tools ({root})",
                  file=sys.stderr, flush=True)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print(f"[tools] {name}: ready after {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def compiling(root: Path) -> bool:
    """A background compile into ``root`` is running (it holds the pending lock)."""
    fd = os.open(pending_lock(root), os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    else:
        fcntl.flock(fd, fcntl.LOCK_UN)
        return False
    finally:
        os.close(fd)
