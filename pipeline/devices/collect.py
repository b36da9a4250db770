"""``ggufpipe collect R.json ...``: add ``ggufpipe device-check`` results to ``artifacts/<name>/devices.json``.

``devices.json`` is an input of the publish stage (the report's "On-device check" and the card's "Checked on devices"
show it); nothing edits report.md. A result is taken only when it is for the build the folder holds now (its
``build_id``) and for a file that build publishes with the same SHA256; one device's newer result for a file replaces
its older one. Results of files no longer published are dropped (and said so). The file is written atomically and
sorted, so collecting the same results again changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.devices.check import RESULT_KIND, RESULT_VERSION
from pipeline.errors import PipelineError
from pipeline.fsutil import write_text_atomic
from pipeline.layout import plain_name

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
        merged[(r["device"]["label"], r["file"])] = r
    for p, r in loaded:
        key = (r["device"]["label"], r["file"])
        notes.append(f"{'replaced' if key in merged else 'added'} {key[0]}'s result for {key[1]} from {p}: "
                     + ("pass" if r["passed"] else "FAIL") + ("" if r["checked"] else " (verified only)"))
        merged[key] = r
    data = {"kind": RESULTS_KIND, "name": name, "build_id": manifest["build_id"],
            "results": [merged[k] for k in sorted(merged, key=lambda k: (k[1], k[0]))]}
    write_text_atomic(out, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out, notes
