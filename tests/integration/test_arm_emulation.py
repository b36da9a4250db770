"""The emulated ARM core is the profile's, not qemu's ``max`` (issue #34): a dot-product instruction runs on the
Cortex-A76 and dies with SIGILL on the Cortex-A53 (armv8-a), an int8 matmul dies on the A76, and the feature check
turns that death into one line naming the profile. Real programs from Debian's cross compiler under Debian's
qemu-user; the llama.cpp tools themselves run under it in tests/e2e/test_device_check.py."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from pipeline import tools_cross
from pipeline.errors import PipelineError

pytestmark = pytest.mark.skipif(
    shutil.which("aarch64-linux-gnu-gcc") is None or shutil.which(tools_cross.QEMU) is None,
    reason=f"no aarch64 cross compiler or qemu-user: apt-get install {tools_cross.DEBIAN_PACKAGES} (.ci/run does)")

PROGRAMS = {  # one instruction each, and the -march that lets the assembler take it
    "sdot": ("sdot v0.4s, v1.16b, v2.16b", "armv8.2-a+dotprod"),
    "smmla": ("smmla v0.4s, v1.16b, v2.16b", "armv8.2-a+i8mm"),
    "plain": ("add v0.4s, v1.4s, v2.4s", "armv8-a"),
}


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("arm")
    out = {}
    for name, (insn, march) in PROGRAMS.items():
        src = folder / f"{name}.c"
        src.write_text(f'int main(void) {{ __asm__ volatile("{insn}"); return 0; }}\n')
        subprocess.run(["aarch64-linux-gnu-gcc", f"-march={march}", "-O1", "-o", str(folder / name), str(src)],
                       check=True)
        out[name] = folder / name
    return out


def _run(profile: str, exe) -> subprocess.CompletedProcess:
    return subprocess.run([*tools_cross.qemu_prefix(tools_cross.PROFILES[profile]), str(exe)], capture_output=True)


def test_each_core_takes_only_its_own_instructions(programs):
    assert _run("cortex-a76", programs["sdot"]).returncode == 0
    assert _run("cortex-a76", programs["smmla"]).returncode == -4  # the A76 has no i8mm: SIGILL
    assert _run("armv8-a", programs["sdot"]).returncode == -4  # the baseline's A53 has no dotprod
    assert _run("armv8-a", programs["plain"]).returncode == 0
    # qemu's default `max` runs both, which is why no profile emulates on it
    assert subprocess.run([*tools_cross.qemu_prefix(None), str(programs["smmla"])]).returncode == 0


def test_sigill_is_one_line_naming_the_profile(programs):
    res = _run("cortex-a76", programs["smmla"])
    with pytest.raises(PipelineError, match="SIGILL on profile cortex-a76 \\(core cortex-a76\\)") as e:
        tools_cross.check_features(tools_cross.PROFILES["cortex-a76"], res.stderr.decode(), res.returncode, "probe")
    assert "\n" not in str(e.value)


def test_dot_instructions_counted(programs):
    assert tools_cross.count_sdot(programs["sdot"]) == 1
    assert tools_cross.count_sdot(programs["plain"]) == 0
