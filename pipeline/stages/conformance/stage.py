"""The stage: run the five checks, the record, the entry function and ``python -m pipeline.stages.conformance``. (see pipeline/stages/conformance/__init__.py)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.gguf import read_header
from pipeline.provenance import python_versions
from pipeline.recipe import EvalSet
from pipeline.records import ConformanceRecord, EvalBaseRecord
from pipeline.stagedef import Stage, logits_bytes, mem_mb
from pipeline.stages.conformance.causes import backend_spec, control_typed, merging_variant, read_normalizer
from pipeline.stages.conformance.common import (
    DEFAULT_CHUNKS,
    HELPER,
    PROBES_FILE,
    THRESHOLDS,
    added_token_probes,
    eval_slice_probe,
    load_conversations,
    load_probes,
    run_helper,
    tokenizer_requests,
)
from pipeline.stages.conformance.eog import check_eog, turn_end_token
from pipeline.stages.conformance.hf_tokenizer import load_hf_tokenizer
from pipeline.stages.conformance.hparams import check_hparams
from pipeline.stages.conformance.logits import check_logits
from pipeline.stages.conformance.template import check_chat_template, plan_chat_template
from pipeline.stages.conformance.tokenizer import cause_status, check_tokenizer, residual_requests
from pipeline.stages.evaluate import eval_base, restore_base_logits
from pipeline.stages.mtp import mtp_facts
from pipeline.tools import Toolchain, find_toolchain

# --------------------------------------------------------------------------- the stage

MAX_CAUSE_PROBES = 20  # probe names per cause in the manifest (a vocabulary's added tokens can be hundreds)


def _settings(recipe) -> dict | None:
    """The recipe's ``conformance`` setting (pipeline/recipe/ ``Conformance``): None when it opts out."""
    conf = getattr(recipe, "conformance", None)
    if conf is False or (conf is not None and getattr(conf, "enabled", True) is False):
        return None
    if isinstance(conf, dict):
        return {"chunks": int(conf.get("chunks", DEFAULT_CHUNKS)), "text": conf.get("text"),
                "accept": tuple(conf.get("accept", ())), "strict": bool(conf.get("strict", False))}
    return {"chunks": int(getattr(conf, "chunks", DEFAULT_CHUNKS)), "text": getattr(conf, "text", None),
            "accept": tuple(getattr(conf, "accept", ())), "strict": bool(getattr(conf, "strict", False))}


def _texts(recipe, settings: dict) -> tuple[Path, ...]:
    """The eval and calibration texts a found tokenizer cause is measured on (each once, files that exist)."""
    paths = [es.text for es in getattr(recipe, "eval_sets", ())] + [settings.get("text")]
    for part in ("awq", "imatrix"):
        paths.append(getattr(getattr(recipe, part, None), "calibration", None))
    paths.append(getattr(getattr(recipe, "sensitivity", None), "text", None))
    out: list[Path] = []
    for p in paths:
        if p is not None and Path(p).is_file() and Path(p) not in out:
            out.append(Path(p))
    return tuple(out)


def _log(log: Path | None, line: str) -> None:
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(line.rstrip("\n") + "\n")


def _sig(x: float | None, digits: int = 6) -> float | None:
    """``x`` to ``digits`` significant digits: the record's compact numbers do not change with the last bits of a
    float32 sum (threads); the exact values are in ``details``."""
    if x is None or not math.isfinite(x) or x == 0:
        return x
    return round(x, digits - 1 - int(math.floor(math.log10(abs(x)))))


def _compact_tokenizer(c: dict, out: dict) -> None:
    mm = {m: v["mismatches"] for m, v in c["modes"].items()}
    causes = c.get("causes", {})
    out.update(probes=c["probes"], mismatches=mm, hf_tokenizer=c["hf_tokenizer"],
               normalizer=(c.get("normalizer") or {}).get("describe"),
               causes={k: {"status": v["status"], "probes": v["probes"][:MAX_CAUSE_PROBES],
                           **({"more_probes": len(v["probes"]) - MAX_CAUSE_PROBES}
                              if len(v["probes"]) > MAX_CAUSE_PROBES else {}),
                           **({"text_share": {s["text"]: s["share"] for s in v["text_share"]}}
                              if v.get("text_share") else {})} for k, v in sorted(causes.items())},
               summary=f"{c['probes']} probes x {len(mm)} modes: "
                       + ", ".join(f"({m}) {v} mismatch{'es' if v != 1 else ''}" for m, v in mm.items())
                       + "".join(f"; {k}: {v['status']} on {len(v['probes'])} probe"
                                 f"{'s' if len(v['probes']) != 1 else ''}" for k, v in sorted(causes.items())))


