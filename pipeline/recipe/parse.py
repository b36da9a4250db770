"""Parsing each section of a recipe, one line per error naming file and field (the ``_Ctx`` helpers). (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.gguf import read_header
from pipeline.memory_profiles import KV_TYPES
from pipeline.recipe import naming
from pipeline.recipe.imatrix import parse_coverage
from pipeline.recipe.model import (
    ACCEPTABLE_CAUSES,
    ARCH_CLASS_RE,
    AWQ_ENGINES,
    AWQ_KEYS,
    AWQ_VERSIONS,
    COMMIT_RE,
    CONFORMANCE_KEYS,
    CONFORMANCE_LIMITATIONS,
    DRAFT_KEYS,
    EVAL_KEYS,
    EVAL_NAME_RE,
    IMATRIX_DEFAULT_FAMILIES,
    IMATRIX_KEYS,
    MIN_SCORED_TOKENS,
    MTP_DRAFT_KEY,
    NEEDS_IMATRIX,
    OUTTYPES,
    PUBLISH_KEYS,
    QUANT_KEYS,
    REPO_PATH_RE,
    REPO_RE,
    REVISION_RE,
    REVISION_RULE,
    SHA256_RE,
    SOURCE_KEYS,
    TENSOR_TYPE_RE,
    VARIANT_RE,
    AwqConfig,
    Conformance,
    Draft,
    EvalSet,
    ImatrixConfig,
    Publish,
    Quant,
    Sensitivity,
    Source,
    Split,
    first_text_set,
    quant_family,
    scored_tokens,
)
from pipeline.recipe.parse_base import (
    _check_quant_type,
    _Ctx,
    _file_sha256,
    _fits_text,
    _parse_quant_gates,
    _parse_split,
    _text_path,
    _thresholds,
)
from pipeline.recipe.parse_mix import MIX_KEYS, _check_mix, _parse_mix
from pipeline.recipe.quant_types import key_ref
from pipeline.recipe.speedup import parse_speedup
from pipeline.recipe.tensor_map import read_map

# --------------------------------------------------------------------------- helpers


def _parse_eval_sets(ctx: _Ctx, value) -> tuple[EvalSet, ...]:
    items = [value] if isinstance(value, dict) else value
    if not isinstance(items, list) or not items:
        ctx.fail("gates", "must be a list of eval sets (name, text, ctx, chunks, thresholds)")
    sets = []
    for i, item in enumerate(items):
        where = f"gates[{i}]"
        d = ctx.mapping(item, where, EVAL_KEYS)
        name = d.get("name", "default" if len(items) == 1 else None)
        if name is None:
            ctx.fail(f"{where}.name", "missing (needed when there are several eval sets)")
        name = ctx.string(name, f"{where}.name", EVAL_NAME_RE, "an eval set name (a-z 0-9 _ -)")
        long = d.get("ctx") == "long"
        for req in ("text", "ctx") if long else ("text", "ctx", "chunks"):
            if req not in d:
                ctx.fail(f"{where}.{req}", "missing")
        text = _text_path(ctx, d["text"], f"{where}.text", "eval text")
        sha = d.get("text_sha256")
        if sha is not None:
            sha = ctx.string(sha, f"{where}.text_sha256", SHA256_RE, "a SHA256 (64 lowercase hex)")
        max_ctx = ctx.number(d.get("max_ctx", 4096), f"{where}.max_ctx", "gates[]")
        if long:  # one chunk at min(trained context, max_ctx), resolved by eval-base from the GGUF
            n_ctx = max_ctx
            chunks = ctx.number(d.get("chunks", 1), f"{where}.chunks", "gates[]")
            if chunks != 1:
                ctx.fail(f"{where}.chunks", "must be 1 with ctx: long (one chunk at the model's trained context)")
        else:
            if "max_ctx" in d:
                ctx.fail(f"{where}.max_ctx", "only with ctx: long")
            if isinstance(d["ctx"], str):
                ctx.fail(f"{where}.ctx", f"must be an integer >= 16 or long, got {d['ctx']!r}")
            n_ctx = ctx.number(d["ctx"], f"{where}.ctx", "gates[]")
            chunks = ctx.number(d["chunks"], f"{where}.chunks", "gates[]")
        render = d.get("render", "text")
        if render not in ("text", "chat"):
            ctx.fail(f"{where}.render", f"must be text or chat, got {render!r}")
        scored = scored_tokens(n_ctx, chunks)
        if scored < MIN_SCORED_TOKENS and not long:  # one long chunk scores half the model's context, whatever it is
            ctx.fail(f"{where}.chunks", f"ctx {n_ctx} x {chunks} chunks scores only {scored} tokens; at least "
                                        f"{MIN_SCORED_TOKENS} are needed for a meaningful evaluation")
        if render == "text" and not long:  # a chat set's tokens include its template's
            _fits_text(ctx, text, n_ctx * chunks, f"{where}.chunks", f"ctx {n_ctx} x {chunks} chunks")
        if any(es.name == name for es in sets):
            ctx.fail(f"{where}.name", f"eval set {name!r} repeats")
        sets.append(EvalSet(name=name, text=text, ctx=n_ctx, chunks=chunks,
                            thresholds=_thresholds(ctx, d, where), text_sha256=sha,
                            kv_types=_kv_types(ctx, d.get("kv_types"), f"{where}.kv_types"), render=render,
                            long=long, max_ctx=max_ctx, hub_dataset=_hub_dataset(ctx, d, f"{where}.hub_dataset")))
    return tuple(sets)


def _kv_types(ctx: _Ctx, value, where: str) -> tuple[str, ...]:
    """``kv_types``: KV cache types llama.cpp accepts for -ctk/-ctv (common/arg.cpp), f16 (the base's) first."""
    if value is None:
        return ()
    if not isinstance(value, list) or not value:
        ctx.fail(where, "must be a list of KV cache types, f16 first (e.g. [f16, q8_0, q4_0])")
    out = []
    for i, v in enumerate(value):
        if not isinstance(v, str) or v.lower() not in KV_TYPES:
            ctx.fail(f"{where}[{i}]", f"{v!r} is not a KV cache type llama.cpp accepts (one of {', '.join(KV_TYPES)})")
        if v.lower() in out:
            ctx.fail(f"{where}[{i}]", f"{v!r} repeats")
        out.append(v.lower())
    if out[0] != "f16":
        ctx.fail(f"{where}[0]", "must be f16: the base logits are computed with an f16 cache, and each other type is "
                                "measured against them")
    return tuple(out)


def _parse_quant(ctx: _Ctx, item, where: str, known, build, set_names: set[str]) -> Quant:
    if isinstance(item, str):
        return Quant(type=_check_quant_type(ctx, item, where, known, build))
    d = ctx.mapping(item, where, QUANT_KEYS)
    if "type" not in d:
        ctx.fail(f"{where}.type", "missing")
    if isinstance(d["type"], str) and d["type"].strip().lower() == "mix":
        return _parse_mix(ctx, d, where, known, build, set_names)
    for key in MIX_KEYS:
        if key in d:
            ctx.fail(f"{where}.{key}", "only for a mix (`type: mix`)")
    qtype = _check_quant_type(ctx, ctx.string(d["type"], f"{where}.type"), f"{where}.type", known, build)
    variant = d.get("variant")
    if variant is not None:
        variant = ctx.string(variant, f"{where}.variant", VARIANT_RE,
                             "a variant: 1-24 letters A-Z (the Hub's label `<TYPE>_<VARIANT>` stops at a digit)")
        variant = variant.upper()
        label = naming.quant_label(qtype, variant)
        if label in naming.HUB_FILE_TYPES or (known is not None and label in known):
            ctx.fail(f"{where}.variant", f"{qtype} with variant {variant} would be labelled {label}, the name of "
                     "another quant type: choose another variant")
    kw: dict[str, Any] = {}
    for key in ("output_tensor_type", "token_embedding_type"):
        if key in d:
            kw[key] = ctx.string(d[key], f"{where}.{key}", re.compile(r"^[A-Za-z0-9_]+$"), "a ggml type name").lower()
    if "tensor_types" in d:
        tts = d["tensor_types"]
        if not isinstance(tts, list):
            ctx.fail(f"{where}.tensor_types", "must be a list of 'pattern=type'")
        kw["tensor_types"] = tuple(
            ctx.string(t, f"{where}.tensor_types[{j}]", TENSOR_TYPE_RE, "'pattern=type'") for j, t in enumerate(tts)
        )
    if "tensor_types_file" in d:
        kw.update(_tensor_types_file(ctx, d, f"{where}.tensor_types_file"))
    for key in ("pure", "leave_output_tensor"):
        if key in d:
            kw[key] = ctx.boolean(d[key], f"{where}.{key}")
    if "gates" in d:
        kw["gates"] = _parse_quant_gates(ctx, d["gates"], f"{where}.gates", set_names)
    for key in ("awq", "imatrix"):  # resolved against the recipe's sections in _parse_quants
        if key in d:
            kw[key] = ctx.boolean(d[key], f"{where}.{key}")
    if "split" in d:
        kw["split"] = _parse_split(ctx, d["split"], f"{where}.split", allow_false=True)
    return Quant(type=qtype, variant=variant, **kw)


def _tensor_types_file(ctx: _Ctx, d: dict, where: str) -> dict:
    """``tensor_types_file``: the map's path and entries (pipeline/recipe/tensor_map.py)."""
    for flag in ("token_embedding_type", "output_tensor_type"):
        if flag in d:
            ctx.fail(where, f"not with `{flag}`: llama-quantize applies {flag} before any pattern "
                            "(src/llama-quant.cpp:721-740), so a map entry for that tensor would silently not apply")
    path = _text_path(ctx, d["tensor_types_file"], where, "tensor type map")
    try:
        entries = read_map(path)
    except ValueError as exc:
        ctx.fail(where, str(exc))
    return {"tensor_types_file": path, "tensor_map": entries}


def _parse_source(ctx: _Ctx, value, where: str) -> Source:
    s = ctx.mapping(value, where, SOURCE_KEYS)
    if ("repo" in s) == ("path" in s):
        ctx.fail(where, "give exactly one of `repo` (with `revision`) or `path`")
    if "repo" in s:
        repo = ctx.string(s["repo"], f"{where}.repo", REPO_RE, "a Hugging Face repo id (org/name)")
        if "revision" not in s or s["revision"] in (None, ""):
            ctx.fail(f"{where}.revision", "missing: pin the repo to a commit SHA (or at least a tag)")
        rev = s["revision"]
        if not isinstance(rev, str):  # YAML reads an all-digit SHA prefix as a number
            ctx.fail(f"{where}.revision", f"must be a string (quote it), got {rev!r}")
        revision = ctx.string(rev, f"{where}.revision", REVISION_RE, f"a git revision ({REVISION_RULE})")
        local = None
    else:
        if "revision" in s:
            ctx.fail(f"{where}.revision", "only valid with `repo`")
        repo = revision = None
        local = ctx.string(s["path"], f"{where}.path")
    return Source(
        repo=repo,
        revision=revision,
        path=local,
        allow_pickle=ctx.boolean(s.get("allow_pickle", False), f"{where}.allow_pickle"),
        trust_remote_code=ctx.boolean(s.get("trust_remote_code", False), f"{where}.trust_remote_code"),
        convert_as=(ctx.string(s["convert_as"], f"{where}.convert_as", ARCH_CLASS_RE,
                               "a model class name such as LlamaForCausalLM") if "convert_as" in s else None),
    )


def _parse_quants(ctx: _Ctx, qs, where: str, known, build, set_names: set[str], has_awq: bool = False,
                  has_imatrix: bool = False, split: Split | None = None,
                  sensitivity: Sensitivity | None = None) -> tuple[Quant, ...]:
    if not isinstance(qs, list) or not qs:
        ctx.fail(where, "must be a non-empty list")
    quants = []
    for i, item in enumerate(qs):
        q = _parse_quant(ctx, item, f"{where}[{i}]", known, build, set_names)
        asked = item if isinstance(item, dict) else {}
        # awq: every quant of a recipe with an `awq:` section, unless it says `awq: false`
        if asked.get("awq") and not has_awq:
            ctx.fail(f"{where}[{i}].awq", "the recipe has no `awq:` section")
        # imatrix: low-bit quants (4 bits and fewer) by default, any quant that says `imatrix: true`
        if asked.get("imatrix") and not has_imatrix:
            ctx.fail(f"{where}[{i}].imatrix", "the recipe has no `imatrix:` section")
        use_imatrix = asked.get("imatrix", has_imatrix and quant_family(q.type) in IMATRIX_DEFAULT_FAMILIES)
        q = replace(q, awq=bool(asked.get("awq", has_awq)), imatrix=bool(use_imatrix))
        if "split" not in asked:  # the recipe's default; `split: false` publishes this quant whole
            q = replace(q, split=split)
        if q.mix:
            if where != "quants":
                ctx.fail(f"{where}[{i}].type", "a mix is a main quant only")
            if sensitivity is None:
                ctx.fail(f"{where}[{i}].type", "a mix needs a top-level `sensitivity:` section (the text its per-tensor "
                                              "types are measured on)")
            q = _check_mix(ctx, q, f"{where}[{i}]", sensitivity.floor)
        quants.append(q)
    seen: dict[str, int] = {}
    for i, q in enumerate(quants):
        if q.key in seen:
            ctx.fail(f"{where}[{i}]", f"{q.key} repeats {where}[{seen[q.key]}]: give one of them a `variant`")
        seen[q.key] = i
        if q.type in NEEDS_IMATRIX and not q.imatrix:
            why = "this recipe has no `imatrix:` section" if not has_imatrix else "this quant sets `imatrix: false`"
            ctx.fail(f"{where}[{i}].type", f"{q.type} needs an importance matrix, and {why}")
    return tuple(quants)


def _calibration(ctx: _Ctx, d: dict, where: str, eval_sets) -> Path:
    if "calibration" not in d:
        ctx.fail(f"{where}.calibration", "missing (a calibration text file)")
    path = _text_path(ctx, d["calibration"], f"{where}.calibration", "calibration text")
    digest = _file_sha256(path)
    pin = d.get("calibration_sha256")
    if pin is not None:
        pin = ctx.string(pin, f"{where}.calibration_sha256", SHA256_RE, "a SHA256 (64 lowercase hex)")
        if pin != digest:
            ctx.fail(f"{where}.calibration_sha256", f"{path.name} has SHA256 {digest}, not the pinned {pin}")
    for es in eval_sets:
        if _file_sha256(es.text) == digest:
            ctx.fail(f"{where}.calibration", f"{path.name} is the eval text of gates {es.name!r} (same SHA256 "
                                            f"{digest[:12]}...): the gates would measure on calibration data; "
                                            "calibrate on a different text")
    return path


def _parse_awq(ctx: _Ctx, value, eval_sets) -> AwqConfig:
    d = ctx.mapping(value, "awq", AWQ_KEYS)
    cal = _calibration(ctx, d, "awq", eval_sets)
    w_bit = ctx.number(d.get("w_bit", 4), "awq.w_bit", "awq")
    if w_bit not in (2, 3, 4, 8):
        ctx.fail("awq.w_bit", f"must be 2, 3, 4 or 8, got {w_bit!r}")
    group = ctx.number(d.get("q_group_size", 128), "awq.q_group_size", "awq")
    if group not in (-1, 32, 64, 128, 256):
        ctx.fail("awq.q_group_size", f"must be 32, 64, 128, 256 or -1 (per channel), got {group!r}")
    version = d.get("version", "gemm")
    if not isinstance(version, str) or version.lower() not in AWQ_VERSIONS:
        ctx.fail("awq.version", f"must be one of {', '.join(AWQ_VERSIONS)}, got {version!r}")
    engine = d.get("engine")
    if engine is not None and engine not in AWQ_ENGINES:
        ctx.fail("awq.engine", f"must be one of {', '.join(AWQ_ENGINES)}, got {engine!r}")
    n_samples = ctx.number(d.get("n_samples", 64), "awq.n_samples", "awq")
    seq_len = ctx.number(d.get("seq_len", 256), "awq.seq_len", "awq")
    _fits_text(ctx, cal, n_samples * seq_len, "awq.n_samples", f"n_samples x seq_len = {n_samples} x {seq_len}")
    clip = ctx.boolean(d["apply_clip"], "awq.apply_clip") if "apply_clip" in d else None
    if clip and engine == "llmcompressor":
        ctx.fail("awq.apply_clip", "llmcompressor has no clipping search: remove apply_clip or use engine: autoawq")
    return AwqConfig(calibration=cal, engine=engine, w_bit=w_bit, q_group_size=group,
                     zero_point=ctx.boolean(d.get("zero_point", True), "awq.zero_point"), version=version.lower(),
                     n_samples=n_samples, seq_len=seq_len,
                     apply_clip=clip)


def _parse_publish(ctx: _Ctx, value) -> Publish:
    d = ctx.mapping(value, "publish", PUBLISH_KEYS)
    if "hf_repo" not in d:
        ctx.fail("publish.hf_repo", "missing (the Hugging Face repo to upload to, org/name)")
    repo = ctx.string(d["hf_repo"], "publish.hf_repo", REPO_RE, "a Hugging Face repo id (org/name)")
    rev = d.get("revision", "main")
    if not isinstance(rev, str):
        ctx.fail("publish.revision", f"must be a branch name (a string), got {rev!r}")
    rev = ctx.string(rev, "publish.revision", REVISION_RE, f"a branch name ({REVISION_RULE})")
    if COMMIT_RE.match(rev):
        ctx.fail("publish.revision", f"{rev!r} is not a branch name (a commit cannot be committed to)")
    prefix = d.get("path_in_repo", "")
    if prefix is None:
        prefix = ""
    if not isinstance(prefix, str):
        ctx.fail("publish.path_in_repo", f"must be a folder path in the repo (a string), got {prefix!r}")
    prefix = prefix.strip("/")
    if prefix and not REPO_PATH_RE.fullmatch(prefix):
        ctx.fail("publish.path_in_repo", f"{prefix!r} is not a folder path in the repo (segments of A-Z a-z 0-9 . _ -, "
                                         "none starting with a dot)")
    ollama = ctx.boolean(d.get("ollama", True), "publish.ollama")
    template = d.get("ollama_template")
    if template is not None:
        if not ollama:
            ctx.fail("publish.ollama_template", "only valid with `ollama: true`")
        template = ctx.string(template, "publish.ollama_template")
        if '"""' in template:
            ctx.fail("publish.ollama_template", 'must not contain """ (it is written as TEMPLATE """...""")')
    return Publish(hf_repo=repo, revision=rev, private=ctx.boolean(d.get("private", False), "publish.private"),
                   path_in_repo=prefix, ollama=ollama, ollama_template=template)


def _parse_imatrix(ctx: _Ctx, value, eval_sets) -> ImatrixConfig:
    d = ctx.mapping(value, "imatrix", IMATRIX_KEYS)
    render = "text"
    if isinstance(d.get("calibration"), dict):  # {conversations: FILE}: chat JSONL, rendered with the chat template
        c = d["calibration"]
        if set(c) != {"conversations"}:
            ctx.fail("imatrix.calibration", "a text file, or {conversations: FILE} (chat JSONL, one conversation a "
                                            f"line), got the keys {sorted(c)}")
        d, render = {**d, "calibration": c["conversations"]}, "chat"
    cal = _calibration(ctx, d, "imatrix", eval_sets)
    n_ctx = ctx.number(d.get("ctx", 512), "imatrix.ctx", "imatrix")
    chunks = ctx.number(d.get("chunks", 32), "imatrix.chunks", "imatrix")
    if render == "text":
        _fits_text(ctx, cal, n_ctx * chunks, "imatrix.chunks", f"ctx {n_ctx} x {chunks} chunks")
    return ImatrixConfig(calibration=cal, ctx=n_ctx, chunks=chunks, **parse_coverage(ctx, d),
                         render=render, hub_dataset=_hub_dataset(ctx, d, "imatrix.hub_dataset"))


def _hub_dataset(ctx: _Ctx, d: dict, where: str) -> str | None:
    v = d.get("hub_dataset")
    return None if v is None else ctx.string(v, where, REPO_RE, "a Hub dataset id owner/name")


def _parse_draft(ctx: _Ctx, value, main_quants: tuple[Quant, ...], eval_sets, known, build, outtype: str,
                 mtp_mode: str = "keep") -> Draft:
    d = ctx.mapping(value, "draft", DRAFT_KEYS)
    mtp = ctx.boolean(d["mtp"], "draft.mtp") if "mtp" in d else False
    if ("source" in d) + ("gguf" in d) + mtp != 1:
        ctx.fail("draft", "give exactly one of `source` (built like the main model), `gguf` (an existing file) "
                          "or `mtp: true`")
    source = gguf = None
    quants: tuple[Quant, ...] = ()
    if mtp:
        if mtp_mode == "strip":
            ctx.fail("draft.mtp", "the recipe leaves the MTP heads out (mtp: strip): there is no MTP draft; use "
                                  "mtp: keep or separate")
        for key in ("quants", "outtype"):
            if key in d:
                ctx.fail(f"draft.{key}", "only valid with draft.source (an MTP draft is the model's own heads)")
    elif "source" in d:
        source = _parse_source(ctx, d["source"], "draft.source")
        if "quants" not in d:
            ctx.fail("draft.quants", "missing")
        for i, item in enumerate(d["quants"] if isinstance(d["quants"], list) else []):
            if isinstance(item, dict) and "split" in item:
                ctx.fail(f"draft.quants[{i}].split", "not supported: draft models are published whole")
        quants = _parse_quants(ctx, d["quants"], "draft.quants", known, build, set())
    else:
        for key in ("quants", "outtype"):
            if key in d:
                ctx.fail(f"draft.{key}", "only valid with draft.source (a `gguf` draft is checked, not rebuilt)")
        gguf = Path(ctx.string(d["gguf"], "draft.gguf")).expanduser()
        if not gguf.is_absolute():
            gguf = (ctx.path.parent / gguf).resolve()
        if not gguf.is_file():
            ctx.fail("draft.gguf", f"{gguf} does not exist")

        try:  # magic, header and tensor data inside the file (standard library; reads the header only)
            read_header(gguf)
        except PipelineError as exc:
            ctx.fail("draft.gguf", str(exc))
    d_outtype = ctx.choice(d.get("outtype", outtype), "draft.outtype", OUTTYPES)
    main_keys = [q.key for q in main_quants]
    draft_keys = [q.key for q in quants] if quants else [MTP_DRAFT_KEY if mtp else "gguf"]
    pairs = [(m, dk) for m in main_keys for dk in draft_keys]
    if "pairs" in d:
        raw = d["pairs"]
        if not isinstance(raw, list) or not raw:
            ctx.fail("draft.pairs", "must be a list of [main quant, draft quant]")
        pairs = []
        for i, pr in enumerate(raw):
            if not (isinstance(pr, list) and len(pr) == 2 and all(isinstance(x, str) for x in pr)):
                ctx.fail(f"draft.pairs[{i}]", f"must be [main quant, draft quant], got {pr!r}")
            m, dk = (key_ref(x) for x in pr)
            if m not in main_keys and m != outtype.upper():
                ctx.fail(f"draft.pairs[{i}]", f"{m!r} is not a main quant ({', '.join(main_keys)})")
            if dk not in draft_keys:
                ctx.fail(f"draft.pairs[{i}]", f"{dk!r} is not a draft quant ({', '.join(draft_keys)})")
            pairs.append((m, dk))
    n_max = d.get("n_max", [4, 8])
    n_max = n_max if isinstance(n_max, list) else [n_max]
    if not n_max:
        ctx.fail("draft.n_max", "must be a draft length 1-64 or a non-empty list of them, got []")
    for n in n_max:
        ctx.number(n, "draft.n_max", "draft")
    text = d.get("eval_text")
    if text is not None:
        text = _text_path(ctx, text, "draft.eval_text", "draft eval text")
    elif (first := first_text_set(eval_sets)) is not None:  # prompts are cut from text, not from chat JSONL
        text = first.text
    else:
        ctx.fail("draft.eval_text", "missing (and there is no plain-text gates eval set to take the text from)")
    min_acc = d.get("min_acceptance")
    if min_acc is not None:
        min_acc = ctx.number(min_acc, "draft.min_acceptance", "draft")
    prompts = ctx.number(d.get("prompts", 3), "draft.prompts", "draft")
    n_predict = ctx.number(d.get("n_predict", 96), "draft.n_predict", "draft")
    speedup, min_speedup = parse_speedup(ctx, d.get("speedup", True), d.get("min_speedup"))
    return Draft(source=source, gguf=gguf, outtype=d_outtype, quants=quants, pairs=tuple(pairs),
                 n_max=tuple(sorted(set(n_max))), eval_text=text, min_acceptance=min_acc, prompts=prompts,
                 n_predict=n_predict, mtp=mtp, speedup=speedup, min_speedup=min_speedup)


def _parse_conformance(ctx: _Ctx, value) -> Conformance:
    if value is False:
        return Conformance(enabled=False)
    if value is True:
        return Conformance()
    c = ctx.mapping(value, "conformance", CONFORMANCE_KEYS)
    enabled = ctx.boolean(c.get("enabled", True), "conformance.enabled")
    strict = ctx.boolean(c.get("strict", False), "conformance.strict")
    accept = c.get("accept", [])
    if not isinstance(accept, list) or not all(isinstance(a, str) for a in accept):
        ctx.fail("conformance.accept", f"must be a list of cause names, got {accept!r}")
    for a in accept:
        if a in CONFORMANCE_LIMITATIONS:
            ctx.fail("conformance.accept", f"{a} is a known llama.cpp limitation, a warning already (`strict: true` "
                                           "makes it a failure); accept names defects only")
        if a not in ACCEPTABLE_CAUSES:
            ctx.fail("conformance.accept", f"unknown cause {a!r} (known: {', '.join(ACCEPTABLE_CAUSES)})")
    if not enabled and (strict or accept):
        ctx.fail("conformance.strict" if strict else "conformance.accept",
                 "has no effect with conformance off (enabled: false): remove one of them")
    text = _text_path(ctx, c["text"], "conformance.text", "conformance text") if "text" in c else None
    chunks = ctx.number(c.get("chunks", 4), "conformance.chunks", "conformance")
    if text is not None:  # its own logits, at ctx 512 (pipeline/stages/conformance/stage.py)
        _fits_text(ctx, text, 512 * chunks, "conformance.chunks", f"ctx 512 x {chunks} chunks")
    return Conformance(enabled=enabled, chunks=chunks,
                       text=text, accept=tuple(sorted(set(accept))), strict=strict)
