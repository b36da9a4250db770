"""``ggufpipe device-check FILE``: does a pulled file compute on this device what it computed on the build box?

1. ``ggufpipe verify`` (size, SHA256, header) of the file, then the slice ``device-slice.logits`` beside it against the
   manifest's ``device_check`` (size and SHA256: a tampered or half-pulled slice fails here, naming the field).
2. Where llama.cpp tools are on the device (``LLAMA_CPP_DIR``, else ``llama-perplexity`` on ``PATH``, else the
   pinned build of a build box), ``llama-perplexity --kl-divergence`` of the file against the slice (the slice carries
   its tokens: no text, no tokenizer needed) and a short ``llama-bench``. Without tools the file is verified only and
   the result says so.
3. The verdict (:func:`judge`): |Δ mean KLD| ≤ max(0.002, 10 % of the build box's) and same top p within the larger
   of 1 point and 3 standard deviations of near-tied tokens flipping at 8 % (3.76 points on 510 tokens; the
   manifest's ``device_check.tolerance``; the spread measured across CPU builds is in docs/device-check.md).

The result (``--out``) is a JSON file that ``ggufpipe collect`` (pipeline/devices/collect.py) adds to
``artifacts/<name>/devices.json``, an input of the publish stage. Standard library plus the pipeline's own modules:
it runs on a device install (``pip install '.[device]'``).
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import time
from pathlib import Path

from pipeline import tools_backend as tb
from pipeline import tools_cross
from pipeline.devices.check_draft import draft_speedup, prepare
from pipeline.distribution.verify import check_slice_file, find_entry, locate, verify_located
from pipeline.errors import PipelineError
from pipeline.fsutil import write_json_atomic
from pipeline.stages.bench import measure as llama_bench
from pipeline.stages.device_verdict import (
    LABEL_RE,
    POWER_MODE_RE,
    RESULT_KIND,
    RESULT_VERSION,
    TIME_FORMAT,
    entry_sha256,
    judge,
)
from pipeline.stages.evaluate import (
    _CHUNKS_RE,
    _fail_on_tool_errors,
    has_kld_statistics,
    parse_kld_statistics,
    run_perplexity,
)
from pipeline.stages.publish_devices import SLICE_METRICS
from pipeline.tools import Toolchain, bin_dir_of, find_toolchain, read_build_version
from pipeline.tools_install import cross_dir

BENCH = {"prompt": 64, "gen": 16, "repetitions": 1}  # a short llama-bench: a speed figure, never a verdict


def check_slice(mpath: Path, data: dict, entry: dict) -> Path:
    """The slice beside the manifest, checked against ``device_check`` (size, SHA256); its path."""
    dc = data.get("device_check")
    if not dc:
        raise PipelineError(f"{mpath}: no device_check section: this build published no device slice (recipe "
                            "`device_slice: 0`, or a manifest older than schema 7's device check)")
    if not entry.get("slice"):
        raise PipelineError(f"{mpath}: {entry['file']} has no slice values (only the base and the quants are measured)")
    path = mpath.parent / dc["file"]
    check_slice_file(path, dc)
    return path


def find_device_tools(llama_cpp_dir: str | None = None):
    """The llama.cpp tools of this device: ``LLAMA_CPP_DIR`` (or ``llama_cpp_dir``: a build folder or a folder of
    binaries), else ``llama-perplexity`` on ``PATH``, else the pinned build (a build box); None when there are none.
    Only llama-perplexity and llama-bench are needed: no converter, no gguf-py."""
    root = llama_cpp_dir or os.environ.get("LLAMA_CPP_DIR")
    if root:
        r = Path(root).expanduser()
        bin_dir = bin_dir_of(r, "llama-perplexity")
        if bin_dir is None:
            raise PipelineError(f"LLAMA_CPP_DIR={r} has no llama-perplexity (looked in build/bin, bin and the folder)")
    elif shutil.which("llama-perplexity"):
        bin_dir = Path(shutil.which("llama-perplexity")).resolve().parent
    else:
        try:
            return find_toolchain()
        except PipelineError:
            return None
    build, commit = read_build_version(bin_dir / "llama-perplexity")
    backend = tb.selected_backend()  # a device's GPU build: GGUFPIPE_BACKEND=cuda offloads (-ngl), as on a build box
    return Toolchain(root=bin_dir, bin_dir=bin_dir, convert_script=bin_dir, gguf_py=bin_dir, build_number=build,
                     commit=commit, origin="device", backend=backend, ngl=tb.selected_ngl(backend))


def emulated_tools(name: str) -> tuple[Toolchain, tools_cross.CpuProfile]:
    """The cross-built tools of profile ``name`` (``make tools ARCH=aarch64 PROFILE=name``) run under qemu as the
    profile's core (pipeline/tools_cross.py), and the profile."""
    prof = tools_cross.profile(name)
    runner = tools_cross.qemu_prefix(prof)  # a profile with no emulated core: refused here, saying why
    root = cross_dir(prof)
    if not (root / "toolchain.json").is_file():
        raise PipelineError(f"--emulate {name}: the aarch64 tools of profile {prof.name} are not built: run "
                            f"`make tools ARCH=aarch64 PROFILE={prof.name}`")
    build, commit = read_build_version(root / "bin" / "llama-perplexity", runner)
    return Toolchain(root=root, bin_dir=root / "bin", convert_script=root, gguf_py=root, build_number=build,
                     commit=commit, origin="emulated", runner=runner), prof


