"""Stage publish: gate verdicts -> published GGUFs, ``manifest.json``, metrics, report and card.

A quant is published (hard-linked from ``work/`` into ``artifacts/<name>/``) only when it passed
every gate of every eval set; a quant that failed is listed under ``rejected`` with the reasons and
never appears in ``artifacts`` — no manifest entry marks it good and no file of it sits in the
artifact folder. The quants that passed are published all the same; :func:`check_gates` (the
workflow's last job) then fails the build, naming recipe, quant, eval set, metric, value and
threshold. With ``publish.ollama`` in the recipe, an Ollama ``Modelfile.<KEY>`` is written beside each
published model file (pipeline/distribution/hub.py) and listed with its SHA256 under ``ollama``. A measured mix's
tensor-type map is published beside its GGUF (``<name>-<KEY>.tensor-types.txt``, SHA256 in its ``mix.map``) and each
sensitivity measurement drawn as ``sensitivity-<flavour>.svg`` (pipeline/stages/report_mix.py). With recipe ``devices:``, every published
base and quant's memory is predicted per device (``devices``: pipeline/devices/memory.py, publish_sections.fits_section);
a ``require: true`` device that no published quant fits fails :func:`check_gates` like a failed gate.

The manifest is deterministic: identical inputs give identical manifests apart from the ``build``
section (timestamp and build-box speed figures) and the sensitivity cost's seconds and cache counts
(:func:`strip_volatile`). ``build_id`` is derived from the inputs (recipe
file, source commit and file hashes, tool versions), so one set of inputs always names the same
version.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from pathlib import Path

from pipeline import tools_backend as tb
from pipeline.errors import ArtifactError, GateFailure, PipelineError
from pipeline.fsutil import atomic_output, hashing_ahead, sha256_file, write_json_atomic
from pipeline.gguf import general_metadata, read_facts
from pipeline.layout import Layout, plain_name
from pipeline.provenance import source_files_digest
from pipeline.recipe import Recipe
from pipeline.recipe.naming import label_of_key
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.evaluate import failure_message, gate_checks, gate_messages, verdict
from pipeline.stages.mtp import MTP_KEYS, lost_heads, mtp_facts
from pipeline.stages.publish_devices import device_check_section, device_results, publish_slice
from pipeline.stages.publish_sections import (
    CONFORMANCE_REJECTED,
    _calibration_inputs,
    _conformance_section,
    _draft_section,
    _load,
    _mtp_draft_entry,
    _mtp_section,
    _overrides_entry,
    _tokenizer_keys,
    check_mix_sources,
    devices_section,
    mix_entry,
    sensitivity_section,
    strip_sensitivity_cost,
)
from pipeline.stages.split import model_path

# 2: the conformance section (the base against the HF model), a failed conformance rejects every file, each
#    artifact's tokenizer_sha256, vocab_overrides; build_id covers the schema version.
# 3: file names by the Hub-native rule (`<name>-<TYPE>_<VARIANT>.gguf`, `<name>-mtp-F16_MTP.gguf`) and each
#    artifact's `label` (pipeline/recipe/naming.py).
# 4: the conformance section's fifth check, `hparams` (the GGUF's architecture keys against the HF config, #15).
# 5: each quant's `tensor_types` (histogram, tensors unlike the recipe's request with the reason, predicted and
#    written bytes; `tensor_types_file` with a map: #19), MTP drafts (`draft.mtp`, `draft.spec_type`) and every
#    pair's `acceptance.spec_type` / `acceptance.command` / `acceptance.served` (the deploy line run by llama-server, #18).
# 6: measured mixes (#19 part 2): each mix quant's `mix` (solver, flavour, goal {budget, bytes} or {target},
#    candidates, floor, choice, predicted {bytes, bpw, kld_mean}, sensitivity {sha256, text, text_sha256, ctx, chunks},
#    map {file, sha256}: the map published beside the GGUF) and the top-level `sensitivity` section per flavour
#    (text, settings, floor_kld_mean, groups with bytes and kld_mean per candidate, cost; the cost's seconds and cache
#    counts are volatile); build_id covers the sensitivity text of a recipe with mixes.
# 7: target devices (recipe `devices:`, #20): the top-level `devices` section, per device memory_bytes, ctx, kv_type,
#    arch, require, files {KEY: {total, fits, margin_bytes}} (predicted peak RSS of each published base and quant,
#    pipeline/devices/memory.py: deterministic, not volatile), best (the largest quant that fits, or null) and, for
#    an arm64 profile where no published quant has a repacked tensor, warning; a `require: true` device that no
#    published quant fits is a recipe-level failure (check "device"). Recipes without `devices:` are unchanged.
#    Also 7 (the same issue): the top-level `device_check` (the slice `device-slice.logits` a device re-measures:
#    file, sha256, size_bytes, eval_set, text_sha256, ctx, chunks, scored_tokens, n_vocab, tolerance) and each base and
#    quant entry's `slice` {kld_mean, same_top_p, ppl_q}; `tools.backend` (#20 item 5).
# 8: conformance causes (#27): the tokenizer check's `normalizer` and `causes` {cause: {status, probes, text_share}},
#    the probe set's split accent probes; the chat-template check's `identical_but_for_cause`.
SCHEMA_VERSION = 8


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def build_id(recipe: Recipe, source: dict, tools: dict, calibration: dict | None = None) -> str:
    inputs = {"schema_version": SCHEMA_VERSION, "recipe": recipe.sha256, "source": source, "tools": tools}
    if calibration:  # the calibration texts' SHA256s (a text may change while the recipe does not)
        inputs["calibration"] = calibration
    digest = hashlib.sha256(_canonical(inputs)).hexdigest()
    return f"{recipe.name}-{digest[:12]}"


def offload() -> dict:
    """The backend the llama.cpp tools of this build computed on (``GGUFPIPE_BACKEND``: every stage that runs them has
    it in its rerun trigger, pipeline/workflow.py) and, off the CPU, the layers offloaded (``-ngl``)."""
    backend = tb.selected_backend()
    return {"backend": backend, **({"ngl": tb.selected_ngl(backend)} if backend != "cpu" else {})}


def timestamp() -> str:
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    t = int(epoch) if epoch and epoch.isdigit() else int(time.time())
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


def _link(src: Path, dst: Path) -> None:
    """Publish ``src`` at ``dst`` atomically (hard link when possible, else copy)."""
    import shutil

    if dst.exists() and os.path.samefile(src, dst):
        return
    with atomic_output(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def artifact_key(name: str, artifact: str) -> str:
    """``<KEY>`` of ``<name>-<KEY>.gguf`` or of the split folder ``<name>-<KEY>``."""
    return artifact.removeprefix(f"{name}-").removesuffix(".gguf")


def artifact_sources(layout: Layout, name: str, entry: dict) -> list[tuple[Path, Path, int]]:
    """``(built file in work/, published path, size)`` for every file of a manifest artifact: the GGUF, or
    each shard of a split file (from ``work/<name>/split/<name>-<KEY>/`` into ``artifacts/<name>/<name>-<KEY>/``)."""
    dest = layout.art_dir(name) / plain_name(entry["file"], "artifact file")
    s = entry.get("split")
    if not s:
        return [(layout.built(name, entry["file"]), dest, entry["size_bytes"])]
    src = layout.split_dir(name, artifact_key(name, entry["file"]))
    return [(src / sh["file"], dest / plain_name(sh["file"], "shard file"), sh["size_bytes"]) for sh in s["shards"]]


def link_artifact(layout: Layout, name: str, entry: dict) -> Path:
    """Publish one manifest artifact into ``artifacts/<name>/`` by hard link: the GGUF, or the folder of a
    split file's shards (holding nothing else)."""
    import shutil

    dest = layout.check_art_dir(name) / plain_name(entry["file"], "artifact file")
    files = artifact_sources(layout, name, entry)
    if entry.get("split"):
        if dest.exists() and not dest.is_dir():
            dest.unlink()
        dest.mkdir(parents=True, exist_ok=True)
        want = {d.name for _, d, _ in files}
        for p in dest.iterdir():  # shards of an earlier split (another max_size), leftovers
            if p.name not in want:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    elif dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest)
    for src, dst, _size in files:
        _link(src, dst)
    return dest


