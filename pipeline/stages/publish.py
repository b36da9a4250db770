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
base and quant's memory is predicted per device (``devices``: pipeline/memory.py, publish_sections.fits_section);
a ``require: true`` device that no published quant fits fails :func:`check_gates` like a failed gate.

The manifest is deterministic: identical inputs give identical manifests apart from the ``build``
section (timestamp and build-box speed figures) and the sensitivity cost's seconds and cache counts
(:func:`strip_volatile`). ``build_id`` is derived from the inputs (recipe
file, source commit and file hashes, tool versions), so one set of inputs always names the same
version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import stat
import sys
import time
from pathlib import Path

from pipeline import tools_backend as tb
from pipeline.envs import converter_deviations
from pipeline.errors import ArtifactError, GateFailure, PipelineError
from pipeline.fsutil import atomic_output, hashing_ahead, sha256_file, write_json_atomic, write_text_atomic
from pipeline.gguf import general_metadata, read_facts
from pipeline.layout import Layout, plain_name
from pipeline.provenance import python_versions, source_files_digest
from pipeline.recipe import Recipe
from pipeline.records import (
    AwqRecord,
    BenchRecord,
    ConvertRecord,
    EvalBaseRecord,
    FetchRecord,
    load_json,
)
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.card import write_card
from pipeline.stages.evaluate import gate_checks, gate_messages
from pipeline.stages.hubfiles import publish_modelfiles
from pipeline.stages.publish_devices import SLICE_FILE, device_check_section, device_results, publish_slice
from pipeline.stages.publish_files import ModelFiles, model_files
from pipeline.stages.publish_sections import (
    CONFORMANCE_REJECTED,
    _calibration_inputs,
    _conformance_section,
    _draft_section,
    _mtp_section,
    _overrides_entry,
    _tokenizer_keys,
    artifact_key,
    check_mix_sources,
    devices_section,
    kv_costs_section,
    launch_section,
    sensitivity_section,
    strip_sensitivity_cost,
)
from pipeline.stages.report import write_report
from pipeline.stages.split import SHARD_RE, model_path

# The manifest schema; what each version added: docs/reproducibility.md, "Schema history".
SCHEMA_VERSION = 13


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
    if dst.exists() and os.path.samefile(src, dst):
        return
    with atomic_output(dst) as tmp:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)


def artifact_sources(layout: Layout, name: str, entry: dict) -> list[tuple[Path, Path, int]]:
    """``(built file in work/, published path, size)`` for every file of a manifest artifact: the GGUF, or
    each shard of a split file (from ``work/<name>/split/<name>-<KEY>/`` into ``artifacts/<name>/<name>-<KEY>/``)."""
    dest = layout.art_dir(name) / plain_name(entry["file"], "artifact file")
    s = entry.get("split")
    if not s:
        return [(layout.built(name, entry["file"]), dest, entry["size_bytes"])]
    src = layout.split_dir(name, artifact_key(name, entry["file"]))
    return [(src / sh["file"], dest / plain_name(sh["file"], "shard file"), sh["size_bytes"]) for sh in s["shards"]]


def _check_target(path: Path, folder: bool = False) -> None:
    """``path`` is one publish may replace: absent, anything but a real folder (renamed over: a link is replaced
    itself, never written through), or -- ``folder``, a split file's shard folder -- a real folder; one line naming it
    otherwise (replacing it would delete a folder publish did not make)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode) and not folder:
        raise PipelineError(f"{path}: is a folder where publish puts a file: move it away; nothing was changed")


def check_artifact_targets(layout: Layout, name: str, entry: dict) -> Path:
    """Every path :func:`link_artifact` will replace for ``entry``, checked before it changes any (one line naming the
    first it may not replace); returns the artifact's path."""
    dest = layout.check_art_dir(name) / plain_name(entry["file"], "artifact file")
    files = artifact_sources(layout, name, entry)
    _check_target(dest, folder=bool(entry.get("split")))
    if entry.get("split") and dest.is_dir() and not dest.is_symlink():
        for _src, dst, _size in files:
            _check_target(dst)
    return dest