def _compact_logits(c: dict, out: dict) -> None:
    if c.get("outside"):
        out["outside"] = c["outside"]
    if c.get("hf_class"):
        out["hf_class"] = c["hf_class"]
    if not c.get("run"):
        out["not_run"] = c.get("note", "not run")
        return
    keys = ("top1", "kld_mean", "kld_p99", "kld_max", "ln_ppl_ratio", "ppl_hf", "ppl_llama")
    out.update({k: _sig(c[k]) for k in keys}, positions=c["positions"], chunks=c["chunks"],
               clamped_targets=c["clamped_targets"], n_ctx=c["n_ctx"], thresholds=dict(THRESHOLDS))
    out["summary"] = (f"top-1 {c['top1']:.4f}, mean KLD {c['kld_mean']:.3g}, p99 KLD {c['kld_p99']:.3g}, "
                      f"ln(PPL HF / PPL llama.cpp) {c['ln_ppl_ratio']:+.2g} on {c['positions']} positions "
                      f"of {c['chunks']} chunk{'s' if c['chunks'] != 1 else ''} at ctx {c['n_ctx']} (HF float32 "
                      f"{c['hf_class'].rsplit('.', 1)[-1]} vs the GGUF)")
    if "awq" in c:
        a = c["awq"]
        out["awq"] = {k: _sig(a[k]) for k in ("top1", "kld_mean", "kld_p99", "ln_ppl_ratio")}
        out["awq"]["gated"] = False
        out["summary"] += (f"; AWQ-folded vs HF (not gated): top-1 {a['top1']:.4f}, mean KLD "
                           f"{a['kld_mean']:.3g}, p99 KLD {a['kld_p99']:.3g}")


def _compact_chat_template(c: dict, out: dict) -> None:
    if c.get("note"):
        out["not_run"] = c["note"]
        return
    convs = c.get("conversations", [])
    counts = {k: sum(1 for r in convs if pred(r)) for k, pred in (
        ("identical", lambda r: r.get("verdict") == "identical"),
        ("rejected_by_both", lambda r: r.get("verdict") == "rejected by both"),
        ("skipped", lambda r: "skipped" in r))}
    but = [r["verdict"] for r in convs if r.get("verdict", "").startswith("identical but for")]
    if but:  # ids that differ only by the tokenizer cause its status allows
        counts["identical_but_for_cause"] = len(but)
    out.update(conversations=len(convs), **counts, now_dependent=bool(c.get("now_dependent")))
    out["summary"] = (f"{len(convs)} conversations: {counts['identical']} identical (text and ids)"
                      + (f", {len(but)} {but[0]}" if but else "")
                      + (f", {counts['rejected_by_both']} rejected by both" if counts["rejected_by_both"] else "")
                      + (f", {counts['skipped']} skipped (no tools in the HF template)" if counts["skipped"] else "")
                      + (f", {len(convs) - sum(counts.values())} differ" if len(convs) > sum(counts.values()) else ""))


def _compact_eog(c: dict, out: dict) -> None:
    te = c.get("turn_end") or {}
    out.update(eog=c["eog"], hf_eos_ids=c["hf_eos_ids"], hf_eos_source=c["hf_eos_source"],
               gguf_eos=c.get("gguf_eos"), turn_end=te.get("text"), turn_end_id=te.get("id"))
    out["summary"] = (f"EOG {c['eog']}; HF eos_token_id {c['hf_eos_ids']} ({c['hf_eos_source']})"
                      + (f"; turn end {te['text']!r} ({te['id']})" if "id" in te else ""))


def _compact_hparams(c: dict, out: dict) -> None:
    cmp = c["compared"]
    out.update(compared={r["key"]: r["equal"] for r in cmp}, source=c["source"])
    bad = [r["key"] for r in cmp if not r["equal"]]
    out["summary"] = (f"{len(cmp)} keys compared with the HF config ({c['source']}): "
                      + (f"{len(bad)} differ ({', '.join(bad)})" if bad else "all equal")
                      + (f"; {len(c['not_compared'])} not compared" if c["not_compared"] else ""))


