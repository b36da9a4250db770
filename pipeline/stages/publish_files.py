"""The publish stage's file entries (pipeline/stages/publish.py builds the manifest): the base, the MTP draft of
``mtp: separate`` and each quant as published (a split file as its folder of shards), each quant with its calibration,
gate metrics and the failures that keep it out of ``artifacts``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.gguf import file_type_name, read_facts, read_header
from pipeline.layout import Layout
from pipeline.recipe import Recipe
from pipeline.recipe.naming import label_of_key
from pipeline.records import AwqRecord, ConvertRecord, EvalRecord, ImatrixRecord, QuantRecord
from pipeline.stages.evaluate import failure_message, verdict
from pipeline.stages.mtp import MTP_KEYS, lost_heads, mtp_facts
from pipeline.stages.publish_sections import mix_entry, mtp_draft_entry
from pipeline.stages.split import read_shards


def _split_entry(recipe: Recipe, layout: Layout, key: str, entry: dict) -> dict:
    """The manifest entry of file ``key`` as published: unchanged when whole; for a split file the folder
    ``<name>-<KEY>`` with its shards (name, SHA256, size, tensors), the facts of the whole model (quant
    type, bpw, tensor and parameter counts, read from the whole file) and that file's SHA256 (``unsplit``:
    what eval and bench measured; kept in work/, not published)."""
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


def _cut127(s: str) -> str:
    return s.encode()[:127].decode("utf-8", "ignore")


def _calibration(recipe: Recipe, layout: Layout, q, gguf_path: Path, seconds: dict) -> tuple[dict, list[dict]]:
    """A quant's ``calibration`` entry (AWQ params, imatrix settings and SHA256s) and the failures
    of its cross-check against the GGUF's own ``quantize.imatrix.*`` keys."""
    out: dict = {}
    failures: list[dict] = []
    if q.awq:
        a = AwqRecord.read(layout.awq_record(recipe.name))
        out["awq"] = {**a.params, "calibration_sha256": a.calibration_sha256, "device": a.device,
                      "threads": a.get("threads"), "autoawq": a.autoawq,
                      **({"llmcompressor": a.llmcompressor, "kept_from_source": a.get("kept_from_source", [])}
                         if a.get("engine") == "llmcompressor" else {})}
        seconds["awq"] = a.seconds
    meta = read_header(gguf_path).metadata
    keys = {k: meta[k] for k in IMATRIX_KEYS if k in meta}
    if q.imatrix:
        m = ImatrixRecord.read(layout.imatrix_record(recipe.name, q.base))
        imx_file = layout.imatrix(recipe.name, q.base)
        out["imatrix"] = {**m.params, "base": q.base, "file": imx_file.name, "sha256": m.sha256,
                          "calibration_sha256": m.calibration_sha256, "entries": m.facts["entries"],
                          "threads": m.get("threads"), **({"experts": m.experts} if m.has("experts") else {}),
                          **({"render": m.render} if m.has("render") else {})}
        seconds[f"imatrix_{q.base}"] = m.seconds
        # llama-quantize copies the file name and the first dataset cut at 127 bytes (tools/quantize/quantize.cpp:513-522)
        want = {"quantize.imatrix.file": _cut127(imx_file.name), "quantize.imatrix.dataset": _cut127(m.params["calibration"]),
                "quantize.imatrix.entries_count": m.facts["entries"],
                "quantize.imatrix.chunks_count": m.facts["chunk_count"]}
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
KV_METRICS = ("ppl_ratio", "kld_mean", "kld_p99", "same_top_p")  # what the thresholds read (evaluate.METRICS)


@dataclasses.dataclass
class ModelFiles:
    """The manifest's model files (:func:`model_files`) and what later sections need of them."""
    artifacts: list[dict]
    rejected: list[dict]
    by_key: dict[str, dict]  # the entries a device can check on the slice
    chunk_rows: dict[str, list] = dataclasses.field(default_factory=dict)  # each quant's, first eval set
    calib_seconds: dict = dataclasses.field(default_factory=dict)


def model_files(recipe: Recipe, layout: Layout, base, converted: ConvertRecord, metrics: dict) -> ModelFiles:
    """The base (and the MTP draft of ``mtp: separate``) and every quant, published or rejected with its failures;
    each quant's figures go into ``metrics``."""
    base_mtp = mtp_facts(layout.base_gguf(recipe))
    first = {**base.as_dict(), "role": "base"}
    if base_mtp["tensors"]:
        first["mtp"] = {k: base_mtp[k] for k in MTP_KEYS}
    first = _split_entry(recipe, layout, base.quant_type, first)
    converted_mode = converted.get("mtp", {}).get("mode", "keep")
    if converted_mode != recipe.mtp:
        raise PipelineError(f"{layout.convert_record(recipe)}: converted with mtp: {converted_mode}, the recipe asks for "
                            f"mtp: {recipe.mtp}: re-run the convert stage")
    files = ModelFiles(artifacts=[first], rejected=[], by_key={base.quant_type: first})
    if recipe.mtp == "separate":
        files.artifacts.append(_split_entry(recipe, layout, recipe.mtp_key, mtp_draft_entry(recipe, layout)))
    for q in recipe.quants:
        entry, failures = _quant_entry(recipe, layout, q, base.quant_type, base_mtp, files, metrics)
        entry = _split_entry(recipe, layout, q.key, entry)
        files.by_key[q.key] = entry
        if failures:
            entry["failures"] = failures
            files.rejected.append(entry)
        else:
            files.artifacts.append(entry)
    return files


