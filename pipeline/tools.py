"""The one place that finds, installs and runs llama.cpp.

Every llama.cpp call of the pipeline (the converter script and the compiled tools) goes through :func:`run_tool` /
:func:`run_converter`, which locate the binaries, record the build they come from and capture their output in a log.

Where the tools come from, in order:

1. ``LLAMA_CPP_DIR`` (environment) or the ``llama_cpp_dir`` config key: a user's own llama.cpp build (CUDA,
   Metal...): a llama.cpp checkout with ``build/bin`` or a folder of binaries with ``convert_hf_to_gguf.py`` and
   ``gguf-py`` beside them; its build number (``llama-perplexity --version``) must be at least :data:`MIN_BUILD`.
2. The pinned build installed by :func:`pipeline.tools_install.install` into the cache folder
   (``$GGUFPIPE_CACHE`` or ``~/.cache/ggufpipe``), in a folder keyed by everything that shapes it
   (:func:`cache_key`: build, commit, sdist, targets, cmake flags, copied assets, the helpers' sources), so
   that adding a target or a flag, or editing a helper, builds a new folder instead of trusting an old one.
   With ``GGUFPIPE_BACKEND=cuda`` (opt-in, ``make tools BACKEND=cuda CUDA_ARCHS=90``): the same build with CUDA, in
   its own folder; the tools that compute then offload with ``-ngl`` (pipeline/tools_backend.py, docs/gpu.md).

Besides llama.cpp's own tools (:data:`TOOLS`) the pinned build has the pipeline's helpers (:data:`HELPERS`):
small programs in ``pipeline/native/`` compiled as extra targets of the same llama.cpp tree and linked against
its libraries, for what no llama.cpp tool prints (``ggufpipe-conformance``: the vocab facts, tokenization and
chat-template rendering of llama.cpp's own code, for the conformance stage). A user's ``LLAMA_CPP_DIR`` build
does not have them: :meth:`Toolchain.helper` says so in one line.

This module only uses the standard library so that it can run before anything else is installed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import resource
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from pipeline import tools_backend as tb
from pipeline import tools_cross, tools_staged
from pipeline.downloads import pip_fetch as pip_fetch  # re-exported: the demo, installs and tests fetch here
from pipeline.envs import env_python
from pipeline.errors import PipelineError, ToolError
from pipeline.fsutil import kill_hook, kill_now, mid_write_limit, sha256_file

# The pinned llama.cpp: vendored by this llama-cpp-python sdist.
SDIST_NAME = "llama-cpp-python"
SDIST_VERSION = "0.3.36"
SDIST_FILE = "llama_cpp_python-0.3.36.tar.gz"
SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
PINNED_BUILD = 11312
PINNED_COMMIT = "0c1e570"
# Oldest llama.cpp build the pipeline accepts from a user-provided LLAMA_CPP_DIR. The pipeline
# parses llama-perplexity's KL-divergence statistics and uses llama-quantize's type list and
# options as they are in this build; older builds are refused rather than half-working.
MIN_BUILD = PINNED_BUILD

TOOLS = (
    "llama-quantize",
    "llama-perplexity",
    "llama-imatrix",
    "llama-gguf-split",
    "llama-tokenize",
    "llama-speculative-simple",
    "llama-bench",
    "llama-server",
)
# The pipeline's own programs, built as extra targets of the pinned tree: target -> source in pipeline/native/.
# install() writes each into examples/<target>/ with :data:`HELPER_CMAKE` and builds it with the TOOLS.
HELPERS = {
    "ggufpipe-conformance": "conformance.cpp",
    "ggufpipe-logits": "logits.cpp",
}
NATIVE_DIR = Path(__file__).resolve().parent / "native"
# examples/<target>/CMakeLists.txt of a helper: as tools/tokenize/CMakeLists.txt, plus src/ on the include path
# (llama-vocab.h: the EOM id has no C API).
HELPER_CMAKE = """\
set(TARGET {target})
add_executable(${{TARGET}} {target}.cpp)
target_include_directories(${{TARGET}} PRIVATE ${{PROJECT_SOURCE_DIR}}/src)
target_link_libraries(${{TARGET}} PRIVATE llama-common llama ${{CMAKE_THREAD_LIBS_INIT}})
target_compile_features(${{TARGET}} PRIVATE cxx_std_17)
"""
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_CURL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    # llama-server: the deploy lines the builds publish are run with it (tests); its web UI is not embedded and never
    # downloaded (tools/ui/CMakeLists.txt, scripts/ui-assets.cmake: no npm build, no prebuilt-asset download)
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_EXAMPLES=ON",
    f"-DLLAMA_BUILD_NUMBER={PINNED_BUILD}",
    f"-DLLAMA_BUILD_COMMIT={PINNED_COMMIT}",
)
# What install() copies out of the source tree besides the TOOLS binaries: (glob in the tree, folder in the
# cache). Part of the cache key.
ASSETS = (
    ("convert_hf_to_gguf.py", "convert"),
    ("conversion", "convert"),
    ("gguf-py", "convert"),
    ("LICENSE", "."),
    ("models/ggml-vocab-*.gguf", "vocab"),
    # the test strings of those vocabs and the ids Hugging Face's tokenizers gave them (tests/test-tokenizer-0)
    ("models/ggml-vocab-*.gguf.inp", "vocab"),
    ("models/ggml-vocab-*.gguf.out", "vocab"),
)
INSTALL_HINT = "run `make tools` (or `ggufpipe install-tools`), or set LLAMA_CPP_DIR to your own llama.cpp build"


def cache_root() -> Path:
    env = os.environ.get("GGUFPIPE_CACHE")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ggufpipe"


def helper_sources() -> dict[str, str]:
    """SHA256 of each helper's source file, by target name."""
    out = {}
    for target, source in HELPERS.items():
        path = NATIVE_DIR / source
        if not path.is_file():
            raise PipelineError(f"{path}: the source of the helper {target} is missing: restore it from git")
        out[target] = sha256_file(path)
    return out