_COMPACT = {"tokenizer": _compact_tokenizer, "logits": _compact_logits, "chat_template": _compact_chat_template,
            "eog": _compact_eog, "hparams": _compact_hparams, "logits_long": _compact_logits}


def compact(name: str, c: dict) -> dict:
    """What the manifest and the report show of one check: verdict, one-line ``summary``, the numbers, and
    ``not_run`` (the reason) for a check that could not run. Stable across rebuilds (no seconds, no diffs)."""
    out: dict[str, Any] = {"passed": c["passed"]}
    fill = _COMPACT.get(name)
    if fill is not None:
        fill(c, out)
    return out


def _not_run(note: str) -> dict:
    return {"passed": True, "run": False, "note": note, "failures": [], "warnings": [], "seconds": 0.0}


def _opt_out(name: str, out_record, log: Path | None) -> dict:
    """The record of a recipe with ``conformance: false``: only the verdict keys."""
    rec = ConformanceRecord(recipe=name, passed=True, skipped="the recipe opts out (conformance: false)",
                            failures=[], warnings=[], checks={})
    rec.write(out_record)
    _log(log, f"[conformance] {name}: skipped: the recipe opts out")
    return rec.to_dict()


def _check_inputs(what: str, base_gguf: Path, hf_dir: Path, logits_file, base_record, awq_base) -> None:
    """A PipelineError naming the first input file that is missing: nothing can be measured without it."""
    for p, label in ((base_gguf, "base GGUF"), (hf_dir / "config.json", "HF folder's config.json")):
        if not p.is_file():
            raise PipelineError(f"{what}: the {label} {p} is missing")
    for p, label in ((logits_file, "base logits"), (base_record, "eval-base record")):
        if p is not None and not Path(p).is_file():
            raise PipelineError(f"{what}: the {label} {p} is missing (run eval-base first)")
    if awq_base is not None and not (Path(awq_base) / "config.json").is_file():
        raise PipelineError(f"{what}: the AWQ-folded folder {awq_base} has no config.json")


@dataclass
class _HfSide:
    """What the HF side prepares for the checks and the helper's requests."""
    tok: Any
    probes: list[tuple[str, str]]
    header: Any
    metadata: dict
    spec: Any
    norm: Any
    residual: tuple[list[int], list[dict]]
    plan: dict
    turn_end: Any
    seconds: float


def _hf_side(recipe, settings: dict, base_gguf: Path, hf_dir: Path, trust: bool, what: str) -> _HfSide:
    # HF side first: the tokenizer once, the probes, the renders (their texts go to the helper to tokenize)
    t = time.monotonic()
    tok = load_hf_tokenizer(hf_dir, trust, what)
    override = getattr(recipe, "chat_template_override", None)
    if override is not None:  # the fix path: the recipe's template is the model's, on both sides
        tok.chat_template = Path(override).read_text(encoding="utf-8")
    first = getattr(recipe, "first_eval_set", None)
    eval_text = first.text if first else settings.get("text")
    probes = load_probes() + added_token_probes(tok) + eval_slice_probe(eval_text)
    conversations = load_conversations()

    header = read_header(base_gguf)
    metadata = header.metadata
    gguf_template = metadata.get("tokenizer.chat_template")
    spec = backend_spec(tok)
    norm = read_normalizer(tok, spec, hf_dir, metadata.get("tokenizer.ggml.model"))
    residual = residual_requests(norm, probes)
    plan = plan_chat_template(tok, gguf_template if isinstance(gguf_template, str) else None, conversations,
                              norm.residual_fn)
    turn_end = turn_end_token(tok, conversations.get("date_string", "")) if plan["hf_template"] else None
    return _HfSide(tok, probes, header, metadata, spec, norm, residual, plan, turn_end,
                   time.monotonic() - t)


@dataclass
class _HelperRun:
    """llama.cpp's answers: ``answers[0]`` the vocabulary facts, then ``n_tok`` tokenizer answers, the
    template plan's, the residual normalizer's."""
    n_tok: int
    requests: list[dict]
    answers: list[dict]
    vocab: dict
    seconds: float