def _quant_entry(recipe: Recipe, layout: Layout, q, base_type: str, base_mtp: dict, files: ModelFiles,
                 metrics: dict) -> tuple[dict, list[dict]]:
    """A quant's manifest entry (whole file) and its failures: calibration, gates, MTP heads."""
    name = recipe.name
    work_path = layout.quant(recipe, q.key)
    rec = QuantRecord.read(layout.quant_record(name, q.key))
    facts = read_facts(work_path)
    facts.file = recipe.file_for(q.key)
    if facts.quant_type != q.type:
        raise PipelineError(f"{work_path}: general.file_type says {facts.quant_type}, recipe asks for {q.type}")
    entry = {**facts.as_dict(), "role": "quant", "requested": rec.quant}
    for k in ("tensor_types", "tensor_types_file"):  # the per-type histogram, what differs from the recipe, bytes
        if rec.has(k):
            entry[k] = rec.get(k)
    if q.mix:  # the solve it was made from and its map (published beside the GGUF)
        if not rec.has("mix"):
            raise PipelineError(f"{layout.quant_record(name, q.key)}: no mix layout: re-run the quantize stage")
        entry["mix"] = mix_entry(rec.to_dict())
    calibration, failures = _calibration(recipe, layout, q, work_path, files.calib_seconds)
    if calibration:
        entry["calibration"] = calibration
    per_set, thresholds = _gates(recipe, layout, q, files.chunk_rows, failures)
    if base_mtp["tensors"]:
        q_mtp = mtp_facts(work_path)
        entry["mtp"] = {k: q_mtp[k] for k in MTP_KEYS}
        lost = lost_heads(base_mtp, q_mtp)
        if lost:
            failures.append({"check": "mtp", "lost": lost, "message": (
                f"MTP heads lost: recipe {name}, quant {q.key} lacks {len(lost)} of the {base_mtp['tensors']} "
                f"nextn tensors of the {base_type} file (first: {lost[0]})")})
    if recipe.eval_sets:
        entry["metrics"] = per_set
        entry["gate"] = {"passed": not failures, "thresholds": thresholds}
        metrics[q.key] = {s: {**{k: v[k] for k in ("ppl_q", "ppl_ratio", "kld_mean", "kld_p99", "same_top_p")},
                              "gate_passed": not failures, **({"kv": v["kv"]} if "kv" in v else {})}
                          for s, v in per_set.items()}
    return entry, failures


def _gates(recipe: Recipe, layout: Layout, q, chunk_rows: dict, failures: list[dict]) -> tuple[dict, dict]:
    """A quant's gate metrics and thresholds per eval set from its eval records; each failed gate is appended to
    ``failures``, the first set's chunk rows (the device slice's values) put in ``chunk_rows``."""
    per_set, thresholds = {}, {}
    for es in recipe.eval_sets:
        ev = EvalRecord.read(layout.eval_record(recipe.name, es.name, q.key))
        if es is recipe.first_eval_set:  # the device slice's values: the running statistics after its chunks
            chunk_rows[q.key] = ev.get("chunk_rows") or []
        per_set[es.name] = {k: ev.metrics[k] for k in GATE_METRICS}
        thresholds[es.name] = recipe.thresholds(q.key, es.name)
        if es.kv_extra:  # the same file with quantized caches: not a gate of the file, the choice of kv_type auto
            if not ev.has("kv") or set(ev.kv) != set(es.kv_extra):
                raise PipelineError(f"{layout.eval_record(recipe.name, es.name, q.key)}: no KV runs for "
                                    f"{', '.join(es.kv_extra)}: re-run the eval stage")
            per_set[es.name]["kv"] = {t: {**{k: ev.kv[t][k] for k in KV_METRICS},
                                          "inside": not verdict(ev.kv[t], thresholds[es.name])} for t in es.kv_extra}
        failures += [{**f, "eval_set": es.name, "check": "gate",
                      "message": failure_message(recipe.name, q.key, es.name, f)}
                     for f in verdict(ev.metrics, thresholds[es.name])]
    return per_set, thresholds
