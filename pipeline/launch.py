"""A ``llama-server`` launch line per target device (recipe ``devices:``; docs/devices.md#launch-lines).

For each device: the largest published quant that fits it (the fit table's ``best``), served with

* ``-c``: the largest power of two whose predicted server memory fits the device, counting ``-np`` slots and, when the
  build measured the draft to help, the draft's weights and its own KV cache (``-ctkd/-ctvd``); capped at the trained
  context per slot (``-c`` is shared: each slot gets ``c / np`` cells, src/llama-context.cpp:290-305 of b11312);
* ``-np`` and ``-t``: the device's ``parallel`` and ``threads``;
* ``-ctk/-ctv`` (and ``-ctkd/-ctvd``) when the device's KV type is not f16;
* ``--cache-ram``: the memory left over, in MiB. The server keeps the prompt caches of finished requests in host
  memory up to this many MiB, 8192 by default (common/common.h:634), more than a small device has.

The memory is the one model of the project (pipeline/memory.py: :func:`components`) with one row of logits per
slot (``output_reserve(n_seq_max)``, src/llama-context.cpp:377); a separate draft adds its own
:func:`components` in the same process (its process base counted once). The MTP heads of ``draft: {mtp: true}`` run
on the main model's weights in a small context of their own that the model does not count (said in ``note``).
A Jetson profile (``arch: jetson-orin``, ``jetson-xavier``) offloads every layer (``-ngl``, and ``-ngld`` for a draft)
with ``--no-mmap``: the pinned ggml-cuda treats the GPU as discrete (ggml/src/ggml-cuda/ggml-cuda.cu:308), so mapped
pages would stay beside the copies in the same memory; ``gpu`` then says so, and that its memory is derived, not
measured. ``gpu`` is null for every CPU profile.
"""

from __future__ import annotations

from pathlib import Path

from pipeline.memory import FIT, ModelShape, components
from pipeline.memory_profiles import JETSON_ARCHES

CTX_MIN = 256  # the KV cache's cell padding (src/llama-context.cpp:290): a slot of fewer cells is no smaller
MIB = 1 << 20
CACHE_RAM_MAX_MIB = 8192  # llama-server's default --cache-ram (common/common.h:634)


def draft_memory(draft: ModelShape, ctx: int, kv_type: str, arch: str, threads: int, parallel: int) -> int:
    """What a draft adds to the server that loads it (bytes): its :func:`components` at the same ``-c``, slots and KV
    type (``-ctkd/-ctvd``), less the process base the main model's total already counts."""
    return components(draft, ctx, kv_type, arch, threads, n_outputs=parallel, n_seq=parallel)["total"] - int(FIT["process_base"])


def server_memory(main: ModelShape, ctx: int, device, draft: ModelShape | None = None) -> dict:
    """Predicted peak memory (bytes) of ``llama-server`` on ``device`` at ``-c ctx``: ``main`` (the main model's
    :func:`components` total), ``draft`` (0 without one: :func:`draft_memory`) and ``total``."""
    kv, arch, threads, slots = device.kv_type, device.arch, device.threads, device.parallel
    out = {"main": components(main, ctx, kv, arch, threads, n_outputs=slots, n_seq=slots)["total"],
           "draft": draft_memory(draft, ctx, kv, arch, threads, slots) if draft is not None else 0}
    out["total"] = out["main"] + out["draft"]
    return out


def largest_ctx(main: ModelShape, device, draft: ModelShape | None = None) -> tuple[int, dict] | None:
    """(``-c``, :func:`server_memory`) at the largest power of two that fits ``device``, at most the trained
    context per slot (the device's ``ctx`` when the file does not say), at least :data:`CTX_MIN` per slot; None when
    even that does not fit."""
    c = ctx_cap(main, device)
    while c >= CTX_MIN * device.parallel:
        mem = server_memory(main, c, device, draft)
        if mem["total"] <= device.memory_bytes:
            return c, mem
        c //= 2
    return None