_BUFFER_RE = re.compile(r"(\S+)\s+(model|KV|compute|output|RS) buffer size =\s*([\d.]+) MiB")


def buffers(output: str) -> dict:
    """The buffers llama.cpp printed (src/llama-model.cpp:1930, src/llama-kv-cache.cpp:291, src/llama-context.cpp:381
    and 740), in MiB by ``"<buffer type> <kind>"``: ``CPU_REPACK model`` is the repack the memory model predicts."""
    out: dict[str, float] = {}
    for name, kind, mib in _BUFFER_RE.findall(output):
        out[f"{name} {kind}"] = round(out.get(f"{name} {kind}", 0.0) + float(mib), 2)
    return out


def device_label(label: str | None) -> str:
    """``--device`` as given when it is a plain label (:data:`LABEL_RE`, else one line); without one, the host name
    made plain (lowercase, other characters as ``-``)."""
    if label is not None:
        if not LABEL_RE.match(label):
            raise PipelineError(f"--device {label!r}: a device label is a-z 0-9 . _ - (starting with a letter or "
                                "digit, at most 32), like a recipe's devices: name")
        return label
    host = re.sub(r"[^a-z0-9._-]+", "-", platform.node().lower()).strip("-._")[:32]
    return host if LABEL_RE.match(host) else "device"


def device_facts(label: str | None, power_mode: str | None = None) -> dict:
    """What the result says of this device: a label (:func:`device_label`), machine, system, CPU, memory and, where
    given, its power mode (a Jetson's ``nvpmodel -q``: every speed depends on it)."""
    if power_mode is not None and not POWER_MODE_RE.match(power_mode):
        raise PipelineError(f"--power-mode {power_mode!r}: a plain name such as MAXN or 15W (letters, digits, "
                            "'_', '.', '-', space; at most 32)")
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "Model", "Hardware")):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        mem = None
    return {"label": device_label(label), "machine": platform.machine(), "system": platform.system(),
            "cpu": cpu, "memory_bytes": mem, "cpu_count": os.cpu_count(),
            **({"power_mode": power_mode} if power_mode else {})}


def measure(tc, model: Path, slice_path: Path, dc: dict, threads: int, prof=None) -> dict:
    """llama-perplexity --kl-divergence of ``model`` on the slice: its statistics, seconds and buffers; with a CPU
    profile ``prof`` (an emulated run) also the features its system_info printed, each checked against the profile."""
    what = f"device-check of {model.name}"
    # -lv 4: llama-perplexity then prints libllama's buffer sizes (trace verbosity in b11312), the repack among them
    args = ["-m", model, "-c", str(dc["ctx"]), "--chunks", str(dc["chunks"]), "-b", str(dc["ctx"]), "-t", str(threads),
            "-lv", "4", "--kl-divergence-base", slice_path, "--kl-divergence"]
    res = run_perplexity(tc, args, None, has_kld_statistics, what)  # check=False: a SIGILL comes back as its status
    features = tools_cross.check_features(prof, res.output, res.returncode, what) if prof else None
    _fail_on_tool_errors(res, what)
    m = _CHUNKS_RE.search(res.output)
    if not m or (int(m.group(1)), int(m.group(2))) != (dc["chunks"], dc["ctx"]):
        raise PipelineError(f"{what}: llama-perplexity did not evaluate {dc['chunks']} chunk(s) at ctx {dc['ctx']}")
    return {**parse_kld_statistics(res.output), "seconds": round(res.seconds, 2), "buffers": buffers(res.output),
            **({"features": features} if features else {})}


