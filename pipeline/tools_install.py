"""Installing the pinned llama.cpp tools (``make tools``, ``ggufpipe install-tools``, ``python -m pipeline.tools
install``): the llama-cpp-python sdist fetched from PyPI by SHA256, built with the pipeline's helpers as extra
targets into the cache folder keyed by :func:`pipeline.tools.cache_key`. Standard library only, like
pipeline/tools.py, so that it runs before anything else is installed."""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

from pipeline import tools, tools_backend, tools_cross, tools_staged
from pipeline.bounds import CORES
from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.tools import (
    ASSETS,
    CMAKE_FLAGS,
    HELPER_CMAKE,
    HELPERS,
    NATIVE_DIR,
    PINNED_BUILD,
    SDIST_FILE,
    SDIST_NAME,
    SDIST_SHA256,
    SDIST_VERSION,
    TOOLS,
    _lock,
    cache_key,
    cache_root,
    pip_fetch,
    tail,
)


def cmake_flags(backend: str = "cpu", archs: str | None = None, device=None) -> list[str]:
    """The cmake flags of an install: :data:`CMAKE_FLAGS`; a device profile's cross flags (pipeline/tools_cross.py)
    for a cross build, else the build box's own (an aarch64 box: its profile's ``-march``); another backend's."""
    arm = tools_cross.cross_flags(device) if device else tools_cross.host_flags()
    return [*CMAKE_FLAGS, *arm, *tools_backend.backend_flags(backend, archs)]


def cmake_commands(src: Path, build: Path, jobs: int, backend: str = "cpu", archs: str | None = None,
                   device=None) -> list[list[str]]:
    """The cmake configure and build command lines of an install (:func:`cmake_flags`): every tool and helper, or a
    cross build's :data:`~pipeline.tools_cross.DEVICE_TOOLS`."""
    targets = tools_cross.DEVICE_TOOLS if device else (*TOOLS, *HELPERS)
    return [["cmake", "-S", str(src), "-B", str(build), *cmake_flags(backend, archs, device)],
            ["cmake", "--build", str(build), "--config", "Release", "-j", str(jobs), "--target", *targets]]


def cross_dir(device) -> Path:
    """The cache folder of a profile's cross-built tools, ``b<build>-<commit>-aarch64-<profile>-<key>``: the key covers
    the source, the targets, the flags (the profile's ``-march`` among them) and the cross compiler's version."""
    spec = {"build": PINNED_BUILD, "commit": tools.PINNED_COMMIT, "sdist_sha256": SDIST_SHA256, "arch": "aarch64",
            "profile": device.name, "tools": list(tools_cross.DEVICE_TOOLS), "cmake_flags": cmake_flags(device=device),
            "compiler": tools_cross.compiler_id()}
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return cache_root() / "llama.cpp" / f"b{PINNED_BUILD}-{tools.PINNED_COMMIT}-aarch64-{device.name}-{key}"


def _paths(final: Path) -> tuple[Path, Path, Path]:
    """(work folder, source tree, build folder) of an install into ``final``."""
    work = final.parent / f".build-{final.name}"
    return work, work / "src" / f"{SDIST_FILE.removesuffix('.tar.gz')}" / "vendor" / "llama.cpp", work / "build"


def print_cmake(backend: str = "cpu", archs: str | None = None, jobs: int | None = None, out=print,
                device=None) -> None:
    """``install --print-cmake``: the cmake command lines an install would run, one per line; builds nothing."""
    archs = tools_backend.normalize_archs(backend, archs)
    final = cross_dir(device) if device else cache_root() / "llama.cpp" / tools.pinned_name(backend, archs)
    _work, src, build = _paths(final)
    for cmd in cmake_commands(src, build, jobs or os.cpu_count() or 2, backend, archs, device):
        out(shlex.join(cmd))


def _installed(final: Path) -> bool:
    """The tools in ``final`` are there, or a staged install's background compile is finishing them (a lookup waits)."""
    try:
        info = json.loads((final / "toolchain.json").read_text())
    except (OSError, ValueError):
        return False
    return not info.get("pending") or tools_staged.compiling(final)