def _helper_side(tc: Toolchain, base_gguf: Path, hf: _HfSide, log: Path | None, what: str) -> _HelperRun:
    # llama.cpp side: one helper process for every request
    tok_reqs = tokenizer_requests(hf.probes)
    requests = [{"op": "vocab"}, *tok_reqs, *hf.plan["requests"], *hf.residual[1]]
    t = time.monotonic()
    answers = run_helper(tc, base_gguf, requests, log)
    helper_seconds = time.monotonic() - t
    vocab = answers[0]
    if "error" in vocab or "eog" not in vocab:
        raise PipelineError(f"{what}: {HELPER} gave no vocabulary facts for {base_gguf}: {vocab}")
    return _HelperRun(len(tok_reqs), requests, answers, vocab, helper_seconds)


def _run_checks(recipe, settings: dict, hf_dir: Path, trust: bool, hf: _HfSide, ll: _HelperRun) -> dict[str, dict]:
    """The tokenizer, chat-template, EOG and hparams checks on both sides' answers (each check's full result)."""
    name, tok, norm, answers, n_tok = recipe.name, hf.tok, hf.norm, ll.answers, ll.n_tok
    details: dict[str, dict] = {}
    n_plan = 1 + n_tok + len(hf.plan["requests"])
    details["tokenizer"] = check_tokenizer(name, tok, hf.probes, answers[1:1 + n_tok], norm,
                                           (hf.residual[0], answers[n_plan:]), settings["accept"], settings["strict"],
                                           _texts(recipe, settings), merging_variant(hf.spec),
                                           frozenset(control_typed(tok, hf.header.array("tokenizer.ggml.token_type"))))
    cause = norm.cause and (norm.cause, cause_status(norm.cause, settings["accept"], settings["strict"]), norm.why())
    details["chat_template"] = check_chat_template(name, tok, hf.plan, answers[1 + n_tok:n_plan], ll.vocab, cause)
    details["eog"] = check_eog(name, tok, hf_dir, ll.vocab, hf.turn_end)
    details["hparams"] = check_hparams(name, hf.metadata, hf_dir, trust)
    return details


def outside_logits(header) -> list[str]:
    """What the base GGUF holds that the logit check does not run: the MTP layers (llama.cpp's main-model logits,
    which eval-base wrote, skip them; so does the HF class's forward). Their drafting is the acceptance stage's."""
    m = mtp_facts(header)
    if not m["tensors"]:
        return []
    blocks = ", ".join(f"blk.{n}" for n in m["layers"])
    return [f"the MTP layer{'s' if len(m['layers']) > 1 else ''} {blocks} ({m['tensors']} nextn tensors, "
            f"nextn_predict_layers {m['nextn_predict_layers']}): neither llama.cpp's main-model logits nor the HF "
            "forward runs them; the acceptance stage measures their drafts"]


def _logits_details(name: str, settings: dict, hf_dir: Path, trust: bool, vocab: dict, logits_file, base_record,
                    awq_base, header, check: str = "logit fidelity") -> dict:
    """The logit check against eval-base's logits (not run without them)."""
    if logits_file is None:
        return _not_run("not run: the recipe has no eval text")
    base_ppl = EvalBaseRecord.read(base_record, "conformance").get("ppl") if base_record else None
    return check_logits(name, hf_dir, logits_file, bool(vocab.get("add_bos")), vocab.get("bos"),
                        settings["chunks"], trust, awq_base, base_ppl, n_tokens=vocab.get("n_tokens"),
                        outside=outside_logits(header), check=check)


def _gate(details: dict[str, dict]) -> tuple[list[str], list[str]]:
    """Every check's failure lines (any fails the stage) and warning lines, in check order."""
    failures = [f for c in details.values() for f in c["failures"]]
    warnings = [w for c in details.values() for w in c.get("warnings", [])]
    return failures, warnings


