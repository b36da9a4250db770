"""Atomic file output and hashing.

Every stage writes through :func:`atomic_output`: the tool writes to a hidden temporary name in the
destination folder and the file is renamed into place only after the stage succeeded, so a failed
or killed stage never leaves a file that looks finished.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def _fsync_dir(folder: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_output(final: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path next to ``final``; rename it to ``final`` on success.

    On any exception (or if the body did not create the file) the temporary file or folder is
    removed and ``final`` is left as it was.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(final)
    _remove(tmp)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"stage produced no output for {final}")
        if tmp.is_file():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        _maybe_kill_hook("before-rename", final)
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _maybe_kill_hook(point: str, final: Path) -> None:
    """Test-only fault injection: ``PIPELINE_TEST_KILL=<point>:<suffix>`` kills this process
    with SIGKILL at ``point`` when the output name ends with ``suffix``."""
    spec = os.environ.get("PIPELINE_TEST_KILL")
    if not spec:
        return
    want_point, _, suffix = spec.partition(":")
    if want_point == point and final.name.endswith(suffix):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def write_text_atomic(final: str | os.PathLike, text: str) -> None:
    with atomic_output(final) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(final: str | os.PathLike, data) -> None:
    write_text_atomic(final, json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


def sha256_file(path: str | os.PathLike, chunk: int = 8 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while True:
            block = fh.read(chunk)
            if not block:
                break
            h.update(block)
    return h.hexdigest()
