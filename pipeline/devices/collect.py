"""``ggufpipe collect R.json ...``: add ``ggufpipe device-check`` results to ``artifacts/<name>/devices.json``.

``devices.json`` is an input of the publish stage (the report's "On-device check" and the card's "Checked on devices"
show it); nothing edits report.md. A result is taken only when it is for the build the folder holds now (its
``build_id``) and for a file that build publishes with the same SHA256, at most :data:`RESULT_MAX_BYTES`. Results of
files no longer published are dropped (and said so). Which result of a device and file is kept, what is checked and
how it is judged again: pipeline/stages/device_results.py, which the publish stage reads devices.json with too. The
file is written atomically and sorted, so collecting the same results again changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline import bounds
from pipeline.errors import PipelineError
from pipeline.fsutil import read_json, write_text_atomic
from pipeline.layout import plain_name
from pipeline.stages.device_results import (
    RESULTS_KIND,
    check_kind,
    check_result,
    published,
    rejudge,
    stored_results,
    take,
)

RESULT_MAX_BYTES = 1 << 20  # a result is 1-3 kB; a draft speed-up adds a few numbers per round


def collect(results: list[str | Path], artifacts: str | Path = "artifacts") -> tuple[Path, list[str]]:
    """Entry function: merge ``results`` into ``<artifacts>/<name>/devices.json``; (its path, notes printed)."""
    if not results:
        raise PipelineError("no result files given")
    loaded = [(Path(p), read_json(Path(p), "a device-check result", RESULT_MAX_BYTES)) for p in results]
    for p, r in loaded:
        check_kind(p, r)
        if not isinstance(r.get("name"), str):
            raise PipelineError(f"{p}: field name: must be a recipe name, got {bounds.shown(r.get('name'))}")
    names = {r["name"] for _, r in loaded}
    if len(names) != 1:
        raise PipelineError(f"results of several recipes ({', '.join(sorted(names))}): collect one recipe's at a time")
    name = names.pop()
    folder = Path(artifacts) / plain_name(name, "recipe")  # never a path out of artifacts/
    mpath = folder / "manifest.json"
    pub = published(mpath, read_json(mpath, "the manifest"))
    if pub.device_check is None:
        raise PipelineError(f"{mpath}: no device_check section: this build publishes no slice to check devices against")
    new = [(p, rejudge(check_result(p, r, pub), pub)) for p, r in loaded]
    out = folder / "devices.json"
    merged, notes = stored_results(out, pub)
    for p, (r, changed) in new:
        notes.append(take(merged, p, r) + (f" ({changed})" if changed else ""))
    data = {"kind": RESULTS_KIND, "name": name, "build_id": pub.build_id,
            "results": [merged[k][1] for k in sorted(merged, key=lambda k: (k[1], k[0]))]}
    write_text_atomic(out, json.dumps(data, indent=2, sort_keys=True) + "\n")
    return out, notes
