"""The Snakefile's pre-flight (pipeline/workflow.py preflight, pipeline/devices/plan.py check_jobs) on real Snakemake
runs of the tiny model: a build that a real small tmpfs cannot hold is refused in one line, before any job starts; a
fake meminfo refuses memory the same way; a no-op re-run on a full filesystem is never refused."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from helpers import snakemake


def _mount_tmpfs(folder: Path, size: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    if shutil.which("mount") is None:
        pytest.skip("no mount command")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True,
                         text=True)
    if res.returncode:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {res.stderr.strip()}")


def _umount(folder: Path) -> None:
    subprocess.run(["umount", "-l", str(folder)], capture_output=True)


def _errors(res) -> list[str]:
    return [ln for ln in (res.stdout + res.stderr).splitlines() if ln.startswith("error: ")]


def test_a_build_the_disk_cannot_hold_is_refused_before_any_job(tmp_path, tiny_hub):
    hub, recipe = tiny_hub
    small = tmp_path / "small"
    _mount_tmpfs(small, "8m")  # the tiny build needs ~10.6 MiB (ggufpipe plan)
    try:
        res = snakemake(small, recipe, hub=hub)
        assert res.returncode != 0
        errors = _errors(res)
        assert len(errors) == 1, res.stdout[-2000:] + res.stderr[-2000:]
        assert errors[0].startswith("error: not enough disk for ") and " free " in errors[0], errors
        assert "of tiny-hub" in errors[0] and "MiB" in errors[0]
        assert not (small / "work").exists() and not (small / "artifacts").exists()  # nothing started
        assert "localrule" not in res.stdout + res.stderr and "Traceback" not in res.stderr
    finally:
        _umount(small)


def test_memory_refused_through_a_fake_meminfo(tmp_path, tiny_hub):
    hub, recipe = tiny_hub
    fake = tmp_path / "meminfo"
    fake.write_text("MemTotal:  1048576 kB\nMemFree:  4096 kB\nMemAvailable:  8192 kB\n")
    res = snakemake(tmp_path / "build", recipe, hub=hub, env={"GGUFPIPE_MEMINFO": str(fake)})
    assert res.returncode != 0
    errors = _errors(res)
    assert len(errors) == 1 and errors[0].startswith("error: not enough memory for convert F16 of tiny-hub: "), errors
    assert "8.0 MiB available" in errors[0]
    assert not (tmp_path / "build" / "work").exists()


def test_a_no_op_rerun_on_a_full_filesystem_is_not_refused(tmp_path, tiny_build, tiny_hub):
    hub, recipe = tiny_hub
    full = tmp_path / "full"
    _mount_tmpfs(full, "64m")
    try:
        subprocess.run(["cp", "-a", f"{tiny_build}/.", str(full)], check=True)
        used = sum(f.stat().st_size for f in full.rglob("*") if f.is_file())
        subprocess.run(["mount", "-o", f"remount,size={used // 1024 + 512}k", str(full)], check=True)
        fake = tmp_path / "meminfo"
        fake.write_text("MemAvailable:  1024 kB\n")
        res = snakemake(full, recipe, hub=hub, env={"GGUFPIPE_MEMINFO": str(fake)})
        assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
        assert "Nothing to be done" in res.stdout + res.stderr and not _errors(res)
    finally:
        _umount(full)