def link_artifact(layout: Layout, name: str, entry: dict) -> Path:
    """Publish one manifest artifact into ``artifacts/<name>/`` by hard link: the GGUF, or the folder of a
    split file's shards (holding nothing else). A link found in the way is replaced, never followed."""
    dest = check_artifact_targets(layout, name, entry)
    files = artifact_sources(layout, name, entry)
    if entry.get("split"):
        if dest.is_symlink() or (dest.exists() and not dest.is_dir()):  # a dangling link too
            dest.unlink()
        dest.mkdir(parents=True, exist_ok=True)
        want = {d.name for _, d, _ in files}
        for p in dest.iterdir():  # shards of an earlier split (another max_size), leftovers
            if p.name not in want:
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for src, dst, _size in files:
        _link(src, dst)
    return dest


@dataclasses.dataclass
class _Sections:
    """The sections beyond the file entries (:func:`_recipe_sections`), their failures and volatile timings."""
    device_check: dict | None
    sensitivity: dict
    conformance: dict
    conformance_failures: list[dict]
    conformance_seconds: dict
    devices: dict
    device_failures: list[dict]
    draft: dict | None
    draft_failures: list[dict]
    draft_timings: dict
    launch: dict
    kv_costs: dict | None = None


def build_manifest(recipe: Recipe, layout: Layout) -> tuple[dict, dict]:
    """(manifest, metrics) from the stage records and the files; writes nothing."""
    name = recipe.name
    source, tools, converted = _source_and_tools(recipe, layout)
    base_path = layout.base_gguf(recipe)
    base = read_facts(base_path)
    if base.quant_type != recipe.base_key:
        raise PipelineError(f"{base_path}: general.file_type says {base.quant_type}, recipe asks for {recipe.base_key}")
    eval_sets, eval_base, eval_threads = _eval_sets(recipe, layout)
    metrics = {base.quant_type: {s: {"ppl": v["ppl"]} for s, v in eval_base.items()}} if eval_base else {}
    files = model_files(recipe, layout, base, converted, metrics)
    sections = _recipe_sections(recipe, layout, files)
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
        "conformance": sections.conformance,
        "artifacts": files.artifacts,
        "rejected": files.rejected,
        **_optional_sections(recipe, converted, files, sections),
    }
    manifest["build"] = _build_section(recipe, layout, tools, eval_threads, files, sections)
    return manifest, metrics


def _source_and_tools(recipe: Recipe, layout: Layout) -> tuple[dict, dict, ConvertRecord]:
    """The manifest's ``source`` (with the fetched files' digest) and ``tools``, and the convert record."""
    fetched = FetchRecord.read(layout.fetch_record(recipe.name))
    converted = ConvertRecord.read(layout.convert_record(recipe))
    source = dict(fetched.source)
    source["files_sha256"] = source_files_digest(fetched.files)
    if converted.get("convert_as"):
        source["convert_as"] = converted.convert_as
    tools = {**converted.toolchain, "python": python_by_env(recipe, layout, converted),
             "converter_unmet": converter_deviations(converted.get("python", {}))}
    for k in ("origin", "backend", "ngl"):  # the convert stage runs no llama.cpp tool: the backend is this run's
        tools.pop(k, None)
    tools.update(offload())
    return source, tools, converted


def python_by_env(recipe: Recipe, layout: Layout, converted: ConvertRecord) -> dict:
    """The manifest's ``tools.python``: per environment (pipeline/envs.py), the versions of the packages that touch
    the weights or the checks: the converter's from its record, AutoAWQ's from the AWQ record, the build's here."""
    out = {"build": python_versions(), "converter": converted.get("python", {})}
    if recipe.awq is not None and layout.awq_record(recipe.name).is_file():
        a = AwqRecord.read(layout.awq_record(recipe.name))
        out["autoawq"] = {"autoawq": a.autoawq, "torch": a.torch, "transformers": a.transformers}
    return out