def install(jobs: int | None = None, force: bool = False, backend: str = "cpu", archs: str | None = None,
            device=None, staged: bool = False) -> Path:
    """Build the pinned llama.cpp tools (for ``backend``, pipeline/tools_backend.py) into the cache, or with
    ``device`` (a pipeline/tools_cross.py profile) cross-build the device tools for it; a no-op when already
    installed. ``staged``: publish the tools the first jobs of a build need and compile the
    :data:`~pipeline.tools_staged.LATE` ones in a background process (pipeline/tools_staged.py)."""
    archs = tools_backend.normalize_archs(backend, archs)  # cuda without architectures: refused here, in one line
    final = cross_dir(device) if device else tools.pinned_dir(backend, archs)  # through the module: tests patch it
    if _installed(final) and not force:
        print(f"[tools] llama.cpp b{PINNED_BUILD} already installed in {final}", flush=True)
        return final
    if shutil.which("cmake") is None:
        raise PipelineError("cmake is not installed: install it (e.g. `apt-get install cmake`) to build llama.cpp")
    root = cache_root()
    with _lock(root / "llama.cpp" / f".install-{final.name}.lock"):  # one build per folder at a time
        if _installed(final) and not force:
            return final
        t0 = time.monotonic()
        sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, root / "downloads", sdist=True)
        # A fixed build folder per version: a failed or interrupted install resumes incrementally.
        work, _src, build = _paths(final)
        if (work / "src").exists():
            shutil.rmtree(work / "src")
        shutil.rmtree(work / "out", ignore_errors=True)
        work.mkdir(parents=True, exist_ok=True)
        try:
            print(f"[tools] unpacking {sdist.name}", flush=True)
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
                tar.extractall(work / "src", members=members, filter="data")
            src = next((work / "src").glob("*/vendor/llama.cpp"))
            helpers = {} if device else _add_helpers(src)
            if not device and final.name != tools.pinned_name(backend, archs, helpers):  # as pinned_dir() named it
                raise PipelineError(f"a helper's source in {NATIVE_DIR} changed while installing: run the install again")
            jobs = jobs or os.cpu_count() or 2
            configure, compile_ = cmake_commands(src, build, jobs, backend, archs, device)
            what = f"aarch64, profile {device.name}, -march={device.march}" if device else backend
            print(f"[tools] configuring llama.cpp b{PINNED_BUILD} ({what}) with cmake", flush=True)
            _check_call(configure, work / "cmake.log")
            head, targets = compile_[:compile_.index("--target") + 1], compile_[compile_.index("--target") + 1:]
            late = [t for t in targets if t in tools_staged.LATE] if staged and not device else []
            first = [t for t in targets if t not in late]
            print(f"[tools] building {' '.join(first)} with {jobs} jobs (several minutes)"
                  + (f"; then, beside the first jobs, {' '.join(late)}" if late else ""), flush=True)
            _check_call([*head, *first], work / "build.log", progress=True)
            targets = first
            stage = work / "out"
            (stage / "bin").mkdir(parents=True)
            for name in targets:
                shutil.copy2(build / "bin" / name, stage / "bin" / name)
            if device:
                shutil.copy2(src / "LICENSE", stage / "LICENSE")
                _write_cross_info(stage, final, device, configure, t0)
                return _finish(stage, final, work, t0)
            for pattern, dest in ASSETS:
                for path in sorted(src.glob(pattern)):
                    target = stage / dest / path.name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    (shutil.copytree if path.is_dir() else shutil.copy2)(path, target)
            build_no, commit = tools.read_build_version(stage / "bin" / "llama-perplexity")
            if build_no != PINNED_BUILD:
                raise PipelineError(f"built llama.cpp reports b{build_no}, expected b{PINNED_BUILD}")
            info = {
                "build_number": build_no,
                "commit": commit,
                "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
                "sdist_sha256": SDIST_SHA256,
                "cmake_flags": cmake_flags(backend, archs),
                "backend": backend,
                **({"cuda_archs": archs} if archs else {}),
                "tools": list(TOOLS),
                "helpers": helpers,
                "assets": list(ASSETS),
                "cache_key": cache_key(helpers, backend, archs),
            }
            if late:
                return _publish_staged(stage, final, work, build, [*head, *late], info, t0)
            (stage / "toolchain.json").write_text(json.dumps(info, indent=2) + "\n")
            return _finish(stage, final, work, t0)
        finally:
            if not (final / "toolchain.json").is_file():
                print(f"[tools] install into {final} did not finish: the next run resumes in {work}", flush=True)


