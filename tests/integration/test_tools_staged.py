"""A staged install's published folder (pipeline/tools_staged.py): a lookup of a tool still compiling waits for the
background process, and one whose compile died fails in one line. The folder is built from the real pinned tools
(their binaries copied, the late one held back and put in by a second process, as the background compile does)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipeline import tools_staged
from pipeline.errors import PipelineError
from pipeline.tools import HELPERS, TOOLS, Toolchain
from pipeline.tools_install import _installed

LATE = "llama-server"


def staged_folder(tmp_path: Path, toolchain) -> Path:
    """``tmp/llama.cpp/<name>``: the pinned folder's toolchain.json with ``pending: [llama-server]`` and every
    binary but that one."""
    root = tmp_path / "llama.cpp" / toolchain.root.name
    (root / "bin").mkdir(parents=True)
    for name in (*TOOLS, *HELPERS):
        if name != LATE:
            shutil.copy2(toolchain.bin_dir / name, root / "bin" / name)
    info = json.loads((toolchain.root / "toolchain.json").read_text())
    (root / "toolchain.json").write_text(json.dumps({**info, "pending": [LATE]}, indent=2) + "\n")
    return root


def chain(root: Path, toolchain) -> Toolchain:
    info = json.loads((root / "toolchain.json").read_text())
    return Toolchain(root=root, bin_dir=root / "bin", convert_script=toolchain.convert_script,
                     gguf_py=toolchain.gguf_py, build_number=toolchain.build_number, commit=toolchain.commit,
                     origin="pinned", pending=tuple(info.get("pending", ())))


# the background compile as install(staged=True) forks it: hold the lock, put the binary in, rewrite toolchain.json
FINISHER = """
import json, os, shutil, sys, time
from pathlib import Path
from pipeline import tools_staged
root, src = Path(sys.argv[1]), Path(sys.argv[2])
fd = tools_staged.hold(root)
print("holding", flush=True)
time.sleep(float(sys.argv[3]))
if sys.argv[4] == "finish":
    shutil.copy2(src, root / "bin" / ".tmp"); os.replace(root / "bin" / ".tmp", root / "bin" / "llama-server")
    info = json.loads((root / "toolchain.json").read_text()); info.pop("pending")
    (root / "toolchain.json").write_text(json.dumps(info, indent=2) + "\\n")
os._exit(0)
"""


def start_finisher(root: Path, toolchain, seconds: float, what: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", FINISHER, str(root), str(toolchain.bin_dir / LATE), str(seconds),
                             what], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "holding"
    return proc


def test_a_pending_tool_is_waited_for_and_then_runs(tmp_path, toolchain):
    root = staged_folder(tmp_path, toolchain)
    tc = chain(root, toolchain)
    assert tc.tool("llama-quantize") == root / "bin" / "llama-quantize"  # a first tool: no wait
    proc = start_finisher(root, toolchain, 1.5, "finish")
    assert _installed(root)  # compiling: what a lookup can use, an install leaves it alone
    t0 = time.monotonic()
    exe = tc.tool(LATE)
    waited = time.monotonic() - t0
    assert proc.wait(10) == 0
    assert exe == root / "bin" / LATE and waited >= 1.0, waited
    out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60)
    assert f"(build {toolchain.build_number}, commit {toolchain.commit})" in out.stdout + out.stderr
    assert "pending" not in json.loads((root / "toolchain.json").read_text()) and _installed(root)
    assert (root / "toolchain.json").read_text() == (toolchain.root / "toolchain.json").read_text()


def test_a_background_compile_that_died_fails_in_one_line_and_is_resumed(tmp_path, toolchain):
    root = staged_folder(tmp_path, toolchain)
    tc = chain(root, toolchain)
    start_finisher(root, toolchain, 0.2, "die").wait(10)
    assert not tools_staged.compiling(root) and not _installed(root)  # `make tools` compiles the rest again
    with pytest.raises(PipelineError) as exc:
        tc.tool(LATE)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(f"llama.cpp tool {LATE}: the background compile into {root} did not "
                                              "finish") and msg.endswith("run `make tools` again"), msg