def ctx_cap(main: ModelShape, device) -> int:
    """The largest ``-c`` worth having: a power of two, at most the trained context per slot."""
    per_slot = max(main.n_ctx_train or device.ctx, CTX_MIN)
    return 1 << ((per_slot * device.parallel).bit_length() - 1)


def kv_flags(kv_type: str, draft: bool) -> list[str]:
    """``-ctk/-ctv`` (and the draft's ``-ctkd/-ctvd``) for a KV type other than llama.cpp's default f16."""
    if kv_type == "f16":
        return []
    return ["-ctk", kv_type, "-ctv", kv_type, *(["-ctkd", kv_type, "-ctvd", kv_type] if draft else [])]


def gpu(arch: str) -> dict | None:
    """A Jetson profile's GPU as a launch entry states it; None on a CPU profile."""
    if arch not in JETSON_ARCHES:
        return None
    return {"cuda_arch": JETSON_ARCHES[arch], "layers": "all", "mmap": False,
            "memory": "derived: ggml-cuda treats the GPU as discrete (copies beside mapped pages); not measured"}


def gpu_flags(arch: str, draft: bool) -> list[str]:
    """``-ngl 999`` (every layer; ``-ngld`` for a separate draft) and ``--no-mmap`` on a Jetson profile."""
    if arch not in JETSON_ARCHES:
        return []
    return ["-ngl", "999", *(["-ngld", "999"] if draft else []), "--no-mmap"]


def launch(device, candidates: list[tuple[str, Path]], drafts: dict[str, dict], shape=ModelShape.from_gguf) -> dict:
    """A device's launch entry. ``candidates``: (file name, path) of the published quants that fit the device at its
    context, largest first; ``drafts``: per main file name, the measured draft that helps (``file``, ``path`` (None:
    MTP heads inside the main file), ``spec``: the speculative arguments after ``-m``, ``label``, ``speedup``).
    Without a candidate, no line: ``why`` says so."""
    head = {"device": device.name, "parallel": device.parallel, "threads": device.threads, "kv_type": device.kv_type,
            "gpu": gpu(device.arch)}
    if not candidates:
        return {**head, "line": None, "why": f"no published quant fits {device.memory} at ctx {device.ctx} "
                                              f"(KV {device.kv_type}, {device.arch}): see the fit table"}
    dropped = None
    for file, path in candidates:
        main = shape(path)
        d = drafts.get(file)
        got = None
        if d is not None:
            dshape = shape(d["path"]) if d["path"] is not None else None
            got = largest_ctx(main, device, dshape)
            want = min(1 << (device.ctx.bit_length() - 1), ctx_cap(main, device))
            if got is None or got[0] < want:  # a draft is not worth the context the device asks for
                dropped = (f"the draft {d['file']} is left out: with it {file} fits "
                           + (f"only -c {got[0]}" if got else "no context") + f" (the device asks ctx {device.ctx})")
                d, got = None, None
        got = got or largest_ctx(main, device)
        if got is None:
            continue
        c, mem = got
        spec = d["spec"] if d else []
        line = ["llama-server", "-m", file, *spec, "-c", str(c), "-np", str(device.parallel), "-t",
                str(device.threads), *kv_flags(device.kv_type, bool(d and d["path"] is not None)),
                *gpu_flags(device.arch, bool(d and d["path"] is not None))]
        margin = device.memory_bytes - mem["total"]
        cache_ram = min(max(margin // MIB, 0), CACHE_RAM_MAX_MIB)
        line += ["--cache-ram", str(cache_ram)]
        note = []
        if d and d["path"] is None:
            note.append("the MTP heads' own context is not counted")
        if dropped:
            note.append(dropped)
        return {**head, "file": file, "ctx": c, "ctx_per_slot": c // device.parallel, "memory": mem,
                "margin_bytes": margin, "cache_ram_mib": cache_ram,
                "draft": None if d is None else {"label": d["label"], "speedup": d["speedup"]},
                "line": " ".join(line), **({"note": "; ".join(note)} if note else {})}
    return {**head, "line": None, "why": f"no published quant leaves room for llama-server's {CTX_MIN} cells per slot "
                                          f"x {device.parallel} slot(s) on {device.memory}"}
