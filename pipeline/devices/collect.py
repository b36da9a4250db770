"""``ggufpipe collect R.json ...``: add ``ggufpipe device-check`` results to ``artifacts/<name>/devices.json``.

``devices.json`` is an input of the publish stage (the report's "On-device check" and the card's "Checked on devices"
show it); nothing edits report.md. A result is taken only when it is for the build the folder holds now (its
``build_id``) and for a file that build publishes with the same SHA256; one device's newer result for a file replaces
its older one. Results of files no longer published are dropped (and said so). The file is written atomically and
sorted, so collecting the same results again changes nothing.

A result is data from elsewhere, so nothing in it is trusted: every field the report and card show is checked for its
type (a device label by the rule of a recipe ``devices:`` name), and every verdict is judged again from the measured
numbers against the manifest's own slice values and tolerance (what the result says it expected is replaced).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from pipeline.devices.check import LABEL_RE, POWER_MODE_RE, RESULT_KIND, RESULT_VERSION, judge
from pipeline.errors import PipelineError
from pipeline.fsutil import write_text_atomic
from pipeline.layout import plain_name
from pipeline.recipe.speedup import ROUNDS_MIN
from pipeline.stages.speedup import summarize, verdict

RESULTS_KIND = f"{RESULT_KIND}-results"  # pipeline/stages/publish_devices.py reads it


def _read(path: Path, what: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{path}: cannot read {what}: {exc}") from None


def check_result(path: Path, r: dict, manifest: dict) -> None:
    """Refuse (one line naming the file and field) a result that is not a device-check of a file ``manifest`` publishes."""
    if r.get("kind") != RESULT_KIND or r.get("version") != RESULT_VERSION:
        raise PipelineError(f"{path}: kind {r.get('kind')!r} version {r.get('version')!r}: not a `ggufpipe device-check "
                            f"--out` result (version {RESULT_VERSION})")
    if r.get("emulated"):
        raise PipelineError(f"{path}: emulated ({r['emulated'].get('profile')} under qemu): evidence for the tolerance "
                            "(bench/arm_emulated.py), not a device's result")
    for key in ("name", "build_id", "file", "sha256", "device", "passed", "checked"):
        if key not in r:
            raise PipelineError(f"{path}: field {key} missing")
    if r["name"] != manifest["name"]:
        raise PipelineError(f"{path}: name {r['name']!r}: a result for another recipe than {manifest['name']!r}")
    if r["build_id"] != manifest["build_id"]:
        raise PipelineError(f"{path}: build_id {r['build_id']} is not the published build {manifest['build_id']}: "
                            "run device-check on the files published now")
    entry = next((e for e in manifest["artifacts"] if e["file"] == r["file"]), None)
    if entry is None or entry["sha256"] != r["sha256"]:
        raise PipelineError(f"{path}: file {r['file']} (sha256 {str(r['sha256'])[:16]}…) is not a file the manifest "
                            "publishes")
    if r["checked"] and not isinstance(r.get("slice"), dict):
        raise PipelineError(f"{path}: field slice missing from a checked result")
    _check_shown_fields(path, r)
    pairs = {f"{p.get('main')} + {p.get('draft')}" for p in (manifest.get("draft") or {}).get("pairs", [])}
    if r.get("speedup") and r["speedup"]["pair"] not in pairs:
        raise PipelineError(f"{path}: field speedup.pair: {r['speedup']['pair']!r} is not a pair the manifest declares")


_MACHINE_RE = re.compile(r"^[A-Za-z0-9._-]{1,32}$")
_PAIR_RE = re.compile(r"^[A-Za-z0-9._-]{1,200} \+ [A-Za-z0-9._-]{1,200}$")


def _number(path: Path, value, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise PipelineError(f"{path}: field {field}: must be a finite number, got {value!r}")
    return float(value)


def _check_shown_fields(path: Path, r: dict) -> None:
    """The fields devices.json carries into the report and the card, each of the type they are shown as."""
    d = r["device"]
    if not isinstance(d, dict):
        raise PipelineError(f"{path}: field device: must be a mapping (label, machine, ...), got {type(d).__name__}")
    if not isinstance(d.get("label"), str) or not LABEL_RE.match(d["label"]):
        raise PipelineError(f"{path}: field device.label: {d.get('label')!r} is not a plain label (a-z 0-9 . _ -, "
                            "starting with a letter or digit, at most 32: a recipe devices: name's rule)")
    if not isinstance(d.get("machine"), str) or not _MACHINE_RE.match(d["machine"]):
        raise PipelineError(f"{path}: field device.machine: {d.get('machine')!r} is not a machine name "
                            "(A-Z a-z 0-9 . _ -, at most 32)")
    if "power_mode" in d and not (isinstance(d["power_mode"], str) and POWER_MODE_RE.match(d["power_mode"])):
        raise PipelineError(f"{path}: field device.power_mode: {d['power_mode']!r} is not a plain power mode name "
                            "(such as MAXN or 15W)")
    for key in ("checked", "passed"):
        if not isinstance(r[key], bool):
            raise PipelineError(f"{path}: field {key}: must be true or false, got {r[key]!r}")
    if not r["checked"]:
        return
    measured = r["slice"].get("measured")
    if not isinstance(measured, dict):
        raise PipelineError(f"{path}: field slice.measured missing from a checked result")
    for key in ("kld_mean", "same_top_p"):
        _number(path, measured.get(key), f"slice.measured.{key}")
    build = (r.get("tools") or {}).get("llama_cpp_build") if isinstance(r.get("tools"), dict) else None
    if isinstance(build, bool) or not isinstance(build, int):
        raise PipelineError(f"{path}: field tools.llama_cpp_build: must be a build number, got {build!r}")
    _check_speedup(path, r)
    bench = r.get("bench")
    if bench is not None:
        if not isinstance(bench, dict):
            raise PipelineError(f"{path}: field bench: must be a mapping or null, got {type(bench).__name__}")
        if "tg_tokens_per_s" in bench:
            _number(path, bench["tg_tokens_per_s"], "bench.tg_tokens_per_s")


def _check_speedup(path: Path, r: dict) -> None:
    """A result's draft speed-up (``device-check --draft``): its pair a pair of the result's file, its per-round rates
    numbers (the median, interval and decision are computed again from them: :func:`rejudge`)."""
    sp = r.get("speedup")
    if sp is None:
        return
    if not isinstance(sp, dict):
        raise PipelineError(f"{path}: field speedup: must be a mapping, got {type(sp).__name__}")
    pair = sp.get("pair")
    if not isinstance(pair, str) or not pair.startswith(f"{r['file']} + ") or not _PAIR_RE.match(pair):
        raise PipelineError(f"{path}: field speedup.pair: {pair!r} is not a pair of {r['file']} (MAIN + DRAFT file names)")
    n = sp.get("n_max")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= 64:
        raise PipelineError(f"{path}: field speedup.n_max: must be a draft length 1..64, got {n!r}")
    rates = []
    for key in ("tokens_per_s", "baseline_tokens_per_s"):
        v = sp.get(key)
        if not isinstance(v, list) or len(v) < ROUNDS_MIN:
            raise PipelineError(f"{path}: field speedup.{key}: must be a list of at least {ROUNDS_MIN} rates")
        rates.append([_number(path, x, f"speedup.{key}") for x in v])
    if len(rates[0]) != len(rates[1]) or min(rates[1]) <= 0:
        raise PipelineError(f"{path}: field speedup.baseline_tokens_per_s: one positive rate per round of "
                            "speedup.tokens_per_s")
    _number(path, sp.get("acceptance_rate"), "speedup.acceptance_rate")


def rejudge_speedup(r: dict) -> tuple[dict, str | None]:
    """The draft speed-up of ``r`` computed again from its per-round rates (median, interval, decision, verdict)."""
    sp = r.get("speedup")
    if not sp:
        return r, None
    s = summarize(sp["tokens_per_s"], sp["baseline_tokens_per_s"])
    helps, line = verdict(s["speedup"], s["interval"], sp["n_max"], r["device"]["label"])
    fixed = {**sp, **s, "helps": helps, "verdict": line}
    note = None if (sp.get("helps"), sp.get("speedup")) == (helps, s["speedup"]) else (
        f"draft speed-up judged again from its rates: {line}")
    return {**r, "speedup": fixed}, note


def rejudge(r: dict, manifest: dict) -> tuple[dict, str | None]:
    """``r`` with its verdict judged again (:func:`pipeline.devices.check.judge`) from its measured numbers against the
    manifest's slice values and tolerance, and its draft speed-up from its rates; and a note when the result had said
    otherwise (else None)."""
    r, sp_note = rejudge_speedup(r)
    fixed, note = _rejudge_slice(r, manifest)
    return fixed, "; ".join(n for n in (note, sp_note) if n) or None


def _rejudge_slice(r: dict, manifest: dict) -> tuple[dict, str | None]:
    if not r["checked"]:  # verified only: no numbers, nothing to judge
        return {**r, "passed": True}, (None if r["passed"] else "a verified-only result cannot fail: stored as verified")
    dc = manifest["device_check"]
    expected = next(e for e in manifest["artifacts"] if e["file"] == r["file"])["slice"]
    measured = {k: float(r["slice"]["measured"][k]) for k in ("kld_mean", "same_top_p")}
    verdict = judge(expected, measured, dc["tolerance"], dc["scored_tokens"])
    fixed = {**r, "passed": verdict["passed"], "slice": {**r["slice"], "expected": expected, **verdict}}
    if r["passed"] != verdict["passed"]:
        return fixed, (f"judged again: {'pass' if verdict['passed'] else 'FAIL'}, not the result's "
                       f"{'pass' if r['passed'] else 'FAIL'} (mean KLD {measured['kld_mean']:.5f}, Δ "
                       f"{verdict['delta']['kld_mean']:+.5f}, limit ±{verdict['limit']['kld_mean']:.5f})")
    return fixed, None


def collect(results: list[str | Path], artifacts: str | Path = "artifacts") -> tuple[Path, list[str]]:
    """Entry function: merge ``results`` into ``<artifacts>/<name>/devices.json``; (its path, notes printed)."""
    if not results:
        raise PipelineError("no result files given")
    loaded = [(Path(p), _read(Path(p), "a device-check result")) for p in results]
    names = {r.get("name") for _, r in loaded}
    if len(names) != 1:
        raise PipelineError(f"results of several recipes ({', '.join(sorted(map(str, names)))}): collect one recipe's at a time")
    name = names.pop()
    if not isinstance(name, str):
        raise PipelineError(f"{loaded[0][0]}: field name missing")
    folder = Path(artifacts) / plain_name(name, "recipe")  # never a path out of artifacts/
    manifest = _read(folder / "manifest.json", "the manifest")
    if not isinstance(manifest.get("device_check"), dict):
        raise PipelineError(f"{folder / 'manifest.json'}: no device_check section: this build publishes no slice to "
                            "check devices against")
    for p, r in loaded:
        check_result(p, r, manifest)
    out = folder / "devices.json"
    have = _read(out, "collected results") if out.is_file() else {"kind": RESULTS_KIND, "name": name, "results": []}
    if have.get("kind") != RESULTS_KIND:
        raise PipelineError(f"{out}: kind {have.get('kind')!r}: not a `ggufpipe collect` results file")
    published = {e["file"]: e["sha256"] for e in manifest["artifacts"]}
    merged, notes = {}, []
    for r in have["results"]:
        if published.get(r.get("file")) != r.get("sha256"):
            notes.append(f"dropped {r['device']['label']}'s result for {r['file']}: not a file published now")
            continue
        _check_shown_fields(out, r)
        r, changed = rejudge(r, manifest)  # the tolerance may be another build's
        if changed:
            notes.append(f"{r['device']['label']}'s result for {r['file']}: {changed}")
        merged[(r["device"]["label"], r["file"])] = r
    for p, r in loaded:
        r, changed = rejudge(r, manifest)
        key = (r["device"]["label"], r["file"])
        notes.append(f"{'replaced' if key in merged else 'added'} {key[0]}'s result for {key[1]} from {p}: "
                     + ("pass" if r["passed"] else "FAIL") + ("" if r["checked"] else " (verified only)")
                     + (f" ({changed})" if changed else ""))
        merged[key] = r
    data = {"kind": RESULTS_KIND, "name": name, "build_id": manifest["build_id"],
            "results": [merged[k] for k in sorted(merged, key=lambda k: (k[1], k[0]))]}
    write_text_atomic(out, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out, notes