def _split_entry(recipe: Recipe, layout: Layout, key: str, entry: dict) -> dict:
    """The manifest entry of file ``key`` as published: unchanged when whole; for a split file the folder
    ``<name>-<KEY>`` with its shards (name, SHA256, size, tensors), the facts of the whole model (quant
    type, bpw, tensor and parameter counts, read from the whole file) and that file's SHA256 (``unsplit``:
    what eval and bench measured; kept in work/, not published)."""
    from pipeline.gguf import file_type_name
    from pipeline.stages.split import read_shards

    # the label both the Hub and llama.cpp's `-hf <repo>:<LABEL>` read from the file name (pipeline/recipe/naming.py)
    entry = {**entry, "label": label_of_key(key)}
    cfg = recipe.split_for(key)
    if cfg is None:
        return entry
    folder = layout.split_dir(recipe.name, key)
    stem = f"{recipe.name}-{key}"
    try:
        shards = read_shards(folder, stem, entry["tensor_count"])
        first = file_type_name(shards[0][1]["file_type"])
        if first != entry["quant_type"]:
            raise PipelineError(f"{shards[0][0]}: general.file_type says {first}, the whole file {entry['quant_type']}")
    except PipelineError as exc:
        raise PipelineError(f"{exc}: not the shards of {layout.built(recipe.name, entry['file'])}; re-run the split "
                            "stage (`snakemake --forcerun split`)") from None
    recs = [{"file": p.name, "sha256": sha256_file(p), "size_bytes": p.stat().st_size, "tensor_count": h["tensor_count"]}
            for p, h in shards]
    out = {"file": stem, "quant_type": entry["quant_type"], "size_bytes": sum(r["size_bytes"] for r in recs),
           "split": {**cfg.describe(), "tool": "llama-gguf-split", "count": len(recs), "shards": recs,
                     "unsplit": {k: entry[k] for k in ("file", "sha256", "size_bytes")}}}
    out.update({k: v for k, v in entry.items() if k not in ("file", "quant_type", "sha256", "size_bytes")})
    return out