def _eval_sets(recipe: Recipe, layout: Layout) -> tuple[list[dict], dict, dict]:
    """The manifest's ``eval_sets`` and ``eval_base`` from the eval-base records, and each set's threads."""
    eval_sets, eval_base, eval_threads = [], {}, {}
    for es in recipe.eval_sets:
        rec = EvalBaseRecord.read(layout.base_record(recipe.name, es.name))
        # ctx as eval-base ran it (ctx: long resolved), how a chat set was rendered
        eval_sets.append({"name": es.name, "text": rec.text, "text_sha256": rec.text_sha256, "ctx": rec.ctx,
                          "chunks": es.chunks, "scored_tokens": rec.scored_tokens, **es.describe_kv(),
                          **({"render": rec.render} if rec.has("render") else {}),
                          **({"ctx_long": {"max_ctx": es.max_ctx}} if es.long else {}),
                          **({"hub_dataset": es.hub_dataset} if es.hub_dataset else {})})
        eval_threads[es.name] = rec.threads  # follows --cores (results do not): build section
        eval_base[es.name] = {"ppl": rec.ppl, "ppl_stderr": rec.ppl_stderr}
    return eval_sets, eval_base, eval_threads


def _recipe_sections(recipe: Recipe, layout: Layout, files: ModelFiles) -> _Sections:
    """The tokenizer keys of every file and the sections beyond the file entries; a failed conformance moves every
    published file to ``rejected`` (the reference itself is not the HF model: no file of the recipe is published)."""
    _tokenizer_keys(recipe, layout, files.artifacts, files.rejected)
    device_check = device_check_section(recipe, layout, files.by_key, files.chunk_rows)
    sensitivity = sensitivity_section(recipe, layout)
    check_mix_sources(files.artifacts + files.rejected, sensitivity)
    conformance, conformance_failures, conformance_seconds = _conformance_section(recipe, layout)
    if conformance_failures:
        for e in files.artifacts:
            e["failures"] = [*e.get("failures", []), {"check": "conformance", "message": CONFORMANCE_REJECTED}]
        files.rejected, files.artifacts = files.artifacts + files.rejected, []
    devices, device_failures, _warnings = devices_section(recipe, layout, files.artifacts)
    paths = {artifact_key(recipe.name, e["file"]): model_path(e) for e in files.artifacts + files.rejected}
    draft, draft_failures, draft_timings = _draft_section(recipe, layout, paths) if recipe.draft else (None, [], {})
    launch = launch_section(recipe, layout, devices, files.artifacts, draft, draft_timings.get("speedup") or {})
    return _Sections(device_check, sensitivity, conformance, conformance_failures, conformance_seconds, devices,
                     device_failures, draft, draft_failures, draft_timings, launch,
                     kv_costs_section(recipe, layout, files.artifacts))


def _optional_sections(recipe: Recipe, converted: ConvertRecord, files: ModelFiles, s: _Sections) -> dict:
    """The manifest's sections that only some recipes have, in manifest order."""
    out: dict = {}
    if s.sensitivity:
        out["sensitivity"] = s.sensitivity
    if converted.get("vocab_overrides"):
        out["vocab_overrides"] = _overrides_entry(converted.vocab_overrides)
    if recipe.mtp != "keep":
        out["mtp"] = _mtp_section(recipe, converted.to_dict(), files.artifacts)
    if s.devices:
        out["devices"] = s.devices
    if s.kv_costs:
        out["kv_costs"] = s.kv_costs
    if s.device_check:
        out["device_check"] = s.device_check
    if s.draft is not None:
        out["draft"] = s.draft
    if s.draft is not None or s.conformance_failures or s.device_failures:
        out["failures"] = s.conformance_failures + s.draft_failures + s.device_failures
    return out