def cache_key(helpers: dict[str, str] | None = None, backend: str = "cpu", archs: str | None = None) -> str:
    """A digest of everything that shapes the installed tools: the source (build, commit, sdist), the targets,
    the cmake flags, the assets copied beside them, and the helpers (target names, the SHA256 of their
    sources -- ``helpers``, else :func:`helper_sources` -- and their CMakeLists.txt); for a backend other than
    the CPU also the backend, its CUDA architectures and flags (pipeline/tools_backend.py: the CPU key is the same
    as before backends existed). Part of the cache folder's name."""
    spec = {"build": PINNED_BUILD, "commit": PINNED_COMMIT, "sdist_sha256": SDIST_SHA256, "tools": list(TOOLS),
            "cmake_flags": [*CMAKE_FLAGS, *tools_cross.host_flags()], "assets": list(ASSETS),
            "helpers": helper_sources() if helpers is None else helpers, "helper_cmake": HELPER_CMAKE}
    return hashlib.sha256(json.dumps(tb.key_spec(spec, backend, archs), sort_keys=True).encode()).hexdigest()[:12]


def pinned_name(backend: str = "cpu", archs: str | None = None, helpers: dict[str, str] | None = None) -> str:
    """The cache folder's name: ``b<build>-<commit>-<key>`` (cpu), ``b<build>-<commit>-cuda-<key>``."""
    return tb.folder_name(PINNED_BUILD, PINNED_COMMIT, cache_key(helpers, backend, archs), backend)


def pinned_dir(backend: str = "cpu", archs: str | None = None) -> Path:
    return cache_root() / "llama.cpp" / pinned_name(backend, archs)


@dataclass(frozen=True)
class Toolchain:
    root: Path
    bin_dir: Path
    convert_script: Path
    gguf_py: Path
    build_number: int
    commit: str
    origin: str  # "pinned" or "user"
    backend: str = "cpu"  # pipeline/tools_backend.py
    ngl: int = 0  # layers offloaded by the tools that compute (-ngl); 0 on the CPU
    runner: tuple[str, ...] = ()  # a command before each tool: qemu for the emulated aarch64 tools (tools_cross.py)
    pending: tuple[str, ...] = ()  # tools a staged install still compiles in the background (tools_staged.py)

    def tool(self, name: str) -> Path:
        """A llama.cpp tool (:data:`TOOLS`) or a helper (:data:`HELPERS`, see :meth:`helper`); one that a staged
        install still compiles is waited for."""
        exe = self.bin_dir / name
        if name in self.pending and not exe.is_file():
            tools_staged.wait(self.root, name)
            if not exe.is_file():
                raise PipelineError(f"llama.cpp tool {name}: the background compile into {self.root} did not finish "
                                    f"(its log: {self.root.parent / ('.build-' + self.root.name)}/build.log): run "
                                    "`make tools` again")
        if not (exe.is_file() and os.access(exe, os.X_OK)):
            if name in HELPERS and self.origin == "user":
                raise PipelineError(
                    f"the pipeline needs its helper {name}, built with the pinned tools (`make tools`): "
                    f"LLAMA_CPP_DIR={self.root} lacks it (unset LLAMA_CPP_DIR, or build pipeline/native/"
                    f"{HELPERS[name]} as a target of your llama.cpp tree into {self.bin_dir})"
                )
            if name in HELPERS:
                raise PipelineError(f"helper {name} is missing from {self.bin_dir}: run `make tools` "
                                    "(or `python -m pipeline.tools install --force`)")
            raise PipelineError(
                f"llama.cpp tool {name} is missing from {self.bin_dir}: {INSTALL_HINT} "
                f"(a user build needs the target {name})"
            )
        return exe

    def helper(self, name: str) -> Path:
        """One of the pipeline's own programs (:data:`HELPERS`), built only with the pinned tools: a user's
        LLAMA_CPP_DIR build gets a one-line error saying how to get it."""
        if name not in HELPERS:
            raise ValueError(f"{name} is not a helper ({', '.join(HELPERS)})")
        return self.tool(name)

    def describe(self) -> dict:
        return {"llama_cpp_build": self.build_number, "llama_cpp_commit": self.commit, "origin": self.origin,
                "backend": self.backend, **({"ngl": self.ngl} if self.backend != "cpu" else {})}