IMATRIX_KEYS = ("quantize.imatrix.file", "quantize.imatrix.dataset", "quantize.imatrix.entries_count",
                "quantize.imatrix.chunks_count")


def _calibration(recipe: Recipe, layout: Layout, q, gguf_path: Path, seconds: dict) -> tuple[dict, list[dict]]:
    """A quant's ``calibration`` entry (AWQ params, imatrix settings and SHA256s) and the failures
    of its cross-check against the GGUF's own ``quantize.imatrix.*`` keys."""
    from pipeline.gguf import read_header

    out: dict = {}
    failures: list[dict] = []
    if q.awq:
        a = _load(layout.awq_record(recipe.name))
        out["awq"] = {**a["params"], "calibration_sha256": a["calibration_sha256"], "device": a["device"],
                      "threads": a.get("threads"), "autoawq": a["autoawq"]}
        seconds["awq"] = a["seconds"]
    meta = read_header(gguf_path).metadata
    keys = {k: meta[k] for k in IMATRIX_KEYS if k in meta}
    if q.imatrix:
        m = _load(layout.imatrix_record(recipe.name, q.base))
        imx_file = layout.imatrix(recipe.name, q.base)
        out["imatrix"] = {**m["params"], "base": q.base, "file": imx_file.name, "sha256": m["sha256"],
                          "calibration_sha256": m["calibration_sha256"], "entries": m["facts"]["entries"],
                          "threads": m.get("threads")}
        seconds[f"imatrix_{q.base}"] = m["seconds"]
        want = {"quantize.imatrix.file": imx_file.name, "quantize.imatrix.dataset": m["params"]["calibration"],
                "quantize.imatrix.entries_count": m["facts"]["entries"],
                "quantize.imatrix.chunks_count": m["facts"]["chunk_count"]}
        bad = {k: (keys.get(k), v) for k, v in want.items() if keys.get(k) != v}
        if bad:
            failures.append({"check": "calibration", "message": (
                f"imatrix record mismatch: recipe {recipe.name}, quant {q.key}: the GGUF says "
                + ", ".join(f"{k}={g!r} where {w!r} was expected" for k, (g, w) in bad.items()))})
    elif keys:
        failures.append({"check": "calibration", "message": (
            f"imatrix record mismatch: recipe {recipe.name}, quant {q.key} was to be made without an importance "
            f"matrix but its GGUF has {', '.join(sorted(keys))}")})
    return out, failures


