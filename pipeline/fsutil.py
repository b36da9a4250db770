"""Atomic file output, hashing, and the test-only kill hook.

Every stage writes through :func:`atomic_output`: the tool writes to a hidden temporary name in the
destination folder (``.<name>.tmp-<pid>``) and the file is renamed into place only after the stage
succeeded, so a failed or killed stage never leaves a file that looks finished. A temporary left by a
killed process is removed by the next :func:`atomic_output` for the same name (once its pid is gone).

Fault injection (tests only; ``tests/e2e/test_faults.py``): ``PIPELINE_TEST_KILL=<point>:<suffix>[:group]``
SIGKILLs the stage process at ``point`` when the path involved ends with ``suffix`` (``:group`` kills
its whole process group instead: Snakemake and every job, like a power cut, when Snakemake was started
in a session of its own). Unset, the hook costs one environment lookup. Points:

* ``before-rename``: the output is complete under its temporary name, not yet renamed (atomic_output);
* ``after-rename``: the output was just renamed into place; the stage's later outputs (its record)
  are not written;
* ``after-tool``: a llama.cpp tool or the converter just exited (pipeline/tools.py); the suffix is
  matched against the program and each of its arguments (temporary names as their final names);
* ``mid-write``: the tool writing the temporary file of a name ending with ``suffix`` may write only
  :data:`MID_WRITE_BYTES` bytes (``RLIMIT_FSIZE``: the kernel stops it with SIGXFSZ, or EFBIG for
  Python), then the stage kills itself: a partly written temporary file stays behind.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import signal
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

KILL_ENV = "PIPELINE_TEST_KILL"
MID_WRITE_BYTES = 256 << 10
_TMP_RE = re.compile(r"^\.(.+)\.tmp-(\d+)$")


def _tmp_name(final: Path) -> Path:
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def final_name(path: str | os.PathLike) -> str:
    """``path`` as a string, with a temporary name ``.<name>.tmp-<pid>`` given as its final ``<name>``."""
    p = Path(path)
    m = _TMP_RE.match(p.name)
    return str(p.with_name(m.group(1))) if m else str(p)


def _remove_stale_tmps(final: Path) -> None:
    """Temporaries of ``final`` left by processes that no longer run (a kill -9, a power cut)."""
    try:
        found = list(final.parent.glob(f".{glob_escape(final.name)}.tmp-*"))
    except OSError:
        return
    for p in found:
        m = _TMP_RE.match(p.name)
        if not m or m.group(1) != final.name:
            continue
        pid = int(m.group(2))
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            _remove(p)
        except OSError:  # alive but another user's: leave it
            pass


def glob_escape(name: str) -> str:
    return re.sub(r"([*?\[])", r"[\1]", name)


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
    _remove_stale_tmps(final)
    try:
        yield tmp
        if not tmp.exists():
            raise FileNotFoundError(f"stage produced no output for {final}")
        if tmp.is_file():
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())
        kill_hook("before-rename", final)
        if final.is_dir() and not final.is_symlink():
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_dir(final.parent)
        kill_hook("after-rename", final)
    except BaseException:
        _remove(tmp)
        raise


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _kill_spec() -> tuple[str, str, bool] | None:
    spec = os.environ.get(KILL_ENV)
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    suffix, _, scope = rest.partition(":")
    return point, suffix, scope == "group"


def kill_now(group: bool = False) -> None:
    """SIGKILL this process, or its whole process group."""
    if group:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def kill_hook(point: str, *paths: str | os.PathLike) -> None:
    """Test-only fault injection (see the module doc): SIGKILL at ``point`` when one of ``paths`` (temporary
    names read as their final names) ends with the suffix of ``PIPELINE_TEST_KILL``."""
    spec = _kill_spec()
    if spec is None:
        return
    want, suffix, group = spec
    if want == point and any(final_name(p).endswith(suffix) for p in paths):
        kill_now(group)


def mid_write_limit(args) -> tuple[int, bool] | None:
    """(byte limit, group) when ``PIPELINE_TEST_KILL=mid-write:<suffix>`` names the temporary output among a
    tool's ``args``; None otherwise (always, outside tests)."""
    spec = _kill_spec()
    if spec is None or spec[0] != "mid-write":
        return None
    for a in args:
        if _TMP_RE.match(Path(str(a)).name) and final_name(a).endswith(spec[1]):
            return MID_WRITE_BYTES, spec[2]
    return None


