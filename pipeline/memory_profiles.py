"""The device profiles the memory model knows (pipeline/memory.py): CPU feature profiles and KV cache types.
Standard library only and apart from the model, so that `ggufpipe fit` can offer them as choices without importing the
GGUF reader at every `ggufpipe` command's start."""

from __future__ import annotations

import re

from pipeline.errors import PipelineError

# CPU feature profiles -> the features ggml_repack_get_optimal_repack_type asks about.
# x86_64: the pinned build (toolchain.json: -DGGML_NATIVE=OFF) compiles AVX, AVX2, FMA, F16C, BMI2 but not
# AVX512 (ggml/CMakeLists.txt:141-166: INS_ENB on, GGML_AVX512 default OFF); its system_info prints
# "AVX2 = 1 ... REPACK = 1" and no AVX512 even on this AVX512 machine, and ggml_cpu_has_avx512() is compile-time.
ARCH_FEATURES: dict[str, frozenset[str]] = {
    "x86_64": frozenset({"avx2"}),
    "x86_64-avx512": frozenset({"avx2", "avx512"}),  # a GGML_NATIVE build on an AVX512 CPU
    "arm64": frozenset({"neon", "dotprod", "i8mm"}),  # ARMv8.6+ (Graviton 3/4, Apple M2+, recent phones)
    "arm64-dotprod": frozenset({"neon", "dotprod"}),  # ARMv8.2/8.4 without int8 matmul (Graviton 2, Pi 5)
    "generic": frozenset(),  # no repack (a build with GGML_CPU_REPACK=OFF)
    # Jetson, every layer on the GPU: nothing stays on the CPU to repack (JETSON_ARCHES)
    "jetson-orin": frozenset(),
    "jetson-xavier": frozenset(),
}
# Jetson profiles -> their CUDA architecture (pipeline/tools_cross.py JETSON). The pinned ggml-cuda treats every GPU
# as discrete (ggml/src/ggml-cuda/ggml-cuda.cu:308): weights are copied into CUDA buffers in the same DRAM while the
# file's mapped pages stay, so a launch line passes --no-mmap and the fit of such a profile is derived, not measured.
JETSON_ARCHES = {"jetson-orin": "87", "jetson-xavier": "72"}

# KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp kv_cache_types)
KV_TYPES = {"f32": "F32", "f16": "F16", "bf16": "BF16", "q8_0": "Q8_0", "q4_0": "Q4_0", "q4_1": "Q4_1",
            "iq4_nl": "IQ4_NL", "q5_0": "Q5_0", "q5_1": "Q5_1"}


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


SIZE_MAX = 2**63 - 1  # pipeline.bounds.SIZE_MAX (not imported: this module is loaded at every command's start)


def parse_size(text: str) -> int:
    """A memory size as ``ggufpipe fit --mem`` and recipe ``devices[].memory`` take it: ``8G``, ``8GiB``, ``512M``,
    ``1.5G``, ``123456`` (bytes) -> bytes; binary units (G = GiB); at least one byte, at most 2^63 - 1."""
    m = _SIZE.match(text) if isinstance(text, str) and len(text) <= 64 else None
    if not m:
        shown = repr(text) if len(repr(text)) <= 60 else repr(text)[:57] + "..."
        raise PipelineError(f"{shown} is not a memory size such as 8G, 512M or 1.5GiB")
    n = int(float(m.group(1)) * _UNITS[m.group(2).upper()]) if len(m.group(1)) <= 30 else SIZE_MAX + 1
    if not 1 <= n <= SIZE_MAX:
        raise PipelineError(f"{text!r} is out of range: a memory size is 1 byte to 8 EiB (2^63 - 1 bytes)")
    return n