GATE_METRICS = ("ppl_q", "ppl_ratio", "ln_ppl_ratio", "kld_mean", "kld_median", "kld_p99", "kld_max", "rms_dp",
                "same_top_p")


def build_manifest(recipe: Recipe, layout: Layout) -> tuple[dict, dict]:
    """(manifest, metrics) from the stage records and the files; writes nothing."""
    name = recipe.name
    fetched = _load(layout.fetch_record(name))
    converted = _load(layout.convert_record(recipe))
    source = dict(fetched["source"])
    source["files_sha256"] = source_files_digest(fetched["files"])
    tools = {**converted["toolchain"], "python": converted.get("python", {})}
    for k in ("origin", "backend", "ngl"):  # the convert stage runs no llama.cpp tool: the backend is this run's
        tools.pop(k, None)
    tools.update(offload())

    base_path = layout.base_gguf(recipe)
    base = read_facts(base_path)
    if base.quant_type != recipe.base_key:
        raise PipelineError(f"{base_path}: general.file_type says {base.quant_type}, recipe asks for {recipe.base_key}")

    eval_sets, eval_base, metrics_out, eval_threads = [], {}, {}, {}
    for es in recipe.eval_sets:
        rec = _load(layout.base_record(name, es.name))
        eval_sets.append({"name": es.name, "text": rec["text"], "text_sha256": rec["text_sha256"], "ctx": es.ctx,
                          "chunks": es.chunks, "scored_tokens": rec["scored_tokens"]})
        eval_threads[es.name] = rec["threads"]  # follows --cores (results do not): build section
        eval_base[es.name] = {"ppl": rec["ppl"], "ppl_stderr": rec["ppl_stderr"]}
    if eval_base:
        metrics_out[base.quant_type] = {s: {"ppl": v["ppl"]} for s, v in eval_base.items()}

    base_mtp = mtp_facts(base_path)
    artifacts = [{**base.as_dict(), "role": "base"}]
    if base_mtp["tensors"]:
        artifacts[0]["mtp"] = {k: base_mtp[k] for k in MTP_KEYS}
    artifacts[0] = _split_entry(recipe, layout, base.quant_type, artifacts[0])
    converted_mode = converted.get("mtp", {}).get("mode", "keep")
    if converted_mode != recipe.mtp:
        raise PipelineError(f"{layout.convert_record(recipe)}: converted with mtp: {converted_mode}, the recipe asks for "
                            f"mtp: {recipe.mtp}: re-run the convert stage")
    if recipe.mtp == "separate":
        artifacts.append(_split_entry(recipe, layout, recipe.mtp_key, _mtp_draft_entry(recipe, layout)))
    rejected = []
    by_key = {base.quant_type: artifacts[0]}  # the entries a device can check on the slice
    chunk_rows: dict[str, list] = {}  # and each quant's chunk rows on the first eval set (pipeline/stages/evaluate.py)
    calib_seconds: dict = {}
    for q in recipe.quants:
        work_path = layout.quant(recipe, q.key)
        rec = _load(layout.quant_record(name, q.key))
        facts = read_facts(work_path)
        facts.file = recipe.file_for(q.key)
        if facts.quant_type != q.type:
            raise PipelineError(f"{work_path}: general.file_type says {facts.quant_type}, recipe asks for {q.type}")
        entry = {**facts.as_dict(), "role": "quant", "requested": rec["quant"]}
        for k in ("tensor_types", "tensor_types_file"):  # the per-type histogram, what differs from the recipe, bytes
            if k in rec:
                entry[k] = rec[k]
        if q.mix:  # the solve it was made from and its map (published beside the GGUF)
            if "mix" not in rec:
                raise PipelineError(f"{layout.quant_record(name, q.key)}: no mix layout: re-run the quantize stage")
            entry["mix"] = mix_entry(rec)
        calibration, failures = _calibration(recipe, layout, q, work_path, calib_seconds)
        if calibration:
            entry["calibration"] = calibration
        per_set, thresholds = {}, {}
        for es in recipe.eval_sets:
            ev = _load(layout.eval_record(name, es.name, q.key))
            if es is recipe.first_eval_set:  # the device slice's values: the running statistics after its chunks
                chunk_rows[q.key] = ev.get("chunk_rows") or []
            per_set[es.name] = {k: ev["metrics"][k] for k in GATE_METRICS}
            thresholds[es.name] = recipe.thresholds(q.key, es.name)
            failures += [{**f, "eval_set": es.name, "check": "gate",
                          "message": failure_message(name, q.key, es.name, f)}
                         for f in verdict(ev["metrics"], thresholds[es.name])]
        if base_mtp["tensors"]:
            q_mtp = mtp_facts(work_path)
            entry["mtp"] = {k: q_mtp[k] for k in MTP_KEYS}
            lost = lost_heads(base_mtp, q_mtp)
            if lost:
                failures.append({"check": "mtp", "lost": lost, "message": (
                    f"MTP heads lost: recipe {name}, quant {q.key} lacks {len(lost)} of the {base_mtp['tensors']} "
                    f"nextn tensors of the {base.quant_type} file (first: {lost[0]})")})
        if recipe.eval_sets:
            entry["metrics"] = per_set
            entry["gate"] = {"passed": not failures, "thresholds": thresholds}
            metrics_out[q.key] = {s: {**{k: v[k] for k in ("ppl_q", "ppl_ratio", "kld_mean", "kld_p99", "same_top_p")},
                                      "gate_passed": not failures} for s, v in per_set.items()}
        entry = _split_entry(recipe, layout, q.key, entry)
        by_key[q.key] = entry
        if failures:
            entry["failures"] = failures
            rejected.append(entry)
        else:
            artifacts.append(entry)

    _tokenizer_keys(recipe, layout, artifacts, rejected)
    device_check = device_check_section(recipe, layout, by_key, chunk_rows)
    sensitivity = sensitivity_section(recipe, layout)
    check_mix_sources(artifacts + rejected, sensitivity)
    conformance, conformance_failures, conformance_seconds = _conformance_section(recipe, layout)
    if conformance_failures:  # the reference itself is not the HF model: no file of the recipe is published
        for e in artifacts:
            e["failures"] = [*e.get("failures", []), {"check": "conformance", "message": CONFORMANCE_REJECTED}]
        rejected, artifacts = artifacts + rejected, []

    devices, device_failures, _warnings = devices_section(recipe, layout, artifacts)
    paths = {artifact_key(name, e["file"]): model_path(e) for e in artifacts + rejected}
    draft, draft_failures, draft_timings = _draft_section(recipe, layout, paths) if recipe.draft else (None, [], {})

    bench = {}
    if recipe.bench:  # keyed by the published name (file, or folder of a split file)
        for key in [recipe.base_key] + [q.key for q in recipe.quants]:
            fname = recipe.artifact_for(key)
            b = _load(layout.bench_record(name, key))
            bench[fname] = {k: b[k] for k in ("pp_tokens_per_s", "tg_tokens_per_s", "pp_tokens", "tg_tokens", "threads")}
    build = {"timestamp": timestamp(), "device": tb.device_description(tools["backend"])}
    if eval_threads:
        build["eval_threads"] = eval_threads
    if calib_seconds:
        build["calibration_seconds"] = calib_seconds
    if draft_timings:
        build["draft_decode_tokens_per_s"] = draft_timings
    if conformance_seconds:
        build["conformance_seconds"] = conformance_seconds
    if bench:
        build["bench"] = bench
        build["bench_label"] = "llama-bench on the build box (CPU), not device speed"

    manifest = {
        "schema_version": SCHEMA_VERSION,
        "name": name,
        "build_id": build_id(recipe, source, tools, _calibration_inputs(recipe)),
        "recipe": {"name": name, "file": recipe.path.name, "sha256": recipe.sha256},
        "source": source,
        "tools": tools,
        "gguf_metadata": general_metadata(base_path),
        "base_quant_type": base.quant_type,
        "eval_sets": eval_sets,
        "eval_base": eval_base,
        "conformance": conformance,
        "artifacts": artifacts,
        "rejected": rejected,
    }
    if sensitivity:
        manifest["sensitivity"] = sensitivity
    if converted.get("vocab_overrides"):
        manifest["vocab_overrides"] = _overrides_entry(converted["vocab_overrides"])
    if recipe.mtp != "keep":
        manifest["mtp"] = _mtp_section(recipe, converted, artifacts)
    if devices:
        manifest["devices"] = devices
    if device_check:
        manifest["device_check"] = device_check
    if draft is not None:
        manifest["draft"] = draft
    if draft is not None or conformance_failures or device_failures:
        manifest["failures"] = conformance_failures + draft_failures + device_failures
    manifest["build"] = build
    return manifest, metrics_out