def write_text_atomic(final: str | os.PathLike, text: str) -> None:
    with atomic_output(final) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(final: str | os.PathLike, data) -> None:
    write_text_atomic(final, json.dumps(data, indent=2, sort_keys=False, ensure_ascii=False) + "\n")


# What a file from outside (a manifest, a device result, a recipe) may hold: a manifest of a 1,000-file build is
# about 2 MB; a device-check result is 1-3 kB (``ggufpipe collect`` caps it lower).
INPUT_MAX_BYTES = 64 << 20


def read_input(path: str | os.PathLike, limit: int = INPUT_MAX_BYTES) -> bytes:
    """The bytes of a file given from outside, or ``ValueError`` saying why not, in a few words: only a regular file
    (a FIFO or a device would block or never end: it is opened without blocking and refused), at most ``limit`` bytes.
    ``OSError`` (missing, unreadable) passes through."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ValueError("a folder, not a file")
        if not stat.S_ISREG(st.st_mode):
            raise ValueError("not a regular file (a FIFO, socket or device)")
        if st.st_size > limit:
            raise ValueError(f"{st.st_size} bytes, more than the {limit} allowed")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise ValueError(f"more than the {limit} bytes allowed")
    return data


def parse_json(data: bytes | str):
    """JSON from outside: ``ValueError`` (with the reason) for bad syntax, bad UTF-8 and nesting too deep for the
    parser (a RecursionError, which is not a ValueError)."""
    try:
        return json.loads(data)
    except RecursionError:
        raise ValueError("nested too deeply") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8: {exc.reason}") from None


def read_json(path: str | os.PathLike, what: str, limit: int = INPUT_MAX_BYTES):
    """A JSON file from outside (``what``: a manifest, a device-check result ...), or one error line naming the file:
    :class:`~pipeline.errors.PipelineError` ``<path>: cannot read <what>: <why>``."""
    from pipeline.errors import PipelineError

    try:
        return parse_json(read_input(path, limit))
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read {what}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise PipelineError(f"{path}: cannot read {what}: {exc}") from None


_AHEAD: dict[tuple[int, int, int, int], object] = {}  # file identity -> Future of its SHA256 (hashing_ahead)


def file_identity(path: str | os.PathLike) -> tuple[int, int, int, int]:
    """(device, inode, size, mtime in ns): changes when the file is replaced or rewritten."""
    st = os.stat(path)
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


def _sha256_if_unchanged(path: str | os.PathLike, ident: tuple) -> str | None:
    # 16 MiB per update: hashlib drops the GIL for each, and a busy caller thread gives it back only every
    # 5 ms (sys.getswitchinterval), so small blocks left this thread waiting more than hashing
    digest = _sha256_read(path, 16 << 20)
    return digest if file_identity(path) == ident else None


@contextlib.contextmanager
def hashing_ahead(paths, workers: int = 1) -> Iterator[None]:
    """Hash ``paths`` in ``workers`` helper threads while the caller goes on: inside the block,
    :func:`sha256_file` of one of those files (same inode, size and mtime, by any path: a hard link too) waits
    for that result instead of reading the file again. hashlib and file reads release the GIL, so the hashing
    runs beside the caller's Python work (fetch: importing huggingface_hub; publish: parsing headers) and on
    idle cores. A file changed while it was hashed is hashed again by the caller."""
    pool = ThreadPoolExecutor(workers, thread_name_prefix="sha256-ahead")
    mine = []
    try:
        for p in paths:
            try:
                ident = file_identity(p)
            except OSError:
                continue  # the caller reports a missing file itself
            if ident not in _AHEAD:
                _AHEAD[ident] = pool.submit(_sha256_if_unchanged, p, ident)
                mine.append(ident)
        yield
    finally:
        for ident in mine:
            _AHEAD.pop(ident).cancel()
        pool.shutdown(wait=True, cancel_futures=True)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    if _AHEAD:
        try:
            fut = _AHEAD.get(file_identity(path))
        except OSError:
            fut = None
        try:
            digest = fut.result() if fut is not None else None
        except OSError:
            digest = None  # read it here: the error, if any, comes from this caller
        if digest:
            return digest
    return _sha256_read(path, chunk)


def _sha256_read(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Read into one reused buffer: 15 % faster than a new bytes object per block (1.55 GB/s here)."""
    h = hashlib.sha256()
    buf = bytearray(chunk)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as fh:
        while n := fh.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()
