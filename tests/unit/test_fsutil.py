"""Atomic outputs, hashing ahead, GGUF magic check and the release of Snakemake's scheduler timers."""

from __future__ import annotations

import pytest

from pipeline.errors import PipelineError
from pipeline.fsutil import atomic_output, sha256_file
from pipeline.gguf import read_facts


def test_wrong_magic_refused(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(PipelineError, match=r"not a GGUF file \(magic b'GGML'"):
        read_facts(bad)


def test_atomic_output_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "out.gguf"
    final.write_bytes(b"old")
    with pytest.raises(RuntimeError):
        with atomic_output(final) as tmp:
            tmp.write_bytes(b"half-written")
            raise RuntimeError("tool died")
    assert final.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.gguf"]
    with atomic_output(final) as tmp:
        tmp.write_bytes(b"new")
    assert final.read_bytes() == b"new" and [p.name for p in tmp_path.iterdir()] == ["out.gguf"]


def test_hashing_ahead_serves_hard_links_and_rehashes_changed_files(tmp_path):
    """sha256_file inside hashing_ahead: the helper's digest for the same inode (a hard link too); a file
    rewritten after it was queued is hashed again, never given its old digest."""
    import hashlib
    import os

    from pipeline.fsutil import _AHEAD, hashing_ahead

    a, b = tmp_path / "a.bin", tmp_path / "b.bin"
    a.write_bytes(os.urandom(3 << 20))
    b.write_bytes(b"x" * (1 << 20))
    link = tmp_path / "link.bin"
    os.link(a, link)
    with hashing_ahead([a, b, tmp_path / "missing.bin"], workers=2):
        assert len(_AHEAD) == 2
        assert sha256_file(link) == hashlib.sha256(a.read_bytes()).hexdigest()
        b.write_bytes(b"y" * (1 << 20))  # b changes: same size, same inode, new content
        os.utime(b, ns=(1, 1))  # and surely another mtime, whatever the filesystem's time granularity
        assert sha256_file(b) == hashlib.sha256(b"y" * (1 << 20)).hexdigest()
    assert _AHEAD == {}


def test_release_scheduler_timers_cancels_pending_timers():
    """The Snakefile's onsuccess/onerror: a pending threading.Timer (Snakemake's rate limiter arms one per
    scheduling pass) ends at once instead of holding the interpreter until it fires."""
    import threading

    from pipeline.workflow import release_scheduler_timers

    fired = []
    t = threading.Timer(60, lambda: fired.append(1))
    t.start()
    release_scheduler_timers()
    t.join(5)
    assert not t.is_alive() and fired == []