def _build_section(recipe: Recipe, layout: Layout, tools: dict, eval_threads: dict, files: ModelFiles,
                   s: _Sections) -> dict:
    """The manifest's ``build`` section: when, on what, and the build box's volatile figures."""
    bench = {}
    if recipe.bench:  # keyed by the published name (file, or folder of a split file)
        for key in [recipe.base_key] + [q.key for q in recipe.quants]:
            b = BenchRecord.read(layout.bench_record(recipe.name, key))
            bench[recipe.artifact_for(key)] = {k: getattr(b, k) for k in ("pp_tokens_per_s", "tg_tokens_per_s",
                                                                          "pp_tokens", "tg_tokens", "threads")}
    build = {"timestamp": timestamp(), "device": tb.device_description(tools["backend"])}
    for key, value in (("eval_threads", eval_threads), ("calibration_seconds", files.calib_seconds),
                       ("draft_decode_tokens_per_s", s.draft_timings.get("decode")),
                       ("draft_speedup", s.draft_timings.get("speedup")), ("conformance_seconds", s.conformance_seconds),
                       ("bench", bench), ("launch", s.launch)):
        if value:
            build[key] = value
    if bench:
        build["bench_label"] = "llama-bench on the build box (CPU), not device speed"
    return build


def publish(recipe: Recipe, layout: Layout) -> dict:
    """Entry function: publish passing quants; write metrics, report, plot, card, Modelfiles and manifest."""
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
    # Every path the links replace, and the maps' SHA256s, are checked before the first change: a refusal leaves
    # the folder as it was
    for e in manifest["artifacts"]:
        check_artifact_targets(layout, name, e)
    map_sources(layout, name, manifest)
    _check_target(layout.art_dir(name) / SLICE_FILE)
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
    """Publish each published mix's solved map beside its GGUF (:func:`map_sources`); returns their file names."""
    out = set()
    for src, fname in map_sources(layout, name, manifest):
        _link(src, layout.art_dir(name) / fname)
        out.add(fname)
    return out


def map_sources(layout: Layout, name: str, manifest: dict) -> list[tuple[Path, str]]:
    """``(solved map in work/, published file name)`` of each published mix's map (``<name>-<KEY>.tensor-types.txt``,
    published beside its GGUF), checked against the SHA256 the manifest names and its target path."""
    out = []
    for e in manifest["artifacts"]:
        m = (e.get("mix") or {}).get("map")
        if not m:
            continue
        fname = plain_name(m["file"], "map file")
        src = layout.mix_map(name, artifact_key(name, e["file"]))
        if src.name != fname or sha256_file(src) != m["sha256"]:
            raise ArtifactError(src, f"{src}: not the map {fname} (SHA256 {m['sha256'][:16]}…) the quant was made with: "
                                     "re-run the solve and quantize stages")
        _check_target(layout.art_dir(name) / fname)
        out.append((src, fname))
    return out


def check_gates(manifest_path: str | Path, ok_path: str | Path) -> None:
    """Entry function: fail (one line per failed gate) when any quant was rejected; else touch ``ok_path``."""
    manifest = load_json(manifest_path)
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
    # thresholds, eval sets, bench...: any recipe change re-publishes; so does a new manifest schema
    trigger=lambda r, wc, s: {"recipe": r.sha256, "schema": SCHEMA_VERSION},
    resources={"mem_mb": 1024, "disk_mb": lambda s: mem_mb(s.total, 1.0), "runtime": lambda s: int(30 + s.total / 5000)},
)
GATE = Stage(
    "gate", "gate", order=95, log="gate", output="tee", run=_gate,
    # the publish inputs too, so that a checkout holding only the git-tracked manifest rebuilds
    inputs=lambda r, wc, L: {**L.publish_inputs(r), "manifest": L.manifest(r.name)},
    outputs=lambda L: {"ok": L.gate_ok("{name}")}, resources={"mem_mb": 512, "disk_mb": 512, "runtime": 10},
)