def _publish_staged(stage: Path, final: Path, work: Path, build: Path, compile_late: list[str], info: dict,
                    t0: float) -> Path:
    """Publish the first tools with the late ones ``pending``, then compile those in a forked background process
    that holds the pending lock until each is renamed into ``final/bin`` and toolchain.json says what an install in
    one go says (pipeline/tools_staged.py)."""
    late = compile_late[compile_late.index("--target") + 1:]
    (stage / "toolchain.json").write_text(json.dumps({**info, "pending": late}, indent=2) + "\n")
    fd = tools_staged.hold(final)  # before the fork: no lookup finds the tools pending and the lock free
    if final.exists():
        shutil.rmtree(final)
    os.replace(stage, final)
    sys.stdout.flush()
    if os.fork():
        os.close(fd)  # the background process's copy keeps the lock
        print(f"[tools] the first tools are in {final} ({time.monotonic() - t0:.0f}s); {', '.join(late)} compile "
              "in the background (a job that needs one waits for it)", flush=True)
        return final
    code = 1
    try:
        _check_call(compile_late, work / "build-late.log", progress=True)
        for name in late:
            tmp = final / "bin" / f".{name}.tmp-{os.getpid()}"
            shutil.copy2(build / "bin" / name, tmp)
            os.replace(tmp, final / "bin" / name)
        tmp = final / f".toolchain.json.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(info, indent=2) + "\n")
        os.replace(tmp, final / "toolchain.json")
        shutil.rmtree(work, ignore_errors=True)
        print(f"[tools] installed llama.cpp b{PINNED_BUILD} in {final}, its last tools too "
              f"({time.monotonic() - t0:.0f}s)", flush=True)
        code = 0
    except BaseException as exc:  # a compile that failed: the lookups say so, `make tools` resumes it
        with contextlib.suppress(Exception):
            print(f"[tools] the background compile into {final} failed: {exc}", file=sys.stderr, flush=True)
    finally:
        os._exit(code)  # not the parent's cleanup (locks, temporary folders): the lock is freed as the process ends


def _finish(stage: Path, final: Path, work: Path, t0: float) -> Path:
    if final.exists():
        shutil.rmtree(final)
    os.replace(stage, final)
    shutil.rmtree(work, ignore_errors=True)
    print(f"[tools] installed llama.cpp b{PINNED_BUILD} in {final} ({time.monotonic() - t0:.0f}s)", flush=True)
    return final


def _write_cross_info(stage: Path, final: Path, device, configure: list[str], t0: float) -> None:
    """toolchain.json of a cross build, once its binaries prove the profile: the version they print under qemu
    (``max``: only ``--version`` runs) and the dot-product instructions in each (none: the flags did not take)."""
    build_no, commit = tools.read_build_version(stage / "bin" / "llama-perplexity", tools_cross.qemu_prefix(None))
    if build_no != PINNED_BUILD:
        raise PipelineError(f"built llama.cpp reports b{build_no}, expected b{PINNED_BUILD}")
    sdot = {name: tools_cross.count_sdot(stage / "bin" / name) for name in tools_cross.DEVICE_TOOLS}
    if "DOTPROD" in device.features and not all(sdot.values()):
        raise PipelineError(f"profile {device.name}: no sdot/udot in {', '.join(n for n, c in sdot.items() if not c)} "
                            f"although -march={device.march} has dotprod: the flags did not reach ggml-cpu")
    info = {"build_number": build_no, "commit": commit, "sdist": f"{SDIST_NAME}=={SDIST_VERSION}",
            "sdist_sha256": SDIST_SHA256, "arch": "aarch64", "profile": device.name, "march": device.march,
            "compiler": tools_cross.compiler_id(), "cmake_flags": configure[5:], "tools": list(tools_cross.DEVICE_TOOLS),
            "dot_instructions": sdot, "build_seconds": round(time.monotonic() - t0, 1),
            "cache_key": final.name.rsplit("-", 1)[1]}
    (stage / "toolchain.json").write_text(json.dumps(info, indent=2) + "\n")