# --------------------------------------------------------------------------- discovery


def _user_dir_from_config(config_dir: str | None) -> str | None:
    return os.environ.get("LLAMA_CPP_DIR") or config_dir


def find_toolchain(llama_cpp_dir: str | None = None) -> Toolchain:
    """Locate the llama.cpp tools to use; raise one clear PipelineError if they are unusable."""
    user, backend = _user_dir_from_config(llama_cpp_dir), tb.selected_backend()
    if user:
        return _user_toolchain(Path(user).expanduser())
    if backend == "cpu":
        root = pinned_dir()
    else:  # pinned_dir through the module's globals (the unit tier patches it)
        parent = cache_root() / "llama.cpp"
        root = tb.installed_dir(parent, backend, lambda archs: pinned_dir(backend, archs).name) or parent
    info_file = root / "toolchain.json"
    if not info_file.is_file():
        raise PipelineError(tb.not_installed(backend, PINNED_BUILD, root, INSTALL_HINT))
    info = json.loads(info_file.read_text())
    tc = Toolchain(
        root=root,
        bin_dir=root / "bin",
        convert_script=root / "convert" / "convert_hf_to_gguf.py",
        gguf_py=root / "convert" / "gguf-py",
        build_number=int(info["build_number"]),
        commit=str(info["commit"]),
        origin="pinned",
        backend=backend,
        ngl=tb.selected_ngl(backend),
        pending=tuple(info.get("pending", ())),
    )
    for name in (*TOOLS, *HELPERS):
        if name not in tc.pending:
            tc.tool(name)
    return tc


def bin_dir_of(root: Path, exe: str) -> Path | None:
    """The folder of a llama.cpp build (a checkout with ``build/bin``, or a folder of binaries) that holds ``exe``:
    ``build/bin``, ``bin`` or the folder itself; None when none does."""
    return next((d for d in (root / "build" / "bin", root / "bin", root) if (d / exe).is_file()), None)


def _user_toolchain(root: Path) -> Toolchain:
    if not root.is_dir():
        raise PipelineError(f"LLAMA_CPP_DIR={root} is not a folder: point it at your llama.cpp build")
    bin_dir = bin_dir_of(root, "llama-quantize")
    if bin_dir is None:
        raise PipelineError(
            f"LLAMA_CPP_DIR={root} has no llama-quantize (looked in build/bin, bin and the folder itself): "
            "build llama.cpp with `cmake --build build --target llama-quantize llama-perplexity ...`"
        )
    convert = next(
        (p for p in (root / "convert_hf_to_gguf.py", root / "convert" / "convert_hf_to_gguf.py") if p.is_file()),
        None,
    )
    if convert is None:
        raise PipelineError(f"LLAMA_CPP_DIR={root} has no convert_hf_to_gguf.py beside its tools: use a llama.cpp checkout")
    gguf_py = convert.parent / "gguf-py"
    if not (gguf_py / "gguf" / "__init__.py").is_file():
        raise PipelineError(f"LLAMA_CPP_DIR={root} has no gguf-py next to convert_hf_to_gguf.py: use a llama.cpp checkout")
    probe = Toolchain(root, bin_dir, convert, gguf_py, 0, "", "user")
    build, commit = read_build_version(probe.tool("llama-perplexity"))
    if build < MIN_BUILD:
        raise PipelineError(
            f"llama.cpp build b{build} in LLAMA_CPP_DIR={root} is older than the minimum b{MIN_BUILD}: update it"
        )
    backend = tb.selected_backend()  # a user's build may be a CUDA one: GGUFPIPE_BACKEND=cuda offloads with it
    tc = Toolchain(root, bin_dir, convert, gguf_py, build, commit, "user", backend, tb.selected_ngl(backend))
    for name in TOOLS:
        tc.tool(name)
    return tc