def publish(recipe: Recipe, layout: Layout) -> dict:
    """Entry function: publish passing quants; write metrics, report, plot, card, Modelfiles and manifest."""
    import shutil

    from pipeline.stages.card import write_card
    from pipeline.stages.hubfiles import publish_modelfiles
    from pipeline.stages.report import write_report
    from pipeline.stages.split import SHARD_RE

    name = recipe.name
    layout.check_art_dir(name)  # before anything is written: never through a symlink out of artifacts/
    # The GGUFs' SHA256s (0.5 s of CPU for the demo's 630 MB) by two helper threads, beside this one's header
    # parsing: publish runs alone at the end of a build.
    ggufs = [layout.base_gguf(recipe)] + [layout.quant(recipe, q.key) for q in recipe.quants]
    if recipe.mtp == "separate":
        ggufs.append(layout.mtp_gguf(recipe))
    with hashing_ahead(ggufs, workers=2):
        manifest, metrics = build_manifest(recipe, layout)
    for device, entry in manifest.get("devices", {}).items():  # an arm64 profile without repack-friendly quants
        if entry.get("warning"):
            print(f"warning: recipe {name}, device {device}: {entry['warning']}", file=sys.stderr, flush=True)
    # A manifest never lists a file that differs from it: the old one goes before any published file
    # changes, so a publish killed between linking and writing the new one leaves none (the rerun writes it).
    layout.manifest(name).unlink(missing_ok=True)
    for e in manifest["artifacts"]:  # base, passing quants, an MTP draft (files, or folders of shards)
        link_artifact(layout, name, e)
    keep = {e["file"] for e in manifest["artifacts"]}
    keep |= publish_maps(layout, name, manifest)  # a mix's tensor-type map beside its GGUF
    publish_slice(layout, name, manifest, _link)  # the device slice (not a `<name>-*` file)
    for stale in layout.art_dir(name).glob(f"{name}-*"):
        if stale.name in keep:  # else: quants removed from the recipe or now failing, split or no longer split
            continue
        if stale.suffix == ".gguf" and not stale.is_dir():
            stale.unlink()
        elif stale.is_dir() and not stale.is_symlink() and all(SHARD_RE.match(p.name) for p in stale.iterdir()):
            shutil.rmtree(stale)
        elif stale.name.endswith(MAP_SUFFIX) and not stale.is_dir():  # the map of a mix no longer published
            stale.unlink()
    write_json_atomic(layout.metrics(name), metrics)
    (layout.art_dir(name) / "report.png").unlink(missing_ok=True)  # the plot of earlier versions (now report.svg)
    measured = device_results(layout, name, manifest)  # `ggufpipe collect`: shown, not part of the manifest
    write_report(manifest, layout.report(name), layout.plot(name), measured)  # and the mixes' heat maps
    manifest = publish_modelfiles(recipe, manifest, layout.art_dir(name), layout)  # `publish.ollama`: Modelfile.<KEY>
    write_card(manifest, layout.card(name), measured)
    write_json_atomic(layout.manifest(name), manifest)  # last: the manifest marks the folder complete
    return manifest


