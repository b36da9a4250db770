"""The backend of the pinned llama.cpp tools (docs/gpu.md): ``cpu`` (the default) or ``cuda`` (opt-in).

A CUDA build is never chosen by itself: nvcc is installed on the CPU-only build boxes, so llama.cpp's
auto-detection would compile ggml-cuda there. It takes ``make tools BACKEND=cuda CUDA_ARCHS=90``, an explicit
list of CUDA architectures (never ``native``), and lives in its own cache folder
(``b<build>-<commit>-cuda-<key>``, the key covering the backend and the architectures), beside the CPU folder,
whose name and key stay what they were before backends existed. A build selects its tools with
``GGUFPIPE_BACKEND`` (and ``GGUFPIPE_CUDA_ARCHS`` when several CUDA folders are installed); the tools that
compute on a GPU get ``-ngl`` (``GGUFPIPE_NGL``, default all layers), recorded in the toolchain's description.

Also the environment every tool runs in (:func:`tool_env`). Standard library only, like pipeline/tools.py, which
imports it (this module imports nothing of the tools).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable
from pathlib import Path

from pipeline.errors import PipelineError

BACKENDS = ("cpu", "cuda")
DEFAULT_BACKEND = "cpu"
BACKEND_ENV = "GGUFPIPE_BACKEND"
ARCHS_ENV = "GGUFPIPE_CUDA_ARCHS"
NGL_ENV = "GGUFPIPE_NGL"
DEFAULT_NGL = 999  # more layers than any model has: llama.cpp then offloads all of them (and the output layer)
# The tools that compute on the GPU when offloaded, and get `-ngl N` there (common/arg.cpp:2789 of the pinned tree:
# "-ngl" is a common option, accepted by llama-perplexity, llama-imatrix and llama-speculative-simple; llama-bench
# parses its own, tools/llama-bench/llama-bench.cpp:724). llama-quantize, llama-gguf-split and llama-tokenize
# never compute on a GPU: the files they write are the same on every backend.
NGL_TOOLS = ("llama-perplexity", "llama-imatrix", "llama-bench", "llama-speculative-simple")
# ... and `-ngld N` for the draft model (common/arg.cpp:4222, "--spec-draft-ngl"/"-ngld", LLAMA_EXAMPLE_SPECULATIVE)
DRAFT_NGL_TOOLS = ("llama-speculative-simple",)
CUDA_INSTALL = "make tools BACKEND=cuda CUDA_ARCHS=..."
# One CUDA architecture as CMake takes it (CMAKE_CUDA_ARCHITECTURES): 90, 86-real, 90a, 75-virtual.
_ARCH_RE = re.compile(r"^[0-9]{2,3}[a-z]?(-real|-virtual)?$")


def check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise PipelineError(f"backend {backend!r}: not one of {', '.join(BACKENDS)}")
    return backend


def normalize_archs(backend: str, archs: str | None) -> str | None:
    """The CUDA architectures as one CMake list (``86;90``; commas or spaces accepted): required for cuda, refused
    for cpu; ``native``/``all``/``all-major`` (detection on the build box) are refused."""
    check_backend(backend)
    items = [a for a in re.split(r"[,; ]+", archs or "") if a]
    if backend == "cpu":
        if items:
            raise PipelineError(f"--cuda-archs {archs}: only for --backend cuda (the CPU tools have no CUDA code)")
        return None
    if not items:
        raise PipelineError("the cuda backend needs explicit CUDA architectures: `make tools BACKEND=cuda CUDA_ARCHS=90` "
                            "(90: H100/H200; 89: L4/L40; 86: A10/RTX 30xx; 80: A100), never auto-detection")
    bad = [a for a in items if not _ARCH_RE.match(a)]
    if bad:
        raise PipelineError(f"CUDA architectures {', '.join(bad)}: not a CMAKE_CUDA_ARCHITECTURES number such as 90 or "
                            "86-real (native/all would detect or guess them on the build box)")
    return ";".join(items)


def backend_flags(backend: str, archs: str | None) -> tuple[str, ...]:
    """The cmake flags a backend adds to pipeline.tools.CMAKE_FLAGS. None for cpu: ggml's own default is
    ``option(GGML_CUDA "ggml: use CUDA" OFF)`` (ggml/CMakeLists.txt:199 of the pinned tree), and the CPU cache key
    covers CMAKE_FLAGS as they were, so adding ``-DGGML_CUDA=OFF`` would only rename (and rebuild) the CPU folder.
    For cuda, ``CMAKE_CUDA_ARCHITECTURES`` is always given: unset, ggml/src/ggml-cuda/CMakeLists.txt:21-41 picks
    ``native`` (the build box's GPU) or a default list."""
    archs = normalize_archs(backend, archs)
    if backend == "cpu":
        return ()
    return ("-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}")


def key_spec(spec: dict, backend: str, archs: str | None) -> dict:
    """The cache key's spec for ``backend``: the CPU spec unchanged (its folder keeps its name), the backend, the
    architectures and its flags added for any other."""
    flags = backend_flags(backend, archs)
    if backend == "cpu":
        return spec
    return {**spec, "backend": backend, "cuda_archs": normalize_archs(backend, archs),
            "cmake_flags": [*spec["cmake_flags"], *flags]}


def folder_name(build: int, commit: str, key: str, backend: str) -> str:
    return f"b{build}-{commit}-{key}" if backend == "cpu" else f"b{build}-{commit}-{backend}-{key}"


def selected_backend() -> str:
    """The backend a build uses: ``GGUFPIPE_BACKEND``, default cpu."""
    value = os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND
    if value not in BACKENDS:
        raise PipelineError(f"{BACKEND_ENV}={value}: not one of {', '.join(BACKENDS)}")
    return value


def selected_ngl(backend: str) -> int:
    """Layers offloaded: 0 on the CPU; ``GGUFPIPE_NGL`` (a whole number), default all, on any other backend."""
    if backend == "cpu":
        return 0
    value = os.environ.get(NGL_ENV) or str(DEFAULT_NGL)
    if not value.isdigit():
        raise PipelineError(f"{NGL_ENV}={value}: not a whole number of layers (999: all)")
    return int(value)


def installed_dir(parent: Path, backend: str, name_for: Callable[[str], str]) -> Path | None:
    """The folder of a non-cpu backend's tools under ``parent``: the one for ``GGUFPIPE_CUDA_ARCHS`` when set; else
    the one installed folder of that backend whose name is the key of the architectures its toolchain.json records
    (``name_for(archs)``; stale folders of older keys are skipped). None when there is none; one line when
    several are installed and ``GGUFPIPE_CUDA_ARCHS`` does not say which."""
    archs = os.environ.get(ARCHS_ENV)
    if archs:
        return parent / name_for(normalize_archs(backend, archs) or "")
    found = {}
    for info in sorted(parent.glob(f"*-{backend}-*/toolchain.json")):
        try:
            rec = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        got = rec.get("cuda_archs")
        if rec.get("backend") == backend and got and info.parent.name == name_for(got):
            found[got] = info.parent
    if len(found) > 1:
        raise PipelineError(f"{len(found)} {backend} builds of the tools are installed (CUDA architectures "
                            f"{', '.join(sorted(found))}): set {ARCHS_ENV} to the one to use")
    return next(iter(found.values()), None)


def device_description(backend: str) -> str:
    """What the tools computed on, for a manifest's volatile ``build`` section (never a compared one: the same
    backend on another GPU or CPU model rebuilds the same bytes): ``cpu``, or the GPU names ``nvidia-smi`` lists
    (``cuda: NVIDIA H200``; ``cuda: unknown`` when it cannot say)."""
    if backend == "cpu":
        return "cpu"

    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=30)
        names = [n.strip() for n in out.stdout.splitlines() if n.strip()] if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        names = []
    return f"{backend}: {', '.join(names) or 'unknown'}"