# "version: b11312-0c1e570 (build 11312, commit 0c1e570)"; older builds: "version: 4589 (abc1234)".
_VERSION_RES = (
    re.compile(r"version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+([0-9a-fA-F]+|unknown)\)"),
    re.compile(r"version:\s*(\d+)\s*\(([0-9a-fA-F]+|unknown)\)"),
)


def read_build_version(exe: Path, runner: tuple[str, ...] = ()) -> tuple[int, str]:
    """Return (build number, commit) printed by ``<tool> --version`` (run through ``runner``, if any)."""
    try:
        out = subprocess.run([*runner, str(exe), "--version"], capture_output=True, text=True, timeout=60)
    except OSError as exc:
        raise PipelineError(f"cannot run {exe}: {exc}; rebuild it or {INSTALL_HINT}") from exc
    text = out.stdout + out.stderr
    m = next((m for rx in _VERSION_RES if (m := rx.search(text))), None)
    if not m:
        raise PipelineError(f"{exe} --version printed no build number: is it a llama.cpp tool? {INSTALL_HINT}")
    return int(m.group(1)), m.group(2)


# --------------------------------------------------------------------------- running


@dataclass
class ToolResult:
    returncode: int
    output: str
    seconds: float


def _limit_writes(limit: int):
    """preexec_fn of the test-only ``mid-write`` kill point: the tool may write ``limit`` bytes per file."""
    def apply() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return apply


def _run_logged(cmd: list[str], log: Path | None, env: dict | None, label: str, cwd: str | None = None) -> ToolResult:
    """Run ``cmd``, appending its combined output to ``log``; never raises on exit status."""
    start = time.monotonic()
    mid_write = mid_write_limit(cmd)  # test-only fault injection (pipeline/fsutil.py); None when unset
    sink = open(log, "a", encoding="utf-8") if log else None
    try:
        if sink:
            sink.write(f"$ {' '.join(cmd)}\n")
            sink.flush()
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            text=True,
            errors="replace",
            preexec_fn=_limit_writes(mid_write[0]) if mid_write else None,
        )
        chunks: list[str] = []
        assert proc.stdout is not None
        for line in proc.stdout:
            chunks.append(line)
            if sink:
                sink.write(line)
        _, status, usage = os.wait4(proc.pid, 0)  # the tool's own CPU time, for the log line
        rc = proc.returncode = os.waitstatus_to_exitcode(status)
        if sink:
            sink.write(f"[{label} exited {rc} after {time.monotonic() - start:.1f}s, "
                       f"CPU {usage.ru_utime + usage.ru_stime:.1f}s]\n")
    except OSError as exc:
        raise ToolError(label, None, log, f"cannot run {cmd[0]}: {exc}; {INSTALL_HINT}") from exc
    finally:
        if sink:
            sink.close()
    if mid_write:
        kill_now(mid_write[1])
    kill_hook("after-tool", *cmd)
    return ToolResult(rc, "".join(chunks), time.monotonic() - start)


def run_tool(tc: Toolchain, name: str, args: list[str], log: Path | None, check: bool = True,
             cwd: str | Path | None = None) -> ToolResult:
    """Run a compiled llama.cpp tool; raise PipelineError with the log's tail if it fails."""
    argv = tb.tool_argv(name, [str(a) for a in args], tc.backend, tc.ngl)  # -ngl on a GPU backend; as given on the CPU
    res = _run_logged([*tc.runner, str(tc.tool(name)), *argv], log, tb.tool_env(name), name, str(cwd) if cwd else None)
    if check and res.returncode != 0:
        raise ToolError(name, res.returncode, log,
                        f"{name} failed (exit {res.returncode}): {tail(res.output)}" + (f" [log: {log}]" if log else ""))
    return res