def _seconds(details: dict[str, dict], hf_seconds: float, helper_seconds: float, t0: float) -> dict:
    """Per check and in all; the logit check's volatile timings move here out of its details."""
    seconds = {k: c.get("seconds", 0.0) for k, c in details.items()}
    lg = details["logits"]
    for check in ("logits", "logits_long"):
        for key in ("load_seconds", "hf_seconds"):  # volatile numbers stay out of the details
            if key in details.get(check, {}):
                seconds[f"{check}_{key.removesuffix('_seconds')}"] = details[check].pop(key)
    if "awq" in lg:
        seconds["logits_awq"] = lg["awq"].pop("seconds", 0.0)
    seconds.update(hf_side=round(hf_seconds, 3), helper=round(helper_seconds, 3), total=round(time.monotonic() - t0, 3))
    return seconds


def _record(name: str, settings: dict, base_gguf: Path, tc: Toolchain, ll: _HelperRun, details: dict[str, dict],
            failures: list[str], warnings: list[str], seconds: dict) -> ConformanceRecord:
    return ConformanceRecord(
        recipe=name,
        passed=not failures,
        failures=failures,
        warnings=warnings,
        checks={k: compact(k, c) for k, c in details.items()},
        thresholds=dict(THRESHOLDS),
        chunks=settings["chunks"],
        # torch's threads: the float32 sums of the HF side depend on them (the stage fixes them: eval_threads)
        threads=sys.modules["torch"].get_num_threads() if "torch" in sys.modules else None,
        gguf=base_gguf.name,
        vocab={k: ll.vocab.get(k)
               for k in ("type", "n_tokens", "bos", "eos", "eot", "eom", "add_bos", "add_eos", "eog")},
        helper_requests=len(ll.requests),
        toolchain=tc.describe(),
        python=python_versions(),
        details={k: {kk: vv for kk, vv in c.items() if kk not in ("failures", "warnings", "seconds")}
                 for k, c in details.items()},
        seconds=seconds,
    )


def _log_outcome(log: Path | None, name: str, rec: ConformanceRecord) -> None:
    seconds = rec.seconds
    for line in rec.failures:
        _log(log, line)
    for line in rec.warnings:
        _log(log, f"warning: {line}")
    for k, c in rec.checks.items():
        _log(log, f"[conformance] {name}: {k}: {'pass' if c['passed'] else 'FAIL'}: "
                  f"{c.get('summary') or c.get('not_run', '')} ({seconds[k]:.2f}s)")
    _log(log, f"[conformance] {name}: {'passed' if rec.passed else 'FAILED'} ({seconds['total']:.1f}s, "
              f"helper {seconds['helper']:.2f}s for {rec.helper_requests} requests)")


def run(recipe, base_gguf, hf_dir, logits_file, base_record, out_record, log=None, tc: Toolchain | None = None,
        awq_base=None, long: tuple | None = None) -> dict:
    """Entry function: every check of the base GGUF ``base_gguf`` against the HF folder ``hf_dir``; writes
    ``out_record`` (JSON, atomically) and returns it. ``logits_file``/``base_record``: eval-base's logits and
    record of the first eval set (None: no logit check). ``awq_base``: the AWQ-folded HF folder, measured against
    ``hf_dir`` (recorded, not gated). ``long``: (logits, record) of the ``ctx: long`` set: the logit check on its one
    chunk too (``logits_long``), where the quants' shared conversion error at length shows.

    The record: ``passed``, ``failures`` and ``warnings`` (one line each), ``checks`` (per check: ``passed``, a
    one-line ``summary`` or ``not_run``, the numbers; what the manifest shows), ``details`` (per check: every
    number, the full tokenizer diffs, both renders and id sequences of every conversation, MemAvailable: bulky, and
    not for the manifest), ``seconds`` (per check and in all: volatile), ``thresholds``, ``vocab`` (llama.cpp's
    view of the GGUF), ``toolchain``, ``python``."""
    t0 = time.monotonic()
    name = recipe.name
    what = f"{recipe.path}: conformance"
    log = Path(log) if log else None
    if log:
        log.parent.mkdir(parents=True, exist_ok=True)
    settings = _settings(recipe)
    if settings is None:
        return _opt_out(name, out_record, log)
    base_gguf, hf_dir = Path(base_gguf), Path(hf_dir)
    _check_inputs(what, base_gguf, hf_dir, logits_file, base_record, awq_base)
    tc = tc or find_toolchain()
    trust = bool(recipe.source.trust_remote_code)
    hf = _hf_side(recipe, settings, base_gguf, hf_dir, trust, what)
    ll = _helper_side(tc, base_gguf, hf, log, what)
    details = _run_checks(recipe, settings, hf_dir, trust, hf, ll)
    details["logits"] = _logits_details(name, settings, hf_dir, trust, ll.vocab, logits_file, base_record, awq_base,
                                        hf.header)
    if long:
        details["logits_long"] = _logits_details(name, {**settings, "chunks": 1}, hf_dir, trust, ll.vocab, *long, None,
                                                 hf.header, "logit fidelity at long context")
    failures, warnings = _gate(details)
    seconds = _seconds(details, hf.seconds, ll.seconds, t0)
    rec = _record(name, settings, base_gguf, tc, ll, details, failures, warnings, seconds)
    rec.write(out_record)
    _log_outcome(log, name, rec)
    return rec.to_dict()