def gguf_py_source() -> Path:
    """The pinned tree's gguf-py, unpacked from the sdist on its own (seconds, beside the compile's lock): the venv
    installs it while the tools compile, on a first run. The same files as the toolchain's ``convert/gguf-py``."""
    root = cache_root() / "llama.cpp"
    final = root / f"gguf-py-b{PINNED_BUILD}-{SDIST_SHA256[:12]}"
    with _lock(root / ".gguf-py.lock"):
        if not (final / "gguf" / "__init__.py").is_file():
            sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, cache_root() / "downloads", sdist=True)
            tmp = final.with_name(final.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            with tarfile.open(sdist) as tar:
                members = [m for m in tar.getmembers() if "/vendor/llama.cpp/gguf-py/" in m.name]
                tar.extractall(tmp, members=members, filter="data")
            shutil.rmtree(final, ignore_errors=True)
            os.replace(next(tmp.glob("*/vendor/llama.cpp/gguf-py")), final)
            shutil.rmtree(tmp)
    return final


def _add_helpers(src: Path) -> dict[str, str]:
    """Write each helper into the unpacked tree as examples/<target>/ and add it to examples/CMakeLists.txt
    (built because LLAMA_BUILD_EXAMPLES=ON; the tree is unpacked afresh by every install). Returns the SHA256
    of the sources written, by target."""
    examples = src / "examples" / "CMakeLists.txt"
    if not examples.is_file():
        raise PipelineError(f"{examples} is missing: the pinned llama.cpp tree has no examples/ to build the helpers in")
    lines, written = [], {}
    for target, source in HELPERS.items():
        folder = examples.parent / target
        folder.mkdir(exist_ok=True)
        (folder / "CMakeLists.txt").write_text(HELPER_CMAKE.format(target=target))
        shutil.copyfile(NATIVE_DIR / source, folder / f"{target}.cpp")
        written[target] = sha256_file(folder / f"{target}.cpp")
        lines.append(f"add_subdirectory({target})  # added by ggufpipe (pipeline/tools.py)\n")
    with open(examples, "a") as fh:
        fh.write("\n" + "".join(lines))
    return written


def _check_call(cmd: list[str], log: Path, progress: bool = False) -> None:
    """Run ``cmd`` into ``log``; ``progress``: cmake's percentage every 5 points and each tool it links, so that a
    compile of minutes is not minutes of silence."""
    shown = -5
    with open(log, "w") as fh:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            fh.write(line)
            m = re.match(r"^\[\s*(\d+)%\]", line) if progress else None
            pct = int(m.group(1)) if m else -1
            if m and (pct >= shown + 5 or pct == 100 > shown or "Linking CXX executable" in line):
                shown = max(shown, pct)
                with contextlib.suppress(OSError):  # a background compile's terminal may be gone
                    print(f"[tools] {line.strip()}", flush=True)
        rc = proc.wait()
    if rc != 0:  # the whole command line first (a flag the compiler rejects is in it), then the one-line error
        print(f"[tools] {shlex.join(cmd)}", file=sys.stderr, flush=True)
        raise PipelineError(f"`{' '.join(cmd[:3])} ...` failed (exit {rc}): {tail(log.read_text(), 5)} [log: {log}]")


def _target(args) -> tuple[str, str | None, object]:
    """(backend, CUDA architectures, device profile of a cross build or None) of ``install``'s arguments. On an
    aarch64 box the profile shapes the native build (through :data:`~pipeline.tools_cross.PROFILE_ENV`); a Jetson
    profile also selects CUDA at its architecture; on x86 ``--arch aarch64`` cross-builds the device tools."""
    if not args.arch and not args.profile and not tools_cross.host_is_arm():
        return args.backend, args.cuda_archs, None
    if args.arch is None and not tools_cross.host_is_arm():
        raise PipelineError(f"PROFILE={args.profile}: a device profile is for an aarch64 build: add ARCH=aarch64")
    device = tools_cross.profile(args.profile, args.arch or "aarch64")  # no profile: refused, saying why
    if device.baseline:
        print(f"[tools] PROFILE={device.name}, asked for by name: {tools_cross.BASELINE_WHY}", flush=True)
    jetson = tools_cross.JETSON.get(args.profile or "")
    if tools_cross.host_is_arm():
        os.environ[tools_cross.PROFILE_ENV] = device.name
        if jetson:
            return "cuda", args.cuda_archs or jetson.cuda_arch, None
        return args.backend, args.cuda_archs, None
    if jetson:
        raise PipelineError(f"PROFILE={jetson.name}: a Jetson's tools build on the Jetson, with JetPack {jetson.jetpack}'s "
                            f"CUDA {jetson.cuda} (sm_{jetson.cuda_arch}): there, `make tools BACKEND=cuda "
                            f"CUDA_ARCHS={jetson.cuda_arch} PROFILE={jetson.name}` "
                            "(docs/devices.md#jetson); from here `make tools ARCH=aarch64 "
                            f"PROFILE={jetson.cpu}` cross-builds its CPU tools")
    if args.backend != "cpu":
        raise PipelineError("a cross build is CPU only: a Jetson's CUDA tools build on the Jetson (docs/devices.md)")
    return "cpu", None, device


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipeline.tools", description=tools.__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_inst = sub.add_parser("install", help="build the pinned llama.cpp tools into the cache")
    p_inst.add_argument("-j", "--jobs", type=CORES.arg("--jobs"))
    p_inst.add_argument("--force", action="store_true")
    p_inst.add_argument("--backend", choices=tools_backend.BACKENDS, default="cpu",
                        help="cpu (default) or cuda: opt-in, with --cuda-archs (docs/gpu.md)")
    p_inst.add_argument("--cuda-archs", metavar="LIST", help="CMAKE_CUDA_ARCHITECTURES for --backend cuda, e.g. 90")
    p_inst.add_argument("--arch", choices=tools_cross.ARCHES,
                        help="cross-build the device tools for aarch64 with --profile (docs/devices.md#arm)")
    p_inst.add_argument("--profile", help=f"the device CPU profile of an aarch64 build: {tools_cross.names()}")
    p_inst.add_argument("--staged", action="store_true",
                        help="publish the tools a build's first jobs need, compile the rest in the background "
                             "(make setup on a first run)")
    p_inst.add_argument("--print-cmake", action="store_true",
                        help="print the cmake configure and build command lines and exit without building")
    sub.add_parser("where", help="print the folder of the tools in use")
    p_gguf = sub.add_parser("gguf-py", help="print the folder of the gguf-py that matches the tools")
    p_gguf.add_argument("--source", action="store_true",
                        help="the pinned tree's, unpacked from the sdist if need be: needs no compiled tools")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "install":
            backend, archs, device = _target(args)
            if args.print_cmake:
                print_cmake(backend, archs, args.jobs, device=device)
            else:
                install(args.jobs, args.force, backend, archs, device, staged=args.staged)
        elif args.cmd == "where":
            print(tools.find_toolchain().bin_dir)
        elif args.cmd == "gguf-py":  # LLAMA_CPP_DIR: the user's own tree's, compiled or not
            use_source = args.source and not os.environ.get("LLAMA_CPP_DIR")
            print(gguf_py_source() if use_source else tools.find_toolchain().gguf_py)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
