"""The manifest's sections beyond the file entries (pipeline/stages/publish.py builds the manifest): the conformance
verdict and the tokenizer keys every file carries, vocabulary overrides, the MTP heads and their draft, the
draft model's pairs with their deployment lines, and the measured mixes (each mix's solve, the sensitivity section)."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

from pipeline.bounds import below, finite
from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.gguf import read_facts, tokenizer_sha256
from pipeline.launch import launch
from pipeline.layout import Layout
from pipeline.memory import ModelShape, components, predict_memory, repack_types
from pipeline.recipe import Recipe
from pipeline.recipe.model import MTP_DRAFT_KEY
from pipeline.records import (
    AcceptanceRecord,
    AgreementRecord,
    ConformanceRecord,
    MtpConvertRecord,
    SensitivityRecord,
    SpeedupRecord,
    VocabRecord,
    load_json,
)
from pipeline.stages.draft import deployment_line, spec_args
from pipeline.stages.mtp import MTP_KEYS, mtp_facts
from pipeline.stages.split import model_path


def artifact_key(name: str, artifact: str) -> str:
    """``<KEY>`` of ``<name>-<KEY>.gguf`` or of the split folder ``<name>-<KEY>``."""
    return artifact.removeprefix(f"{name}-").removesuffix(".gguf")


CONFORMANCE_REJECTED = "not published: the base GGUF failed conformance (see the manifest's conformance section)"


def _conformance_section(recipe: Recipe, layout: Layout) -> tuple[dict, list[dict], dict]:
    """(the manifest's ``conformance`` section, recipe-level failures, volatile seconds) from the stage record."""
    if not recipe.conformance.enabled:
        return {"skipped": "the recipe opts out (conformance: false)"}, [], {}
    rec = ConformanceRecord.read(layout.conformance_record(recipe.name)).to_dict()
    # the verdict, each check's numbers and the thresholds; the diffs and renders stay in the record
    section = {k: rec[k] for k in ("passed", "checks", "thresholds", "chunks", "threads", "warnings") if k in rec}
    failures = [{"check": "conformance", "message": m} for m in rec.get("failures", [])]
    if not rec.get("passed") and not failures:
        failures = [{"check": "conformance", "message": f"conformance: recipe {recipe.name}: failed "
                                                       f"(see {layout.conformance_record(recipe.name)})"}]
    return section, failures, rec.get("seconds", {})


def _tokenizer_keys(recipe: Recipe, layout: Layout, artifacts: list[dict], rejected: list[dict]) -> None:
    """Each model file's ``tokenizer_sha256`` (its tokenizer.* keys, chat templates included, byte for byte); a
    file whose keys differ from the base's is rejected."""
    base = tokenizer_sha256(layout.base_gguf(recipe))
    for entry in list(artifacts) + rejected:
        path = layout.built(recipe.name, entry["file"] if not entry.get("split") else entry["file"] + ".gguf")
        if entry.get("role") == "mtp-draft":
            path = layout.mtp_gguf(recipe)
        entry["tokenizer_sha256"] = digest = tokenizer_sha256(path)
        if digest != base and entry in artifacts and entry.get("role") != "mtp-draft":
            entry["failures"] = [{"check": "tokenizer_keys", "message": (
                f"tokenizer keys differ: recipe {recipe.name}, {entry['file']} does not carry the "
                f"{recipe.base_key} file's tokenizer.* keys byte for byte")}]
            artifacts.remove(entry)
            rejected.append(entry)


def _overrides_entry(overrides: dict) -> dict:
    """The fix-path keys as the manifest records them: the chat template by SHA256 and size."""
    out = {k: v for k, v in overrides.items() if k != "chat_template"}
    if "chat_template" in overrides:
        text = overrides["chat_template"].encode("utf-8")
        out["chat_template"] = {"sha256": hashlib.sha256(text).hexdigest(), "bytes": len(text)}
    return out


def _calibration_inputs(recipe: Recipe) -> dict:
    out = {}
    for key, cfg in (("awq", recipe.awq), ("imatrix", recipe.imatrix)):
        if cfg is not None and any(getattr(q, key) for q in recipe.quants):
            out[key] = {**cfg.describe(), "calibration_sha256": sha256_file(cfg.calibration)}
    maps = {q.key: sha256_file(q.tensor_types_file) for q in recipe.quants if q.tensor_types_file}
    if maps:  # tensor-type map files (quants[].tensor_types_file): only recipes with maps, build_ids unchanged
        out["tensor_types_files"] = maps
    if recipe.sensitivity is not None and any(q.mix for q in recipe.quants):  # the text the mixes are solved from
        out["sensitivity"] = recipe.sensitivity.describe()
    return out


def mtp_draft_entry(recipe: Recipe, layout: Layout) -> dict:
    """The artifact entry of the MTP-head draft exported by ``mtp: separate``."""
    path = layout.mtp_gguf(recipe)
    rec = MtpConvertRecord.read(layout.mtp_record(recipe))
    facts = read_facts(path)
    if facts.quant_type != recipe.base_key:
        raise PipelineError(f"{path}: general.file_type says {facts.quant_type}, recipe asks for {recipe.base_key}")
    heads = mtp_facts(path)
    if not heads["tensors"]:
        raise PipelineError(f"{path}: holds no nextn (MTP) tensors: re-run the convert-mtp stage")
    return {**facts.as_dict(), "role": "mtp-draft", "converter_args": rec.converter_args,
            "mtp": {k: heads[k] for k in MTP_KEYS}}


def _mtp_section(recipe: Recipe, converted: dict, artifacts: list[dict]) -> dict:
    """The manifest's ``mtp`` section (recipe ``mtp: strip`` or ``separate``): what was done to the
    multi-token-prediction heads on purpose, and how to use an exported MTP draft."""
    out: dict = {"mode": recipe.mtp, "converter_args": converted["mtp"]["converter_args"]}
    if recipe.mtp == "strip":
        out["note"] = "multi-token-prediction heads left out of every file on purpose (recipe mtp: strip)"
    else:
        out["note"] = ("multi-token-prediction heads left out of the model files and published alone as a draft "
                       "for llama.cpp's --spec-type draft-mtp (recipe mtp: separate)")
        draft = next(e for e in artifacts if e["role"] == "mtp-draft")
        out["draft_file"] = draft["file"]
        out["deploy"] = [mtp_deployment_line(model_path(e), model_path(draft)) for e in artifacts if e["role"] != "mtp-draft"]
    return out


def mtp_deployment_line(main_file: str, mtp_file: str) -> str:
    return f"llama-server -m {main_file} -md {mtp_file} --spec-type draft-mtp"


def _draft_section(recipe: Recipe, layout: Layout, paths: dict[str, str] | None = None) -> tuple[dict, list[dict], dict]:
    """The manifest's ``draft`` section: files (or ``mtp: true``: the model's own MTP heads), the vocab verdict and
    measured acceptance per pair, top-1 agreement, deployment lines; plus recipe-level failures and the volatile
    figures (``decode``: the acceptance runs' decode speeds, ``speedup``: each pair's measured speed-up and the
    deployment line it allows). ``paths``:
    what llama.cpp is given for each main key (a split file's first shard; default: the file name)."""
    d = recipe.draft
    info, draft_file, published, why = _draft_files(recipe, layout)
    failures: list[dict] = []
    timings: dict = {"decode": {}, "speedup": {}}
    info["pairs"] = [_draft_pair(recipe, layout, mkey, dkey, (draft_file, published, why), paths or {}, failures,
                                 timings) for mkey, dkey in d.pairs]
    if recipe.eval_sets and not d.mtp:
        info["top1_agreement"] = {draft_file[k]: AgreementRecord.read(layout.agreement_record(recipe.name, k)).to_dict()
                                  for k in sorted({dk for _, dk in d.pairs})}
    if d.speedup is None:
        info["speedup"] = "not measured (draft.speedup: false): the deployment lines may run slower than without"
    return info, failures, timings


def _draft_files(recipe: Recipe, layout: Layout) -> tuple[dict, dict, set[str] | None, dict[str, str]]:
    """The draft section's head (what drafts: the MTP heads, a draft recipe's files, or a GGUF), the draft file per
    draft key, and for a draft recipe the files it published (else None) and why the others were not."""
    d = recipe.draft
    info: dict = {"eval_text": d.eval_text.name, "n_max": list(d.n_max), "min_acceptance": d.min_acceptance}
    published, why = None, {}
    if d.mtp:  # the model's own MTP heads: inside each main file (mtp: keep) or the mtp: separate export
        info["mtp"] = True
        info["spec_type"] = d.spec_type
        sidecar = recipe.artifact_for(recipe.mtp_key) if recipe.mtp == "separate" else None
        draft_file = {MTP_DRAFT_KEY: sidecar}
    elif d.source is not None:
        dm = load_json(layout.manifest(recipe.draft_name))  # the draft recipe's manifest (not a stage record)
        info.update(recipe=recipe.draft_name, folder=f"../{recipe.draft_name}", build_id=dm["build_id"],
                    source=dm["source"], files=[{k: a[k] for k in ("file", "quant_type", "sha256", "size_bytes")}
                                                for a in dm["artifacts"]])
        draft_file = {q.key: recipe.draft_recipe().file_for(q.key) for q in d.quants}
        published = {a["file"] for a in dm["artifacts"]}
        why = {r["file"]: (r.get("failures") or [{}])[0].get("message", "rejected") for r in dm.get("rejected", [])}
    else:
        info["gguf"] = {"file": d.gguf.name, "sha256": sha256_file(d.gguf), "size_bytes": d.gguf.stat().st_size}
        draft_file = {"gguf": d.gguf.name}
    return info, draft_file, published, why


def _draft_pair(recipe: Recipe, layout: Layout, mkey: str, dkey: str, drafts: tuple, paths: dict[str, str],
                failures: list[dict], timings: dict) -> dict:
    """One pair of the draft section from its vocab and acceptance records; its failures are appended to
    ``failures``, its build-box decode speeds put in ``timings``. ``drafts``: :func:`_draft_files`' last three."""
    d, name = recipe.draft, recipe.name
    draft_file, published, why = drafts
    main_file = recipe.artifact_for(mkey)
    v = VocabRecord.read(layout.vocab_record(name, mkey, dkey))
    a = AcceptanceRecord.read(layout.spec_record(name, mkey, dkey)).to_dict()
    dfile = draft_file[dkey] or main_file  # MTP heads inside the main file: the file drafts for itself
    pair = {"main": main_file, "draft": dfile, "compatible": v.compatible, "rule": v.rule, "reason": v.reason,
            "diff": v.diff, "warnings": v.warnings}
    label = f"{main_file} + {dfile}"
    if published is not None and draft_file[dkey] not in published:
        # a deployment line never names a file that was not published (e.g. the draft failed conformance)
        failures.append({"check": "draft_published", "message": (
            f"draft not published: recipe {name}, {label}: {draft_file[dkey]} was not published by recipe "
            f"{recipe.draft_name} ({why.get(draft_file[dkey], 'not in its manifest')})")})
        pair["published"] = False
        return pair
    if not v.compatible:
        failures.append({"check": "draft_vocab", "message": v.message})
    else:
        timings["decode"][label] = a.pop("build_box_decode_tokens_per_s", {})
        pair["acceptance"] = a
        if d.speedup is None:  # unmeasured: the line of the estimated best length, said to be unmeasured
            pair["deploy"] = deployment_line(paths.get(mkey, main_file), draft_file[dkey], a["best_n_max"],
                                             a.get("spec_type", "draft-simple"))
        else:
            timings["speedup"][label] = _speedup(recipe, layout, mkey, dkey, paths.get(mkey, main_file),
                                                 draft_file[dkey], label, failures)
        if d.min_acceptance is not None and below(a.get("acceptance_rate"), d.min_acceptance):
            failures.append({"check": "draft_acceptance", "message": (
                f"draft acceptance too low: recipe {name}, {label}: acceptance {_rate(a.get('acceptance_rate'))} "
                f"< min_acceptance {d.min_acceptance:g} (n_max {a.get('best_n_max')})")})
    return pair


def _speedup(recipe: Recipe, layout: Layout, mkey: str, dkey: str, main_path: str, draft_file: str | None, label: str,
             failures: list[dict]) -> dict:
    """A pair's measured speed-up (pipeline/stages/speedup.py) with its decision: ``deploy``, the line at the chosen
    draft length when the whole interval is above 1, else None (the ``verdict`` says why). Volatile: the decision
    follows a clock, so it lives in the manifest's ``build`` section, outside ``build_id``."""
    d = recipe.draft
    rec = SpeedupRecord.read(layout.speedup_record(recipe.name, mkey, dkey)).to_dict()
    if "skipped" in rec:
        return rec
    line = " ".join([deployment_line(main_path, draft_file, rec["best_n_max"], d.spec_type), *rec.get("best_flags", [])])
    rec["deploy"] = line if rec["helps"] else None
    if d.min_speedup is not None and below(rec.get("speedup"), d.min_speedup):
        lo, hi = (rec.get("interval") or [None, None])[:2]
        failures.append({"check": "draft_speedup", "message": (
            f"draft speed-up too low: recipe {recipe.name}, {label}: {_rate(rec.get('speedup'), '.2f')}x "
            f"({_rate(lo, '.2f')}-{_rate(hi, '.2f')}) < min_speedup {d.min_speedup:g} (n_max {rec.get('best_n_max')}, "
            f"{rec.get('box')})")})
    return rec


def _rate(v, fmt: str = ".4f") -> str:
    """A measured rate in a failure line; one that is not a finite number (it fails the gate) as it is."""
    return format(v, fmt) if finite(v) else repr(v)




# --------------------------------------------------------------------------- measured mixes (docs/mixes.md)

# The sensitivity cost figures that depend on the build box or on what an earlier build left in the measurement cache:
# kept out of the rebuild comparison (strip_volatile); `search`, `measurements`, `exhaustive_runs`, `skipped` and
# `duplicates` follow from the inputs.
SENSITIVITY_VOLATILE = ("seconds", "quantize_seconds", "eval_seconds", "screen_seconds", "cpu_seconds", "runs", "reused",
                        "screens", "imatrix_passes", "fisher_passes", "fisher_seconds")
SENSITIVITY_COST = ("search", "measurements", "exhaustive_runs", "runs", "reused", "skipped", "duplicates", "screens",
                    "imatrix_passes", "fisher_passes", "seconds", "quantize_seconds", "eval_seconds", "screen_seconds",
                    "fisher_seconds", "cpu_seconds")


def mix_entry(rec: dict) -> dict:
    """A mix quant's ``mix`` entry from its quantize record (``mix``: the solve's layout record; ``tensor_types_file``:
    the map llama-quantize was given): solver, goal (the budget with its bytes, or the target), candidates, floor,
    the chosen type per group, the prediction, the sensitivity it was solved from and the map (published beside the
    GGUF)."""
    lay, tf = rec["mix"], rec.get("tensor_types_file") or {}
    if tf.get("sha256") != lay["map_sha256"]:
        raise PipelineError(f"quant {lay['label']}: quantized with map SHA256 {str(tf.get('sha256'))[:16]}…, the solve "
                            f"recorded {lay['map_sha256'][:16]}…: re-run the quantize stage")
    goal = {"budget": lay["budget"], "bytes": lay["bytes"]} if "budget" in lay else {"target": lay["target"]}
    s = lay["sensitivity"]
    return {"solver": lay["solver"], "flavour": lay["flavour"], "goal": goal, "candidates": lay["candidates"],
            "floor": lay["floor"], "choice": lay["choice"],
            "predicted": {k: lay["predicted"][k] for k in ("bytes", "bpw", "kld_mean")},
            "sensitivity": {k: s[k] for k in ("sha256", "text", "text_sha256", "ctx", "chunks")},
            "map": {"file": tf["file"], "sha256": tf["sha256"]}}


def _smallest(group: dict, candidates: list[str]) -> str:
    """The candidate that makes the group smallest (first in the ladder on a tie)."""
    return min(candidates, key=lambda c: (group["bytes"][c], candidates.index(c)))


def sensitivity_section(recipe: Recipe, layout: Layout) -> dict:
    """The manifest's ``sensitivity`` section: per flavour what the mixes were solved from (text, settings, the
    floor's KLD, each group's mean KLD per candidate) and what measuring it cost (``cost``: its seconds and cache
    counts are volatile). Empty for recipes without mixes."""
    out = {}
    for flavour in recipe.mix_flavours:
        path = layout.sensitivity(recipe.name, flavour)
        # the measurement file stays a dict (solve and publish read parts of it); the record is typed
        data, rec = load_json(path), SensitivityRecord.read(layout.sensitivity_record(recipe.name, flavour))
        digest = sha256_file(path)
        if rec.get("sensitivity_sha256") != digest:
            raise PipelineError(f"{layout.sensitivity_record(recipe.name, flavour)} is the record of another "
                                f"{path.name}: re-run the sensitivity stage")
        out[flavour] = {
            "sha256": digest, **{k: data[k] for k in ("text", "text_sha256", "ctx", "chunks", "floor", "candidates",
                                                      "bands")},
            "search": data.get("search", "exhaustive"),
            **({"segments": data["segments"]} if "segments" in data else {}),
            **({"probes": data["probes"]} if "probes" in data else {}),
            "floor_kld_mean": data["floor_kld"]["kld_mean"],
            "groups": [{"group": g["group"], "role": g["role"], "band": g["band"], "bytes": g["bytes"],
                        "kld_mean": {c: g["kld"][c]["kld_mean"] for c in data["candidates"] if c in g["kld"]}}
                       for g in data["groups"]],
            "cost": {k: rec.get(k) for k in SENSITIVITY_COST if rec.has(k)},
        }
    return out


def check_mix_sources(artifacts: list[dict], sensitivity: dict) -> None:
    """Every mix was solved from the sensitivity file the manifest lists for its flavour."""
    for e in artifacts:
        m = e.get("mix")
        if m and (sensitivity.get(m["flavour"]) or {}).get("sha256") != m["sensitivity"]["sha256"]:
            raise PipelineError(f"{e['file']}: solved from sensitivity SHA256 {m['sensitivity']['sha256'][:16]}…, not "
                                f"the {m['flavour']} measurement published: re-run the solve stage")


def strip_sensitivity_cost(sensitivity: dict) -> dict:
    """The ``sensitivity`` section without the volatile cost figures."""
    return {f: {**s, "cost": {k: v for k, v in s.get("cost", {}).items() if k not in SENSITIVITY_VOLATILE}}
            for f, s in sensitivity.items()}


# --------------------------------------------------------------------------- target devices (docs/devices.md)

MIB = 1 << 20

def fits_section(name: str, devices, files: list[tuple[str, str, int, Path]], predict) -> tuple[dict, list[dict], list[str]]:
    """The manifest's ``devices`` section (recipe ``devices:``), the failures of devices with ``require: true`` that no
    published quant fits, and the warnings (printed by the publish stage). ``files``: ``(KEY, role, size_bytes, whole
    GGUF)`` of each published model file (base, quants); ``predict(path, device)``: :func:`predict_memory`'s dict.
    A device's ``best`` is the largest quant (by file bytes) that fits; per file: the predicted ``total``, ``fits``,
    ``margin_bytes`` (memory minus total, negative when it does not fit)."""
    section: dict = {}
    failures: list[dict] = []
    warnings: list[str] = []
    quants = [(key, size) for key, role, size, _ in files if role == "quant"]
    for d in devices:
        preds = {key: predict(path, d) for key, _, _, path in files}
        entry = {**d.describe(), "files": {k: {"total": p["total"], "fits": p["total"] <= d.memory_bytes,
                                               "margin_bytes": d.memory_bytes - p["total"]} for k, p in preds.items()}}
        fitting = [(size, -i, key) for i, (key, size) in enumerate(quants) if entry["files"][key]["fits"]]
        entry["best"] = max(fitting)[2] if fitting else None
        if d.arch.startswith("arm64") and quants and not any(preds[k]["details"]["repacked_tensors"] for k, _ in quants):
            entry["warning"] = (f"no published quant has a tensor that ggml-cpu repacks on {d.arch} (its interleaved "
                                f"CPU_REPACK matmul kernels): the repack-friendly types there are "
                                f"{', '.join(repack_types(d.arch))} (e.g. quants Q4_0, IQ4_NL, Q4_K_M, Q8_0)")
            warnings.append(f"recipe {name}, device {d.name}: {entry['warning']}")
        if d.require and entry["best"] is None:
            where = (f"device does not fit: recipe {name}, device {d.name} ({d.memory}, {d.memory_bytes / MIB:.1f} MiB; "
                     f"ctx {d.ctx}, KV {d.kv_type}, {d.arch}): ")
            if quants:
                key = min(quants, key=lambda q: (preds[q[0]]["total"], q[1]))[0]
                need = preds[key]["total"]
                why = (f"no published quant fits; the smallest, {key}, needs {need / MIB:.1f} MiB "
                       f"({(need - d.memory_bytes) / MIB:.1f} MiB more)")
            else:
                why = "no quant was published"
            failures.append({"check": "device", "device": d.name, "message": where + why})
        section[d.name] = entry
    return section, failures, warnings


# KV cache types by bytes per element, smallest first (ggml block sizes: q4_0 18 bytes / 32, q8_0 34 / 32, ...)
KV_BY_SIZE = ("q4_0", "iq4_nl", "q4_1", "q5_0", "q5_1", "q8_0", "f16", "bf16", "f32")


def kv_eval_set(recipe: Recipe):
    """The first eval set with ``kv_types``: the one KV choices and costs read; None without one."""
    return next((e for e in recipe.eval_sets if e.kv_types), None)


def kv_choice(recipe: Recipe, artifacts: list[dict]) -> tuple[str, str] | None:
    """``kv_type: auto``'s type: the smallest of the first eval set with ``kv_types`` whose runs are inside the
    thresholds of every published quant (f16, the gates' own cache, when none is), and why; None without such a set."""
    es = kv_eval_set(recipe)
    if es is None:
        return None
    quants = [e for e in artifacts if e.get("role") == "quant"]
    for t in sorted(es.kv_extra, key=KV_BY_SIZE.index):
        if all(e["metrics"][es.name]["kv"][t]["inside"] for e in quants):
            return t, f"the smallest of {', '.join(es.kv_types)} inside every published quant's thresholds on {es.name}"
    return "f16", f"no quantized cache of {', '.join(es.kv_extra)} is inside every published quant's thresholds"


def resolved_devices(recipe: Recipe, artifacts: list[dict]) -> tuple:
    """The recipe's devices with ``kv_type: auto`` replaced by :func:`kv_choice`'s type."""
    choice = kv_choice(recipe, artifacts)
    return tuple(dataclasses.replace(d, kv_type=choice[0], kv_auto=choice[1]) if d.kv_type == "auto" else d
                 for d in recipe.devices)


def kv_costs_section(recipe: Recipe, layout: Layout, artifacts: list[dict]) -> dict | None:
    """The manifest's ``kv_costs``: per published quant and KV type of the first eval set with ``kv_types``, the file
    bytes plus the KV cache's at the first device's context (the eval set's without devices) against its mean KLD
    and same top p, and whether it is inside the quant's thresholds (f16: the gate itself). None without kv_types."""
    es = kv_eval_set(recipe)
    if es is None:
        return None
    ctx = recipe.devices[0].ctx if recipe.devices else es.ctx
    rows = []
    for e in artifacts:
        if e.get("role") != "quant":
            continue
        shape = ModelShape.from_gguf(layout.gguf(recipe.name, artifact_key(recipe.name, e["file"])))
        m = e["metrics"][es.name]
        for t in es.kv_types:
            got = m if t == "f16" else m["kv"][t]
            rows.append({"file": e["file"], "kv_type": t, "file_bytes": e["size_bytes"],
                         "kv_bytes": components(shape, ctx, kv_type=t)["kv"], "kld_mean": got["kld_mean"],
                         "same_top_p": got["same_top_p"], "inside": True if t == "f16" else got["inside"]})
    return {"eval_set": es.name, "ctx": ctx, "device": recipe.devices[0].name if recipe.devices else None,
            "rows": rows}


def devices_section(recipe: Recipe, layout: Layout, artifacts: list[dict]) -> tuple[dict, list[dict], list[str]]:
    """:func:`fits_section` of the published base and quants (a split file by its whole GGUF in work/); empty for a
    recipe without ``devices:``."""
    if not recipe.devices:
        return {}, [], []

    files = []
    for e in artifacts:
        if e.get("role") in ("base", "quant"):
            key = artifact_key(recipe.name, e["file"])
            files.append((key, e["role"], e["size_bytes"], layout.gguf(recipe.name, key)))
    return fits_section(recipe.name, resolved_devices(recipe, artifacts), files,
                        lambda path, d: predict_memory(path, d.ctx, kv_type=d.kv_type, arch=d.arch))


def launch_section(recipe: Recipe, layout: Layout, devices: dict, artifacts: list[dict], draft: dict | None,
                   speed: dict) -> dict:
    """The manifest's ``build.launch``: per device a ``llama-server`` line for the largest published quant that fits
    it (pipeline/launch.py), with the draft of that main file whose measured speed-up helps (``speed``: the
    draft section's volatile figures). Volatile: the draft flags follow a clock."""
    if not recipe.devices:
        return {}
    quants = sorted((e for e in artifacts if e.get("role") == "quant"), key=lambda e: -e["size_bytes"])
    keyed = [(artifact_key(recipe.name, e["file"]), e) for e in quants]
    drafts: dict[str, dict] = {}
    for (mkey, dkey), p in zip(recipe.draft.pairs if draft else (), (draft or {}).get("pairs", ()), strict=True):
        sp = speed.get(f"{p['main']} + {p['draft']}") or {}
        if not sp.get("helps") or (p["main"] in drafts and drafts[p["main"]]["speedup"] >= sp["speedup"]):
            continue
        dpath = None if p["draft"] == p["main"] else layout.draft_gguf(recipe, dkey, mkey)
        drafts[p["main"]] = {"file": p["draft"], "path": dpath, "label": f"{p['main']} + {p['draft']}",
                             "speedup": sp["speedup"], "spec": [*spec_args(
                                 "", None if dpath is None else p["draft"], recipe.draft.spec_type, sp["best_n_max"])[2:],
                                 *sp.get("best_flags", [])]}
    out = {}
    for d in resolved_devices(recipe, artifacts):
        fits = devices[d.name]["files"]
        cands = [(model_path(e), layout.gguf(recipe.name, key)) for key, e in keyed if fits[key]["fits"]]
        out[d.name] = launch(d, cands, {model_path(e): drafts[e["file"]] for _, e in keyed if e["file"] in drafts})
    return out