MAP_SUFFIX = ".tensor-types.txt"


def publish_maps(layout: Layout, name: str, manifest: dict) -> set[str]:
    """Publish each published mix's solved map (``<name>-<KEY>.tensor-types.txt``) beside its GGUF, checked against
    the SHA256 the manifest names; returns their file names."""
    out = set()
    for e in manifest["artifacts"]:
        m = (e.get("mix") or {}).get("map")
        if not m:
            continue
        fname = plain_name(m["file"], "map file")
        src = layout.mix_map(name, artifact_key(name, e["file"]))
        if src.name != fname or sha256_file(src) != m["sha256"]:
            raise ArtifactError(src, f"{src}: not the map {fname} (SHA256 {m['sha256'][:16]}…) the quant was made with: "
                                     "re-run the solve and quantize stages")
        _link(src, layout.art_dir(name) / fname)
        out.add(fname)
    return out


def check_gates(manifest_path: str | Path, ok_path: str | Path) -> None:
    """Entry function: fail (one line per failed gate) when any quant was rejected; else touch ``ok_path``."""
    manifest = _load(Path(manifest_path))
    folder = Path(manifest_path).parent
    dc = manifest.get("device_check")
    sized = [(folder / dc["file"], dc["size_bytes"])] if dc else []  # the device slice, then every model file
    for e in manifest["artifacts"]:
        sized += [(folder / e["file"] / s["file"], s["size_bytes"]) for s in e["split"]["shards"]] if e.get("split") \
            else [(folder / e["file"], e["size_bytes"])]
        m = (e.get("mix") or {}).get("map")
        if m and (not (folder / m["file"]).is_file() or sha256_file(folder / m["file"]) != m["sha256"]):
            raise ArtifactError(folder / m["file"], f"{folder / m['file']} is missing or differs from {manifest_path}: "
                                                    "re-publish with `snakemake --forcerun publish`")
    for path, size in sized:
        if not path.is_file() or path.stat().st_size != size:
            raise ArtifactError(path, f"{path} is missing or differs from {manifest_path}: re-publish with "
                                      "`snakemake --forcerun publish`")
    msgs = gate_messages(manifest)
    if msgs:
        quants = sum(e.get("role") == "quant" for e in manifest["artifacts"])
        raise GateFailure(gate_checks(manifest), quants)
    from pipeline.fsutil import write_text_atomic

    write_text_atomic(ok_path, manifest["build_id"] + "\n")