def run_converter(tc: Toolchain, args: list[str], log: Path | None) -> ToolResult:
    """Run convert_hf_to_gguf.py in the converter environment (pipeline/envs.py), with the gguf-py that sits beside
    it (never PyPI's gguf)."""
    python = env_python("converter")
    env = tb.clean_env({"PYTHONPATH": os.pathsep.join([str(tc.gguf_py), str(tc.convert_script.parent)])})
    env.pop("NO_LOCAL_GGUF", None)  # the script then puts its own gguf-py first on sys.path
    return _run_logged([str(python), str(tc.convert_script), *map(str, args)], log, env, "convert_hf_to_gguf.py")


def run_helper(tc: Toolchain, name: str, model: str | Path, requests: list, log: Path | None = None,
               timeout: float = 600) -> list:
    """Send a JSON list of requests to a helper (``<helper> MODEL < requests.json``) and return its JSON list
    of answers (one per request; a request it could not answer is ``{"error": ...}``). The command line and
    the helper's stderr go to ``log``. Raises PipelineError, one line, when the helper fails as a whole."""
    exe = tc.helper(name)
    cmd = [str(exe), str(model)]
    start = time.monotonic()
    try:
        proc = subprocess.run(cmd, input=json.dumps(requests).encode(), capture_output=True, timeout=timeout,
                              env=tb.tool_env(name))
    except subprocess.TimeoutExpired as exc:
        raise ToolError(name, None, log, f"{name} on {model} ran over {timeout:.0f}s") from exc
    except OSError as exc:
        raise ToolError(name, None, log, f"cannot run {exe}: {exc}; run `make tools`") from exc
    stderr = proc.stderr.decode("utf-8", "replace")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"$ {' '.join(cmd)} < ({len(requests)} requests)\n{stderr}")
            fh.write(f"[{name} exited {proc.returncode} after {time.monotonic() - start:.1f}s]\n")
    if proc.returncode != 0:
        raise ToolError(name, proc.returncode, log, f"{name} failed on {model} (exit {proc.returncode}): {tail(stderr)}"
                        + (f" [log: {log}]" if log else ""))
    try:
        answers = json.loads(proc.stdout.decode("utf-8"))
    except ValueError as exc:
        raise PipelineError(f"{name} on {model} printed no JSON list of answers: {exc}") from exc
    if not isinstance(answers, list) or len(answers) != len(requests):
        raise PipelineError(f"{name} on {model} answered {len(answers) if isinstance(answers, list) else 'no'} "
                            f"of {len(requests)} requests")
    return answers


@contextlib.contextmanager
def serve_tool(tc: Toolchain, args: list, log: Path | None, timeout: float = 120.0, cwd: str | Path | None = None):
    """``llama-server ARGS`` (in ``cwd``) on a free port of 127.0.0.1 while the block runs; yields its URL once ``/health``
    answers 200 (tools/server/server.cpp). Its output goes to ``log``; it is stopped (SIGTERM, then SIGKILL) on
    the way out. Raises PipelineError, one line, when it exits or does not answer within ``timeout`` seconds."""
    # urllib.request (slow): only the llama-server runs need it
    import urllib.request

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [*tc.runner, str(tc.tool("llama-server")), *map(str, args), "--host", "127.0.0.1", "--port", str(port)]
    out = tempfile.TemporaryFile()
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=str(cwd) if cwd else None,
                            env=tb.tool_env("llama-server"))

    def output() -> str:
        out.seek(0)
        return out.read().decode("utf-8", "replace")

    url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + timeout
    try:
        while True:
            if proc.poll() is not None:
                raise ToolError("llama-server", proc.returncode, log,
                                f"llama-server exited {proc.returncode} before it answered: {tail(output())}")
            # OSError: not listening yet, or 503 while the model loads
            with contextlib.suppress(OSError), urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    break
            if time.monotonic() > deadline:
                raise ToolError("llama-server", None, log,
                                f"llama-server did not answer /health within {timeout:.0f}s: {tail(output())}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if log:
            with open(log, "a", encoding="utf-8") as fh:
                fh.write(f"$ {' '.join(cmd)}\n{output()}[llama-server stopped, exit {proc.returncode}]\n")
        out.close()


def tail(text: str, lines: int = 3) -> str:
    got = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    return " | ".join(got[-lines:]) if got else "(no output)"


# --------------------------------------------------------------------------- fetching pinned packages


@contextlib.contextmanager
def _lock(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


if __name__ == "__main__":  # `python -m pipeline.tools install|where|gguf-py`: pipeline/tools_install.py's command, run
    # in place of this process (not imported: tools_install imports this module, here loaded as __main__)
    os.execv(sys.executable, [sys.executable, "-m", "pipeline.tools_install", *sys.argv[1:]])