def not_installed(backend: str, build: int, root: Path, cpu_hint: str) -> str:
    if backend == "cpu":
        return f"llama.cpp tools (build b{build}) are not installed in {root}: {cpu_hint}"
    return (f"llama.cpp tools for the {backend} backend (build b{build}) are not installed in {root}: run "
            f"`{CUDA_INSTALL}`, or unset {BACKEND_ENV} for the CPU tools")


# --------------------------------------------------------------------------- how a tool runs here


def clean_env(extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env.setdefault("LC_ALL", "C")
    if extra:
        env.update(extra)
    return env


# Tools run with OpenMP's passive waiting (unless OMP_WAIT_POLICY is set). Snakemake runs several jobs at
# once, each with its own threads; with OpenMP's default (spinning) idle threads they fight for the cores:
# llama-speculative-simple took 93.9 s for a 32-token prompt with active waiting and 13.6 s with passive
# waiting beside two other jobs on 2 cores. Spinning threads also starved llama-perplexity's logger thread
# (which b11312 does not join at exit): the last lines, with the final estimate or the statistics, were
# lost in 18 of 53 runs of a tiny model on 2 loaded cores (1 of 30 with passive waiting;
# pipeline/stages/evaluate.py re-runs those). The results are bit-identical either way. llama-bench keeps the
# default: it measures speed.
ACTIVE_WAIT_TOOLS = ("llama-bench",)


def tool_env(name: str) -> dict:
    """The environment of a llama.cpp tool or helper ``name``: clean, with passive OpenMP waiting (above)."""
    return clean_env(None if name in ACTIVE_WAIT_TOOLS else {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY",
                                                                                              "passive")})


def tool_argv(name: str, args: list[str], backend: str, ngl: int) -> list[str]:
    """A tool's arguments on ``backend``: unchanged on the CPU; with ``-ngl N`` (and ``-ngld N`` for the draft) for
    the tools that offload (:data:`NGL_TOOLS`), unless the caller already gave them."""
    if backend == "cpu":
        return list(args)
    out = list(args)
    if name in NGL_TOOLS and not {"-ngl", "--gpu-layers", "--n-gpu-layers"} & set(out):
        out += ["-ngl", str(ngl)]
    if name in DRAFT_NGL_TOOLS and not {"-ngld", "--spec-draft-ngl", "--gpu-layers-draft"} & set(out):
        out += ["-ngld", str(ngl)]
    return out
