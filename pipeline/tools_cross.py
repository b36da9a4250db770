"""Device CPU profiles and the aarch64 tools (docs/devices.md#arm): ``make tools ARCH=aarch64 PROFILE=<name>``.

A ggml CPU build decides its kernels at compile time: ``ggml_cpu_has_dotprod()`` and ``ggml_cpu_has_matmul_int8()``
are ``#if defined(__ARM_FEATURE_...)`` (ggml/src/ggml-cpu/ggml-cpu.c:3811-3833 of the pinned tree), and with
``GGML_NATIVE=OFF`` the only ``-march`` is ``GGML_CPU_ARM_ARCH`` (ggml/src/ggml-cpu/CMakeLists.txt:210-211). Without
it a build is baseline armv8-a: no dotprod, no fp16 arithmetic, none of the repack kernels ARM devices depend on. A
feature the core lacks (i8mm on a Pi 5 or an Orin) is the other way to fail: SIGILL at the first matmul. So an aarch64
build names its profile, and a baseline build is refused unless named.

On this x86 box the device tools (:data:`DEVICE_TOOLS`) are cross-compiled with Debian's ``aarch64-linux-gnu-g++``
and run under ``qemu-aarch64-static`` with ``-cpu`` set to the profile's core (never ``max``, which accepts
instructions the real core lacks and would hide a wrong profile), called directly (no binfmt). On an aarch64 box the
native build of every tool gets the profile's flags. Standard library only, like pipeline/tools.py.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass

from pipeline.errors import PipelineError

ARCHES = ("aarch64",)
DEVICE_TOOLS = ("llama-perplexity", "llama-bench", "llama-server")  # what a device runs: device-check, deploy lines
CROSS = "aarch64-linux-gnu-"
QEMU = "qemu-aarch64-static"
QEMU_LD_PREFIX = "/usr/aarch64-linux-gnu"  # Debian's aarch64 libc and libstdc++ (libc6-arm64-cross)
DEBIAN_PACKAGES = "g++-aarch64-linux-gnu binutils-aarch64-linux-gnu qemu-user-static"
PROFILE_ENV = "GGUFPIPE_CPU_PROFILE"  # the profile of the native tools on an aarch64 build box


@dataclass(frozen=True)
class CpuProfile:
    name: str
    march: str  # GGML_CPU_ARM_ARCH
    devices: str
    features: tuple[str, ...]  # what the tools' system_info must print as "= 1" (ggml/src/ggml-cpu/ggml-cpu.cpp:585-605)
    fit_arch: str  # the memory model's CPU profile (pipeline/memory_profiles.py ARCH_FEATURES)
    qemu_cpu: str | None  # the core qemu emulates for it; None: qemu 7.2 has none with its features
    qemu_note: str = ""
    baseline: bool = False


_BASE = ("NEON", "ARM_FMA")
PROFILES = {p.name: p for p in (
    CpuProfile("cortex-a76", "armv8.2-a+dotprod+fp16", "Raspberry Pi 5 (BCM2712), RK3588's big cores",
               (*_BASE, "FP16_VA", "DOTPROD"), "arm64-dotprod", "cortex-a76"),
    CpuProfile("cortex-a78ae", "armv8.2-a+dotprod+fp16", "Jetson Orin (Nano, NX, AGX): its CPU",
               (*_BASE, "FP16_VA", "DOTPROD"), "arm64-dotprod", "cortex-a76",
               "qemu 7.2 has no A78AE; the A76 has the features ggml compiles for here (v8.2, dotprod, fp16, no i8mm)"),
    # /proc/cpuinfo of a Xavier AGX lists fphp asimdhp but no asimddp (hrw/arm-socs-table#63)
    CpuProfile("carmel", "armv8.2-a+fp16", "Jetson Xavier (NX, AGX): its CPU, which has no dotprod",
               (*_BASE, "FP16_VA"), "generic", None, "qemu 7.2 has no core with fp16 and without dotprod"),
    CpuProfile("cortex-a710", "armv8.2-a+dotprod+fp16+i8mm",
               "phones on Cortex-A710/X2 and later (Snapdragon 8 Gen 1, Dimensity 9000), Neoverse N2/V1/V2 servers",
               (*_BASE, "FP16_VA", "MATMUL_INT8", "DOTPROD"), "arm64", None,
               "qemu 7.2 has no i8mm core but `max`, which accepts what any core lacks"),
    CpuProfile("armv8-a", "armv8-a", "baseline: any 64-bit ARM, without dotprod, fp16 or repack kernels",
               _BASE, "generic", "cortex-a53", baseline=True),
)}
BASELINE_WHY = ("a baseline armv8-a build has no dotprod or fp16 arithmetic: ggml compiles those kernels, and the "
                "repack the memory model counts on, out (ggml/src/ggml-cpu/CMakeLists.txt:210-211)")


# CUDA profiles: a Jetson's CPU profile and its GPU. Built on the Jetson itself, with JetPack's CUDA: the pinned
# ggml-cuda treats every GPU as discrete (ggml/src/ggml-cuda/ggml-cuda.cu:308), so weights are copied to the GPU
# while their mapped pages stay, and `--no-mmap` matters (docs/devices.md#jetson).
@dataclass(frozen=True)
class CudaProfile:
    name: str
    cpu: str
    cuda_arch: str
    jetpack: str
    cuda: str
    devices: str


JETSON = {p.name: p for p in (
    CudaProfile("orin", "cortex-a78ae", "87", "6", "12.2-12.6", "Jetson AGX Orin, Orin NX, Orin Nano"),
    CudaProfile("xavier", "carmel", "72", "5", "11.4", "Jetson AGX Xavier, Xavier NX"),
)}


def names() -> str:
    return ", ".join([*PROFILES, *JETSON])


def profile(name: str | None, arch: str = "aarch64") -> CpuProfile:
    """The CPU profile ``name`` (a Jetson name stands for its CPU). No name: one line, an aarch64 build without a
    profile being baseline."""
    if arch not in ARCHES:
        raise PipelineError(f"ARCH={arch}: not one of {', '.join(ARCHES)} (x86_64 is the build box's own `make tools`)")
    if not name:
        raise PipelineError(f"ARCH={arch} needs PROFILE=<one of {names()}>: without one, {BASELINE_WHY}; "
                            "PROFILE=armv8-a builds that baseline anyway")
    if name in JETSON:
        return PROFILES[JETSON[name].cpu]
    if name not in PROFILES:
        raise PipelineError(f"PROFILE={name}: not a device profile (one of {names()}; docs/devices.md#arm)")
    return PROFILES[name]


def host_is_arm() -> bool:
    return platform.machine().lower() in ("aarch64", "arm64")


def profile_flags(p: CpuProfile) -> tuple[str, ...]:
    return (f"-DGGML_CPU_ARM_ARCH={p.march}",)


def cross_flags(p: CpuProfile) -> tuple[str, ...]:
    """The cmake flags of a cross build from x86 (Debian's cross compilers; CMAKE_SYSTEM_NAME makes it a cross
    build, so nothing of the build box is probed) and the profile's ``-march``."""
    return ("-DCMAKE_SYSTEM_NAME=Linux", "-DCMAKE_SYSTEM_PROCESSOR=aarch64", f"-DCMAKE_C_COMPILER={CROSS}gcc",
            f"-DCMAKE_CXX_COMPILER={CROSS}g++", *profile_flags(p))


