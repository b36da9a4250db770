"""Target devices of a recipe (``devices:``): what the publish stage predicts each published model file's memory on
(pipeline/memory.py) and reports as "fits on"; docs/devices.md#devices-in-a-recipe.
(see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.errors import PipelineError
from pipeline.memory_profiles import ARCH_FEATURES, KV_TYPES, parse_size
from pipeline.recipe import schema as _schema

DEVICE_KEYS = _schema.keys("devices[]")
DEVICE_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,31}$")


@dataclass(frozen=True)
class Device:
    """``devices[]``: a device's memory for the model (``memory``: as written, ``memory_bytes``: parsed like
    ``ggufpipe fit --mem``, binary units), the context and KV cache type it runs at, its CPU profile (``arch``: which
    tensor types ggml-cpu repacks) and whether a published quant must fit it (``require``)."""

    name: str
    memory: str
    memory_bytes: int
    ctx: int = 4096
    kv_type: str = "f16"
    arch: str = "x86_64"
    require: bool = False
    threads: int = 4
    parallel: int = 1
    kv_auto: str | None = None  # kv_type was auto: why the publish stage chose it (publish_sections.kv_choice)

    def describe(self) -> dict:
        return {"memory_bytes": self.memory_bytes, "ctx": self.ctx, "kv_type": self.kv_type, "arch": self.arch,
                "require": self.require, "threads": self.threads, "parallel": self.parallel,
                **({"kv_auto": self.kv_auto} if self.kv_auto else {})}


def parse_devices(ctx, value) -> tuple[Device, ...]:
    """``devices:``: a list of devices with unique names (``ctx``: the parser's ``_Ctx``, one-line errors)."""
    if value is None:
        return ()
    if not isinstance(value, list):
        ctx.fail("devices", "must be a list of devices ({name, memory, ctx, kv_type, arch, require})")
    out: list[Device] = []
    for i, item in enumerate(value):
        where = f"devices[{i}]"
        d = ctx.mapping(item, where, DEVICE_KEYS)
        for req in ("name", "memory"):
            if req not in d:
                ctx.fail(f"{where}.{req}", "missing")
        name = ctx.string(d["name"], f"{where}.name", DEVICE_NAME_RE,
                          "a device name (lowercase slug: a-z 0-9 . _ -, at most 32 characters)")
        seen = next((j for j, dev in enumerate(out) if dev.name == name), None)
        if seen is not None:
            ctx.fail(f"{where}.name", f"device {name!r} repeats devices[{seen}]")
        mem = d["memory"]
        text = str(mem) if isinstance(mem, (str, int)) and not isinstance(mem, bool) else None
        try:
            size = parse_size(text) if text is not None else 0
        except PipelineError:
            size = 0
        if size <= 0:
            ctx.fail(f"{where}.memory", f"{mem!r} is not a memory size such as 8G, 6144M or 1.5GiB (binary units, "
                                        "as `ggufpipe fit --mem`: G = 2^30 bytes; a bare number is bytes)")
        ctx.number(size, f"{where}.memory", "devices[]")
        n_ctx = ctx.number(d.get("ctx", 4096), f"{where}.ctx", "devices[]")
        kv = d.get("kv_type", "f16")
        if not isinstance(kv, str) or (kv.lower() not in KV_TYPES and kv.lower() != "auto"):
            ctx.fail(f"{where}.kv_type", f"{kv!r} is not a KV cache type llama.cpp takes (one of {', '.join(KV_TYPES)})"
                                         " or auto (the smallest measured inside the thresholds: gates kv_types)")
        arch = d.get("arch", "x86_64")
        if not isinstance(arch, str) or arch.lower() not in ARCH_FEATURES:
            ctx.fail(f"{where}.arch", f"{arch!r} is not a CPU profile of the memory model (one of "
                                      f"{', '.join(ARCH_FEATURES)})")
        counts = {key: ctx.number(d.get(key, default), f"{where}.{key}", "devices[]")
                  for key, default in (("threads", 4), ("parallel", 1))}
        out.append(Device(name=name, memory=text, memory_bytes=size, ctx=n_ctx, kv_type=kv.lower(),
                          arch=arch.lower(), require=ctx.boolean(d.get("require", False), f"{where}.require"),
                          **counts))
    return tuple(out)