def run_stage(recipe, layout, threads: int = 2, tc: Toolchain | None = None, log: str | os.PathLike | None = None,
              paths: dict | None = None) -> dict:
    """The Snakemake stage (``ggufpipe stage conformance``): :func:`run` on the recipe's paths (``paths``: those
    Snakemake resolved, named as ``Layout.conformance_inputs`` names them, and ``record``; default: the layout's). The
    base logits are eval-base's of the first eval set (recomputed first when ``ggufpipe clean-logits`` emptied them); a
    recipe with ``conformance.text`` (or a built draft, given its main's) gets its own, on that text at ctx 512, in its
    scratch folder, removed afterwards. ``log``: the job log (default ``layout.log(name, "conformance")``)."""
    name = recipe.name
    p = paths or {**layout.conformance_inputs(recipe), "record": layout.conformance_record(name)}
    log = Path(log or layout.log(name, "conformance"))
    log.parent.mkdir(parents=True, exist_ok=True)
    record, base, hf = p["record"], p["base"], p["hf"]
    settings = _settings(recipe)
    if settings is None:
        return run(recipe, base, hf, None, None, record, log, tc)
    tc = tc or find_toolchain()
    # torch: only the conformance run loads it
    import torch

    torch.set_num_threads(threads)  # fixed (eval_threads), not --cores: the numbers stay bit-identical
    awq = p.get("awq")
    es = recipe.first_eval_set
    if es and settings.get("text") is None:
        logits, base_record = p["logits"], p["base_record"]
        long = (p["logits_long"], p["base_record_long"]) if recipe.long_eval_set else None
        for e, files in ((es, (logits, base_record)), (recipe.long_eval_set, long)):
            if e and Path(files[0]).is_file():
                restore_base_logits(tc, e, base, *files, threads, log, f"{name}: conformance")
        return run(recipe, base, hf, logits, base_record, record, log, tc, awq, long)
    text = settings.get("text")
    if text is None:
        return run(recipe, base, hf, None, None, record, log, tc, awq)
    scratch = Path(layout.conformance_dir(name))
    es = EvalSet(name="conformance", text=Path(text), ctx=512, chunks=settings["chunks"])
    try:
        eval_base(name, es, base, scratch / "base.logits", scratch / "base.json", threads, log, tc)
        return run(recipe, base, hf, scratch / "base.logits", scratch / "base.json", record, log, tc, awq)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _disk_mb(s) -> int:
    r = s.recipe
    if r.eval_sets:
        return 512
    return mem_mb(logits_bytes(512, r.conformance.chunks, s.n_vocab("base")) / 2**20, 1.0)


def _trigger(r, wc, s) -> dict:
    c = r.conformance
    return {"conformance": c.describe(), "text": str(c.text) if c.text else None, "build": s.build_number,
            "commit": s.commit, "offload": s.offload, "probes": sha256_file(PROBES_FILE)}


STAGE = Stage(
    "conformance", "conformance", order=55, log="conformance", threads="eval_threads",
    run=lambda j: run_stage(j.recipe, j.layout, threads=j.threads, log=j.log, paths={**j.input, **j.output}),
    inputs=lambda r, wc, L: L.conformance_inputs(r), outputs=lambda L: {"record": L.conformance_record("{name}")},
    trigger=_trigger,
    # the HF model in float32 (2 x the F16 file) beside the base logits being read
    resources={"mem_mb": lambda s: mem_mb(s.mb("base"), 2.5, 2048), "disk_mb": _disk_mb,
               "runtime": lambda s: int(30 + s.mb("base") / 20)},
)
