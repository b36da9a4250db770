"""Device-check results as ``ggufpipe collect`` (pipeline/devices/collect.py) stores them in
``artifacts/<name>/devices.json`` and the publish stage shows them (pipeline/stages/publish_devices.py
``device_results``): one set of checks and one judgement for both, so what the report and the card show passed what
collect checks, even in a devices.json edited by hand.

Results keep the evidence (:func:`take`): per device and file one result, a measured one replaced only by a newer
measured one, a verified-only one (``checked: false``, no llama.cpp on the device) never replacing a measured one;
"newer" is the result's own ``timestamp`` (when device-check ran), and a time in the future is refused. The same rule
holds between the results given, and between them and those collected before.

A result is data from elsewhere, so nothing in it is trusted (:func:`checked_fields`): every field kept is checked for
its type and range (a device label by the rule of a recipe ``devices:`` name) and any other field is dropped; every
verdict is judged again (:func:`rejudge`) from the measured numbers against the manifest's own slice values and
tolerance (what the result says it expected is replaced).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from pipeline import bounds
from pipeline.errors import PipelineError
from pipeline.fsutil import read_json
from pipeline.recipe.speedup import ROUNDS_MIN
from pipeline.stages.device_verdict import (
    LABEL_RE,
    POWER_MODE_RE,
    RESULT_KIND,
    RESULT_VERSION,
    TIME_FORMAT,
    entry_sha256,
    judge,
    judge_problems,
)
from pipeline.stages.speedup import summarize, verdict

RESULTS_KIND = f"{RESULT_KIND}-results"  # pipeline/stages/publish_devices.py reads it
# A device's clock may run a little ahead of the build box's (no RTC, no NTP yet): this much is not "the future"
CLOCK_SKEW_S = 300
_TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
_MACHINE_RE = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_PLAIN_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")  # build ids, commits, backends, speculative types
_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,200}$")  # a published file's name, a profile's
_PAIR_RE = re.compile(r"^[A-Za-z0-9._-]{1,200} \+ [A-Za-z0-9._-]{1,200}$")
_CPU_MAX = 200
N_MAX = bounds.integer(1, 64, "a draft length")
NGL = bounds.integer(0, bounds.INT32_MAX, "llama.cpp's n_gpu_layers is an int32")
CPU_COUNT = bounds.integer(1, 1 << 20, "CPUs")


@dataclass(frozen=True)
class Published:
    """What a manifest publishes, as results are checked and judged against it (:func:`published`)."""

    path: Path  # the manifest, for error lines
    name: str
    build_id: str
    entries: dict  # file -> its artifacts entry
    device_check: dict | None
    pairs: frozenset  # "MAIN + DRAFT" of draft.pairs


_value = bounds.shown  # a value as an error line shows it: short, one line


def _plain(value) -> str:
    """A name for an error line: as it is when plain, else as :data:`_value` shows it."""
    return value if isinstance(value, str) and _NAME_RE.match(value) else _value(value)


def _type(value) -> str:
    return type(value).__name__


def published(path: Path, manifest) -> Published:
    """The parts of ``manifest`` (read from ``path``) that results are checked against, each checked for its type."""
    if not isinstance(manifest, dict):
        raise PipelineError(f"{path}: not a manifest: a JSON object expected, got {_type(manifest)}")
    for key in ("name", "build_id"):
        if not isinstance(manifest.get(key), str):
            raise PipelineError(f"{path}: field {key}: must be a string, got {_type(manifest.get(key))}")
    arts = manifest.get("artifacts")
    if not isinstance(arts, list):
        raise PipelineError(f"{path}: field artifacts: must be a list, got {_type(arts)}")
    entries = {}
    for i, e in enumerate(arts):
        if not isinstance(e, dict) or not isinstance(e.get("file"), str):
            raise PipelineError(f"{path}: field artifacts[{i}]: must be a mapping with a file name")
        entries[e["file"]] = {**e, "sha256": entry_sha256(e)}
    dc = manifest.get("device_check")
    if dc is not None and not isinstance(dc, dict):
        raise PipelineError(f"{path}: field device_check: must be a mapping, got {_type(dc)}")
    draft = manifest.get("draft") or {}
    pairs = draft.get("pairs", []) if isinstance(draft, dict) else None
    if not isinstance(pairs, list) or not all(isinstance(p, dict) for p in pairs):
        raise PipelineError(f"{path}: field draft.pairs: must be a list of mappings")
    return Published(path, manifest["name"], manifest["build_id"], entries, dc or None,
                     frozenset(f"{p.get('main')} + {p.get('draft')}" for p in pairs))


def _num(where, rng: bounds.Range, value, field: str):
    return rng.check(value, f"{where}: field {field}")


def _string(where, value, rx: re.Pattern, field: str, what: str) -> str:
    if not isinstance(value, str) or not rx.match(value):
        raise PipelineError(f"{where}: field {field}: {_value(value)} is not {what}")
    return value


def _mapping(where, value, field: str, what: str = "a mapping") -> dict:
    if not isinstance(value, dict):
        raise PipelineError(f"{where}: field {field}: must be {what}, got {_type(value)}")
    return value


def check_timestamp(where, value, now: float | None = None) -> str:
    """``value`` when it is a time as device-check writes it (:data:`TIME_FORMAT`) and not in the future (allowing
    :data:`CLOCK_SKEW_S`); else one line."""
    try:
        t = datetime.strptime(value, TIME_FORMAT) if isinstance(value, str) and _TIME_RE.match(value) else None
    except ValueError:
        t = None
    if t is None:
        raise PipelineError(f"{where}: field timestamp: {_value(value)} is not a UTC time as device-check "
                            "writes it (YYYY-MM-DDTHH:MM:SSZ)")
    now = time.time() if now is None else now
    if t.replace(tzinfo=timezone.utc).timestamp() > now + CLOCK_SKEW_S:
        raise PipelineError(f"{where}: field timestamp: {value} is in the future (here it is "
                            f"{time.strftime(TIME_FORMAT, time.gmtime(now))}; a device's clock may be at most "
                            f"{CLOCK_SKEW_S // 60} minutes ahead): set the device's clock and run device-check again")
    return value


def check_result(path, r, pub: Published) -> dict:
    """A new result (one line naming the file and field when it is not a device-check of a file ``pub`` publishes
    now): its checked fields (:func:`checked_fields`)."""
    clean = checked_fields(path, r, pub)
    if clean["build_id"] != pub.build_id:
        raise PipelineError(f"{path}: build_id {clean['build_id']} is not the published build {pub.build_id}: "
                            "run device-check on the files published now")
    return clean


def check_kind(where, r) -> None:
    """Refuse (one line) what is not a device-check result of this version, or is an emulated one."""
    if not isinstance(r, dict):
        raise PipelineError(f"{where}: not a `ggufpipe device-check --out` result: a JSON object expected, got "
                            f"{_type(r)}")
    if r.get("kind") != RESULT_KIND or r.get("version") != RESULT_VERSION:
        raise PipelineError(f"{where}: kind {_value(r.get('kind'))} version {_value(r.get('version'))}: "
                            f"not a `ggufpipe device-check --out` result (version {RESULT_VERSION})")
    if r.get("emulated"):
        profile = r["emulated"].get("profile") if isinstance(r["emulated"], dict) else None
        raise PipelineError(f"{where}: emulated ({_plain(profile)} under qemu): evidence for the tolerance "
                            "(bench/arm_emulated.py), not a device's result")


def checked_fields(where, r, pub: Published, stored: bool = False) -> dict:
    """The fields of result ``r`` that devices.json keeps, each checked (type, range, the file published with the same
    SHA256; else one line naming ``where`` and the field); every other field is dropped. ``stored``: a result
    collected before, which may be of an earlier build of the same file, and whose draft pair the build may no longer
    declare (its speed-up is then dropped)."""
    check_kind(where, r)
    for key in ("name", "build_id", "file", "sha256", "device", "passed", "checked", "timestamp"):
        if key not in r:
            raise PipelineError(f"{where}: field {key} missing")
    if r["name"] != pub.name:
        raise PipelineError(f"{where}: name {_value(r['name'])}: a result for another recipe than "
                            f"{pub.name!r}")
    _string(where, r["build_id"], _PLAIN_RE, "build_id", "a build id")
    entry = pub.entries.get(r["file"]) if isinstance(r["file"], str) else None
    if entry is None or entry["sha256"] is None or entry["sha256"] != r["sha256"]:
        raise PipelineError(f"{where}: file {_plain(r['file'])} (sha256 {str(r['sha256'])[:16]}…) is not a "
                            "file the manifest publishes")
    for key in ("checked", "passed"):
        if not isinstance(r[key], bool):
            raise PipelineError(f"{where}: field {key}: must be true or false, got {_value(r[key])}")
    out = {"kind": RESULT_KIND, "version": RESULT_VERSION, "name": pub.name, "build_id": r["build_id"],
           "file": r["file"], "sha256": r["sha256"], "timestamp": check_timestamp(where, r["timestamp"]),
           "checked": r["checked"], "passed": r["passed"], "device": _device(where, r["device"])}
    if not r["checked"]:  # verified only: device-check wrote no measurement, and none may come with it
        for key in ("tools", "slice", "bench", "speedup"):
            if r.get(key) is not None:
                raise PipelineError(f"{where}: field {key}: must be null in a verified-only result (checked: false)")
        return out
    if not isinstance(entry.get("slice"), dict):
        raise PipelineError(f"{where}: file {r['file']} has no slice values in {pub.path}: nothing to judge it by")
    sl = _mapping(where, r.get("slice"), "slice")
    measured = _mapping(where, sl.get("measured"), "slice.measured")
    kept = {key: _num(where, rng, measured.get(key), f"slice.measured.{key}")
            for key, rng in (("kld_mean", bounds.KLD_MEAN), ("same_top_p", bounds.FRACTION))}
    if measured.get("ppl_q") is not None:
        kept["ppl_q"] = _num(where, bounds.PPL, measured["ppl_q"], "slice.measured.ppl_q")
    out["slice"] = {"measured": kept}
    if sl.get("seconds") is not None:
        out["slice"]["seconds"] = _num(where, bounds.Range(0, 1e9), sl["seconds"], "slice.seconds")
    out["tools"] = _tools(where, r.get("tools"))
    if r.get("threads") is not None:
        out["threads"] = _num(where, bounds.THREADS, r["threads"], "threads")
    out["bench"] = _bench(where, r.get("bench"))
    sp = _speedup(where, r, pub, stored)
    if sp is not None:
        out["speedup"] = sp
    return out


def _device(where, d) -> dict:
    """The device: its label (the rule of a recipe ``devices:`` name), machine and, where given, power mode, system,
    CPU, memory and CPU count."""
    d = _mapping(where, d, "device", "a mapping (label, machine, ...)")
    out = {"label": _string(where, d.get("label"), LABEL_RE, "device.label", "a plain label (a-z 0-9 . _ -, "
                            "starting with a letter or digit, at most 32: a recipe devices: name's rule)"),
           "machine": _string(where, d.get("machine"), _MACHINE_RE, "device.machine",
                              "a machine name (A-Z a-z 0-9 . _ -, at most 32)")}
    if "power_mode" in d:
        out["power_mode"] = _string(where, d["power_mode"], POWER_MODE_RE, "device.power_mode",
                                    "a plain power mode name (such as MAXN or 15W)")
    if d.get("system") is not None:
        out["system"] = _string(where, d["system"], _MACHINE_RE, "device.system", "a system name (such as Linux)")
    cpu = d.get("cpu")
    if cpu is not None:
        if not isinstance(cpu, str) or len(cpu) > _CPU_MAX or not cpu.isprintable():
            raise PipelineError(f"{where}: field device.cpu: {_value(cpu)} is not a CPU name (printable, at "
                                f"most {_CPU_MAX} characters)")
        out["cpu"] = cpu
    for key, rng in (("memory_bytes", bounds.BYTES), ("cpu_count", CPU_COUNT)):
        if d.get(key) is not None:
            out[key] = _num(where, rng, d[key], f"device.{key}")
    return out


def _tools(where, tools) -> dict:
    tools = _mapping(where, tools, "tools", "a mapping (llama_cpp_build, ...)")
    out = {"llama_cpp_build": _num(where, bounds.LLAMA_BUILD, tools.get("llama_cpp_build"), "tools.llama_cpp_build")}
    for key in ("llama_cpp_commit", "origin", "backend"):
        if tools.get(key) is not None:
            out[key] = _string(where, tools[key], _PLAIN_RE, f"tools.{key}", "a plain name (A-Z a-z 0-9 . _ -)")
    if tools.get("ngl") is not None:
        out["ngl"] = _num(where, NGL, tools["ngl"], "tools.ngl")
    return out


def _bench(where, bench) -> dict | None:
    if bench is None:
        return None
    bench = _mapping(where, bench, "bench", "a mapping or null")
    out = {}
    for key, rng in (("tg_tokens_per_s", bounds.RATE), ("pp_tokens_per_s", bounds.RATE), ("tg_tokens", bounds.COUNT),
                     ("pp_tokens", bounds.COUNT), ("threads", bounds.THREADS)):
        if key in bench:
            out[key] = _num(where, rng, bench[key], f"bench.{key}")
    return out


def _speedup(where, r: dict, pub: Published, stored: bool) -> dict | None:
    """A result's draft speed-up (``device-check --draft``): its pair a pair of the result's file that the manifest
    declares, its per-round rates in range (the median, interval and decision are computed again from them:
    :func:`rejudge_speedup`)."""
    sp = r.get("speedup")
    if sp is None:
        return None
    sp = _mapping(where, sp, "speedup")
    pair = sp.get("pair")
    if not isinstance(pair, str) or not pair.startswith(f"{r['file']} + ") or not _PAIR_RE.match(pair):
        raise PipelineError(f"{where}: field speedup.pair: {_value(pair)} is not a pair of {r['file']} (MAIN + "
                            "DRAFT file names)")
    if pair not in pub.pairs:
        if stored:  # the build no longer declares the draft: the slice's verdict stands without it
            return None
        raise PipelineError(f"{where}: field speedup.pair: {pair!r} is not a pair the manifest declares")
    out = {"pair": pair, "n_max": _num(where, N_MAX, sp.get("n_max"), "speedup.n_max")}
    for key in ("tokens_per_s", "baseline_tokens_per_s"):
        v = sp.get(key)
        if not isinstance(v, list) or len(v) < ROUNDS_MIN:
            raise PipelineError(f"{where}: field speedup.{key}: must be a list of at least {ROUNDS_MIN} rates")
        out[key] = [_num(where, bounds.RATE, x, f"speedup.{key}[{i}]") for i, x in enumerate(v)]
    if len(out["tokens_per_s"]) != len(out["baseline_tokens_per_s"]):
        raise PipelineError(f"{where}: field speedup.baseline_tokens_per_s: one rate per round of "
                            "speedup.tokens_per_s")
    out["acceptance_rate"] = _num(where, bounds.FRACTION, sp.get("acceptance_rate"), "speedup.acceptance_rate")
    for key in ("drafted", "accepted"):
        if sp.get(key) is not None:
            out[key] = _num(where, bounds.COUNT, sp[key], f"speedup.{key}")
    if sp.get("spec_type") is not None:
        out["spec_type"] = _string(where, sp["spec_type"], _PLAIN_RE, "speedup.spec_type", "a speculative type")
    return out


def rejudge_speedup(r: dict) -> tuple[dict, str | None]:
    """The draft speed-up of ``r`` computed again from its per-round rates (median, interval, decision, verdict). It
    fails closed: a rate that is not a finite number > 0 is refused, and a figure that came out not finite never
    helps."""
    sp = r.get("speedup")
    if not sp:
        return r, None
    for key in ("tokens_per_s", "baseline_tokens_per_s"):
        for i, x in enumerate(sp[key]):
            bounds.RATE.check(x, f"field speedup.{key}[{i}]")
    s = summarize(sp["tokens_per_s"], sp["baseline_tokens_per_s"])
    helps, line = verdict(s["speedup"], s["interval"], sp["n_max"], r["device"]["label"])
    helps = helps and all(bounds.finite(x) for x in (s["speedup"], *s["interval"]))
    fixed = {**sp, **s, "helps": helps, "verdict": line}
    note = None if (sp.get("helps"), sp.get("speedup")) == (helps, s["speedup"]) else (
        f"draft speed-up judged again from its rates: {line}")
    return {**r, "speedup": fixed}, note


def rejudge(r: dict, pub: Published) -> tuple[dict, str | None]:
    """``r`` with its verdict judged again (:func:`pipeline.stages.device_verdict.judge`) from its measured numbers against the
    manifest's slice values and tolerance, and its draft speed-up from its rates; and a note when the result had said
    otherwise (else None)."""
    r, sp_note = rejudge_speedup(r)
    fixed, note = _rejudge_slice(r, pub)
    return fixed, "; ".join(n for n in (note, sp_note) if n) or None


def _rejudge_slice(r: dict, pub: Published) -> tuple[dict, str | None]:
    if not r["checked"]:  # verified only: no numbers, nothing to judge
        return {**r, "passed": True}, None if r["passed"] else "a verified-only result cannot fail: stored as verified"
    dc = pub.device_check or {}
    expected = pub.entries[r["file"]]["slice"]
    measured = r["slice"]["measured"]
    tolerance, scored = dc.get("tolerance"), dc.get("scored_tokens")
    problems = judge_problems(expected, measured, tolerance, scored, names=(
        f"artifacts {r['file']} slice", "slice.measured", "device_check.tolerance", "device_check.scored_tokens"))
    if problems:  # judge() would fail closed; the measured numbers were checked, so the manifest is at fault
        raise PipelineError(f"{pub.path}: cannot judge {r['device']['label']}'s result for {r['file']} against it: "
                            + "; ".join(problems))
    v = judge(expected, measured, tolerance, scored)
    fixed = {**r, "passed": v["passed"], "slice": {**r["slice"], "expected": expected, **v}}
    if r["passed"] != v["passed"]:
        return fixed, (f"judged again: {_word(v)}, not the result's {_word(r)} (mean KLD "
                       f"{measured['kld_mean']:.5f}, Δ {v['delta']['kld_mean']:+.5f}, limit "
                       f"±{v['limit']['kld_mean']:.5f})")
    return fixed, None


def judged(where, r, pub: Published, stored: bool = False) -> tuple[dict, str | None]:
    """The one check of a result, new or stored, by collect and by publish: its checked fields
    (:func:`checked_fields`) judged again (:func:`rejudge`)."""
    return rejudge(checked_fields(where, r, pub, stored), pub)


def _word(r: dict) -> str:
    return "pass" if r["passed"] else "FAIL"


def _said(r: dict) -> str:
    return _word(r) + ("" if r["checked"] else " (verified only)")


def take(merged: dict, where, r: dict) -> str:
    """Put the checked, judged result ``r`` (from ``where``) into ``merged`` (device label, file -> (where, result))
    unless the one there is kept: a measured result is replaced only by a newer measured one, a verified-only one by
    a measured one or a newer verified-only one. Two different results of the same time are refused: neither is
    newer. The note to print."""
    key = (r["device"]["label"], r["file"])
    who = f"{key[0]}'s result for {key[1]}"
    if key not in merged:
        merged[key] = (where, r)
        return f"added {who} from {where}: {_said(r)}"
    old_where, old = merged[key]
    if old == r:
        return f"unchanged: {who} from {where} is the one collected ({r['timestamp']})"
    if old["checked"] and not r["checked"]:
        return (f"kept {who} measured {old['timestamp']} ({_said(old)}): {where} is verified only, which never "
                "replaces a measured result")
    if old["checked"] == r["checked"] and r["timestamp"] <= old["timestamp"]:
        if r["timestamp"] == old["timestamp"]:
            raise PipelineError(f"{where}: {who} of {r['timestamp']} differs from the one of the same time in "
                                f"{old_where}: neither is newer; collect one of them")
        return f"kept {who} of {old['timestamp']} ({_said(old)}): {where}'s is older ({r['timestamp']})"
    merged[key] = (where, r)
    return f"replaced {who} of {old['timestamp']} ({_said(old)}) from {where}: {_said(r)} ({r['timestamp']})"


def read_stored(path: Path) -> list[dict]:
    """The results of a devices.json (``ggufpipe collect``'s), each a mapping; [] without the file."""
    if not (path.exists() or path.is_symlink()):
        return []
    data = read_json(path, "collected results")
    if not isinstance(data, dict):
        raise PipelineError(f"{path}: not a `ggufpipe collect` results file: a JSON object expected, got {_type(data)}")
    if data.get("kind") != RESULTS_KIND:
        raise PipelineError(f"{path}: kind {_value(data.get('kind'))}: not a `ggufpipe collect` results file")
    results = data.get("results")
    if not isinstance(results, list):
        raise PipelineError(f"{path}: field results: must be a list of results, got "
                            f"{'nothing' if 'results' not in data else _type(results)}")
    for i, r in enumerate(results):
        if not isinstance(r, dict):
            raise PipelineError(f"{path}: field results[{i}]: must be a result (a mapping), got {_type(r)}")
    return results


def stored_results(path: Path, pub: Published) -> tuple[dict, list[str]]:
    """The results of devices.json ``path`` for files ``pub`` publishes with the same SHA256, each checked and judged
    again (:func:`judged`) and merged by :func:`take`: (device label, file) -> (where, result), and the notes. Results
    of files no longer published are dropped, with a note."""
    merged, notes = {}, []
    for i, r in enumerate(read_stored(path)):
        where = f"{path} results[{i}]"
        file, sha = r.get("file"), r.get("sha256")
        entry = pub.entries.get(file) if isinstance(file, str) else None
        if entry is None or entry["sha256"] is None or entry["sha256"] != sha:
            notes.append(f"dropped {where} (file {_value(file)}): not a file published now")
            continue
        r, changed = judged(where, r, pub, stored=True)  # the tolerance may be another build's
        if changed:
            notes.append(f"{r['device']['label']}'s result for {r['file']}: {changed}")
        note = take(merged, where, r)
        if not note.startswith("added"):  # two entries for one device and file: a devices.json edited by hand
            notes.append(note)
    return merged, notes