def device_check(path: str | Path, manifest: str | Path | None = None, threads: int | None = None, bench: bool = True,
                 label: str | None = None, out: str | Path | None = None, llama_cpp_dir: str | None = None,
                 draft: str | Path | None = None, mtp: bool = False, emulate: str | None = None,
                 power_mode: str | None = None, profile: str | None = None) -> dict:
    """Entry function: verify ``path`` and its slice, re-measure it where llama.cpp is, judge; with ``draft`` (or
    ``mtp``: the heads inside the file) also measure the draft's speed-up (pipeline/devices/check_draft.py); write
    ``out``. ``emulate``: a device CPU profile whose cross-built tools run under qemu here (no speeds: emulated);
    ``profile``: on a device, the profile its tools must have been built for (their system_info is checked)."""
    facts = device_facts(label, power_mode)  # a label that is not plain fails before any work
    if out is not None:  # where the result goes, checked before minutes of measuring are spent
        o = Path(out)
        why = ("an empty path" if not str(out) else "a folder" if o.is_dir() else
               f"no folder {o.parent} to write it in" if not o.parent.is_dir() else None)
        if why:
            raise PipelineError(f"--out {str(out)!r}: {why}: give a file path in an existing folder (nothing was "
                                "measured)")
    if emulate and (draft is not None or mtp):
        raise PipelineError("--emulate with --draft/--mtp: a speed-up under emulation means nothing")
    if emulate and profile:
        raise PipelineError("--emulate and --profile: --emulate names the profile")
    tc, prof = emulated_tools(emulate) if emulate else (None, tools_cross.profile(profile) if profile else None)
    path, mpath, data = locate(path, manifest)  # a shard stands for its split file, as in `ggufpipe verify`
    verified = verify_located(path, data)
    entry = find_entry(data, path.name)
    model = path / entry["split"]["shards"][0]["file"] if entry.get("split") else path  # what llama.cpp loads
    slice_path = check_slice(mpath, data, entry)
    dc = data["device_check"]
    if draft is not None and mtp:
        raise PipelineError("--draft and --mtp: give one (--mtp: the MTP heads inside the file draft for it)")
    spec = prepare(mpath, data, entry, draft) if draft is not None or mtp else None  # before any measurement
    result = {"kind": RESULT_KIND, "version": RESULT_VERSION, "name": data["name"], "build_id": data["build_id"],
              "file": entry["file"], "sha256": entry_sha256(entry), "quant_type": entry["quant_type"],
              "device": facts, "verified": verified,
              "timestamp": time.strftime(TIME_FORMAT, time.gmtime())}
    tc = tc or find_device_tools(llama_cpp_dir)
    if tc is None and spec is not None:
        raise PipelineError("--draft/--mtp measure with llama-server: this device has no llama.cpp tools (set "
                            "LLAMA_CPP_DIR to a build with llama-server)")
    if tc is None:
        result.update(checked=False, passed=True, tools=None, slice=None, bench=None,
                      note="no llama.cpp tools (LLAMA_CPP_DIR, PATH): verified only, numerics not checked")
    else:
        threads = threads or min(4, os.cpu_count() or 1)
        measured = measure(tc, model, slice_path, dc, threads, prof)
        expected = entry["slice"]
        verdict = judge(expected, measured, dc["tolerance"], dc["scored_tokens"])
        result.update(checked=True, passed=verdict["passed"], threads=threads,
                      tools=tc.describe(), buffers_mib=measured["buffers"],
                      slice={"expected": expected, "measured": {k: measured[k] for k in SLICE_METRICS},
                             "seconds": None if emulate else measured["seconds"], **verdict})
        result["bench"] = llama_bench(tc, model, threads, **BENCH) if bench and not emulate else None
        if emulate:
            result["emulated"] = {"profile": prof.name, "march": prof.march, "qemu_cpu": prof.qemu_cpu,
                                  "features": measured["features"], "note": "qemu-user: no speeds recorded"}
        elif prof:
            result["profile"] = {"name": prof.name, "features": measured["features"]}
        if spec is not None:
            result["speedup"] = draft_speedup(tc, model, spec, slice_path, threads, facts["label"])
    if out is not None:
        write_json_atomic(out, result)
    return result


def summary(result: dict) -> str:
    """The one line the command prints."""
    if not result["checked"]:
        return f"VERIFIED  {result['file']}: {result['note']}"
    s = result["slice"]
    if s.get("problems"):  # judge() failed closed: a number it needs is missing or not finite
        return (f"FAIL  {result['file']} on {result['device']['label']}: cannot judge the slice: "
                + "; ".join(s["problems"]))
    m, d, lim = s["measured"], s["delta"], s["limit"]
    bench = result.get("bench") or {}
    speed = f"; tg {bench['tg_tokens_per_s']:.1f} t/s, pp {bench['pp_tokens_per_s']:.1f} t/s" if bench else ""
    sp = result.get("speedup")
    speed += f"; draft {sp['pair'].split(' + ')[1]}: {sp['verdict']}" if sp else ""
    return (f"{'PASS' if result['passed'] else 'FAIL'}  {result['file']} on {result['device']['label']} "
            f"(llama.cpp b{result['tools']['llama_cpp_build']}, {result['threads']} threads): mean KLD "
            f"{m['kld_mean']:.6f} (build box {s['expected']['kld_mean']:.6f}, Δ {d['kld_mean']:+.6f}, limit "
            f"±{lim['kld_mean']:.6f}), same top p {100 * m['same_top_p']:.3f} % (Δ {d['same_top_p_points']:+.3f} "
            f"points, limit ±{lim['same_top_p_points']:g}){speed}")