def strip_volatile(manifest: dict) -> dict:
    """The manifest without its ``build`` section and the sensitivity cost's seconds and cache counts: equal for
    identical builds."""
    out = {k: v for k, v in manifest.items() if k != "build"}
    if "sensitivity" in out:
        out["sensitivity"] = strip_sensitivity_cost(out["sensitivity"])
    return out


def _gate(j) -> None:
    check_gates(j.input["manifest"], j.output["ok"])
    print(f"gates passed: {j.recipe.name}")


# publish reads its many inputs through the same layout they are named from (Layout.publish_inputs)
PUBLISH = Stage(
    "publish", "publish", order=90, log="publish", output="log", threads=2,
    run=lambda j: publish(j.recipe, j.layout), inputs=lambda r, wc, L: L.publish_inputs(r),
    outputs=lambda L: {"manifest": L.manifest("{name}"), "metrics": L.metrics("{name}"), "report": L.report("{name}"),
                       "plot": L.plot("{name}"), "card": L.card("{name}")},
    trigger=lambda r, wc, s: {"recipe": r.sha256},  # thresholds, eval sets, bench...: any recipe change re-publishes
    resources={"mem_mb": 1024, "disk_mb": lambda s: mem_mb(s.total, 1.0), "runtime": lambda s: int(30 + s.total / 5000)},
)
GATE = Stage(
    "gate", "gate", order=95, log="gate", output="tee", run=_gate,
    # the publish inputs too, so that a checkout holding only the git-tracked manifest rebuilds
    inputs=lambda r, wc, L: {**L.publish_inputs(r), "manifest": L.manifest(r.name)},
    outputs=lambda L: {"ok": L.gate_ok("{name}")}, resources={"mem_mb": 512, "disk_mb": 512, "runtime": 10},
)