def host_flags() -> tuple[str, ...]:
    """The flags the build box's own tools add: none on x86; on an aarch64 box the profile's (``PROFILE`` through
    :data:`PROFILE_ENV`), refused without one."""
    if not host_is_arm():
        return ()
    return profile_flags(profile(os.environ.get(PROFILE_ENV)))


def compiler_id() -> str:
    """The cross compiler's first ``--version`` line (part of the cache key: it shapes the binaries)."""
    exe = shutil.which(f"{CROSS}g++")
    if exe is None:
        raise PipelineError(f"{CROSS}g++ is not installed: `apt-get install {DEBIAN_PACKAGES}` (Debian) to "
                            "cross-build the aarch64 tools")
    return subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout.splitlines()[0]


# --------------------------------------------------------------------------- emulation


def qemu_prefix(p: CpuProfile | None) -> tuple[str, ...]:
    """The command prefix that runs an aarch64 tool here as the profile's core (``-L``: QEMU_LD_PREFIX); ``None``:
    qemu's ``max``, only to read a build's ``--version`` (no kernel runs)."""
    if p is not None and p.qemu_cpu is None:
        raise PipelineError(f"profile {p.name}: no emulated check ({p.qemu_note}); run device-check on the device")
    exe = shutil.which(QEMU)
    if exe is None:
        raise PipelineError(f"{QEMU} is not installed: `apt-get install {DEBIAN_PACKAGES}` (Debian)")
    return (exe, "-L", QEMU_LD_PREFIX, "-cpu", p.qemu_cpu if p else "max")


_SYSINFO = re.compile(r"system_info:.*")
SIGILL = (-4, 132)  # the exit status of a process killed by SIGILL: as a signal, or as a shell's 128 + 4


def check_features(p: CpuProfile, output: str, returncode: int | None, what: str) -> dict:
    """What the tools' own output says of their build against the profile: SIGILL (an instruction the core lacks) and
    a missing ``system_info`` feature each fail in one line naming the profile and the feature. Returns the
    features printed (``{"DOTPROD": "1", "REPACK": "1", ...}``)."""
    if returncode in SIGILL:
        extra = [f for f in ("MATMUL_INT8", "SVE", "DOTPROD", "FP16_VA") if f in _features(output)]
        lacks = (f": the core lacks one of {', '.join(extra)}" if extra else "")
        raise PipelineError(f"{what} died with SIGILL on profile {p.name} (core {p.qemu_cpu or 'this device'}): the "
                            f"tools use an instruction the core lacks{lacks}; rebuild with its profile "
                            "(`make tools ARCH=aarch64 PROFILE=...`)")
    got = _features(output)
    if not got:
        raise PipelineError(f"{what}: the tools printed no system_info line: cannot tell their CPU features")
    missing = [f for f in p.features if got.get(f) != "1"]
    if missing:
        raise PipelineError(f"{what}: the tools lack {', '.join(missing)} of profile {p.name} (system_info: "
                            f"{' '.join(f'{k}={v}' for k, v in got.items())}): rebuild with "
                            f"`make tools ARCH=aarch64 PROFILE={p.name}`")
    return got


def _features(output: str) -> dict[str, str]:
    m = _SYSINFO.search(output)
    if not m:
        return {}
    cpu = m.group(0).split("CPU :", 1)[-1]
    return {k: v for k, v in re.findall(r"([A-Z][A-Z0-9_]*) = (\S+)", cpu) if v != "|"}


def count_sdot(exe) -> int:
    """The dot-product instructions in a binary (``aarch64-linux-gnu-objdump -d``): 0 means dotprod was compiled out."""
    objdump = shutil.which(f"{CROSS}objdump")
    if objdump is None:
        raise PipelineError(f"{CROSS}objdump is not installed: `apt-get install {DEBIAN_PACKAGES}`")
    proc = subprocess.Popen([objdump, "-d", "--no-show-raw-insn", str(exe)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    n = sum(1 for line in proc.stdout if re.search(r"\s[su]dot\s", line))
    proc.wait()
    return n
