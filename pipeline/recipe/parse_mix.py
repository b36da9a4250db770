"""Parsing measured mixes (``quants[]`` with ``type: mix``) and their ``sensitivity:`` section (docs/mixes.md).
(see pipeline/recipe/__init__.py)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from pipeline.gguf.types import type_bpw
from pipeline.recipe import naming
from pipeline.recipe.mix import MIX_BUDGETS, MIX_CANDIDATES, MIX_CANDIDATES_IMATRIX, MIX_FLOOR, MIX_TARGETS
from pipeline.recipe.model import (
    SENSITIVITY_KEYS,
    SHA256_RE,
    VARIANT_RE,
    Mix,
    Quant,
    Sensitivity,
)
from pipeline.recipe.parse_base import (
    _check_quant_type,
    _Ctx,
    _file_sha256,
    _fits_text,
    _parse_quant_gates,
    _parse_split,
    _text_path,
)
from pipeline.recipe.quant_types import gguf_file_types
from pipeline.recipe.tensor_map import GGML_TYPE_NAMES

# keys only a mix has, and keys a mix refuses (its solved map sets every quantized tensor's type)
MIX_KEYS = ("label", "budget", "target", "candidates")
NOT_WITH_MIX = ("variant", "output_tensor_type", "token_embedding_type", "tensor_types", "tensor_types_file", "pure",
                "leave_output_tensor")


def _mix_label(ctx: _Ctx, value, where: str, known, build) -> tuple[str, str]:
    """A mix's label ``<TYPE>_<VARIANT>`` (``Q4_K_M_MIX``): the file name's label under the Hub naming rule
    (pipeline/recipe/naming.py), and TYPE, the llama-quantize type it is written as (``general.file_type``)."""
    label = ctx.string(value, where).strip().upper()
    types = (known or set()) | set(gguf_file_types())
    for i in range(len(label) - 1, 0, -1):
        if label[i] == "_" and label[:i] in types and VARIANT_RE.match(label[i + 1:]):
            qtype = _check_quant_type(ctx, label[:i], where, known, build)
            if label in naming.HUB_FILE_TYPES or label in types:
                break
            return qtype, label[i + 1:]
    ctx.fail(where, f"{label!r} is not `<TYPE>_<VARIANT>` (a quant type, `_`, 1-24 letters, e.g. Q4_K_M_MIX): a mix "
                    "is labelled by the stock type it stands in for, never by that type's own name")
    raise AssertionError


def _parse_mix(ctx: _Ctx, d: dict, where: str, known, build, set_names: set[str]) -> Quant:
    """``{type: mix, label: Q4_K_M_MIX, budget: {size_of: Q4_K_M}}`` (or ``{bpw: N}``, ``{max_mb: N}``), or with
    ``target: {max_kld_mean: X}``; candidates are checked in :func:`_parse_quants` (they depend on the imatrix)."""
    for key in NOT_WITH_MIX:
        if key in d:
            ctx.fail(f"{where}.{key}", "not with `type: mix`: its solved map sets every quantized tensor's type")
    if "label" not in d:
        ctx.fail(f"{where}.label", "missing (a mix is published as `<name>-<LABEL>.gguf`, e.g. label Q4_K_M_MIX)")
    qtype, variant = _mix_label(ctx, d["label"], f"{where}.label", known, build)
    if ("budget" in d) == ("target" in d):
        ctx.fail(where, "a mix needs exactly one of `budget` (best quality within a size) or `target` (smallest file "
                        "meeting a quality)")
    budget = target = None
    if "budget" in d:
        b = ctx.mapping(d["budget"], f"{where}.budget", set(MIX_BUDGETS))
        if len(b) != 1:
            ctx.fail(f"{where}.budget", f"exactly one of {', '.join(MIX_BUDGETS)}")
        (k, v), = b.items()
        w = f"{where}.budget.{k}"
        if k == "size_of":
            v = _check_quant_type(ctx, ctx.string(v, w), w, known, build)
        else:
            v = float(ctx.number(v, w, "quants[]", "budget", k))
        budget = (k, v)
    else:
        t = ctx.mapping(d["target"], f"{where}.target", set(MIX_TARGETS))
        if len(t) != 1:
            ctx.fail(f"{where}.target", f"exactly one of {', '.join(MIX_TARGETS)}")
        (k, v), = t.items()
        target = (k, float(ctx.number(v, f"{where}.target.{k}", "quants[]", "target", k)))
    cands: tuple[str, ...] = ()
    if "candidates" in d:
        raw = d["candidates"]
        if not isinstance(raw, list) or not raw:
            ctx.fail(f"{where}.candidates", "must be a non-empty list of ggml tensor types (e.g. [Q4_K, Q5_K, Q6_K])")
        out = []
        for j, c in enumerate(raw):
            name = ctx.string(c, f"{where}.candidates[{j}]").lower()
            if name not in GGML_TYPE_NAMES or GGML_TYPE_NAMES[name] in ("F32", "F16", "BF16"):
                ctx.fail(f"{where}.candidates[{j}]", f"{c!r} is not a quantized ggml tensor type (e.g. Q4_K, IQ4_XS)")
            if GGML_TYPE_NAMES[name] in out:
                ctx.fail(f"{where}.candidates[{j}]", f"{c!r} is listed twice")
            out.append(GGML_TYPE_NAMES[name])
        cands = tuple(out)
    kw: dict[str, Any] = {}
    if "gates" in d:
        kw["gates"] = _parse_quant_gates(ctx, d["gates"], f"{where}.gates", set_names)
    for key in ("awq", "imatrix"):
        if key in d:
            kw[key] = ctx.boolean(d[key], f"{where}.{key}")
    if "split" in d:
        kw["split"] = _parse_split(ctx, d["split"], f"{where}.split", allow_false=True)
    return Quant(type=qtype, variant=variant, mix=Mix(candidates=cands, budget=budget, target=target), **kw)


def _check_mix(ctx: _Ctx, q: Quant, where: str, floor: str) -> Quant:
    """A mix's candidates (the default ladder when it names none) against its importance matrix and budget."""
    cands = q.mix.candidates or (MIX_CANDIDATES_IMATRIX if q.imatrix else MIX_CANDIDATES)
    for j, c in enumerate(cands):
        w = f"{where}.candidates[{j}]" if q.mix.candidates else f"{where}.candidates"
        if c.startswith("IQ") and not q.imatrix:
            ctx.fail(w, f"{c} only with an importance matrix (`imatrix: true` and a top-level `imatrix:`)")
        if type_bpw(c) >= type_bpw(floor):
            ctx.fail(w, f"{c} ({type_bpw(c):g} bpw) is not below the floor {floor} ({type_bpw(floor):g} bpw), which "
                        "every group may keep anyway")
    if q.mix.budget and q.mix.budget[0] == "size_of":
        ref = q.mix.budget[1]
        bpw = type_bpw(_main_tensor_type(ref))
        lo = min(cands, key=type_bpw)
        if not type_bpw(lo) <= bpw <= type_bpw(floor):
            ctx.fail(f"{where}.budget.size_of", f"{ref} ({bpw:g} bpw) is outside what these candidates and the floor "
                                                f"can make ({lo} {type_bpw(lo):g} to {floor} {type_bpw(floor):g} bpw)")
    return replace(q, mix=replace(q.mix, candidates=tuple(cands)))


def _main_tensor_type(ftype: str) -> str:
    """The ggml type most tensors of a llama-quantize type get (``Q4_K_M`` -> ``Q4_K``): its nominal size."""
    special = {"IQ3_M": "IQ3_S", "IQ2_M": "IQ2_S", "Q2_K_S": "Q2_K", "IQ3_XS": "IQ3_S"}
    if ftype in special:
        return special[ftype]
    t = ftype
    while t.lower() not in GGML_TYPE_NAMES and "_" in t:
        t = t.rsplit("_", 1)[0]
    return GGML_TYPE_NAMES.get(t.lower(), "Q8_0")


def _parse_sensitivity(ctx: _Ctx, value, eval_sets) -> Sensitivity:
    """``sensitivity:``: its own text (never a gate text), ctx x chunks, bands of layers and the floor type."""
    d = ctx.mapping(value, "sensitivity", SENSITIVITY_KEYS)
    if "text" not in d:
        ctx.fail("sensitivity.text", "missing (a text file the gates never score)")
    path = _text_path(ctx, d["text"], "sensitivity.text", "sensitivity text")
    digest = _file_sha256(path)
    pin = d.get("text_sha256")
    if pin is not None:
        pin = ctx.string(pin, "sensitivity.text_sha256", SHA256_RE, "a SHA256 (64 lowercase hex)")
        if pin != digest:
            ctx.fail("sensitivity.text_sha256", f"{path.name} has SHA256 {digest}, not the pinned {pin}")
    for es in eval_sets:
        if _file_sha256(es.text) == digest:
            ctx.fail("sensitivity.text", f"{path.name} is the eval text of gates {es.name!r} (same SHA256 "
                                         f"{digest[:12]}...): the solver would tune on the text the gates judge; "
                                         "measure on a different text")
    ctx_len = ctx.number(d.get("ctx", 512), "sensitivity.ctx", "sensitivity")
    chunks = ctx.number(d.get("chunks", 4), "sensitivity.chunks", "sensitivity")
    _fits_text(ctx, path, ctx_len * chunks, "sensitivity.chunks", f"ctx {ctx_len} x {chunks} chunks")
    bands = ctx.number(d.get("bands", 8), "sensitivity.bands", "sensitivity")
    floor = ctx.string(d.get("floor", MIX_FLOOR), "sensitivity.floor").lower()
    if floor not in GGML_TYPE_NAMES or GGML_TYPE_NAMES[floor] in ("F32", "BF16"):
        ctx.fail("sensitivity.floor", f"{floor!r} is not a ggml tensor type (e.g. Q8_0, F16)")
    search = ctx.choice(d.get("search", "exhaustive"), "sensitivity.search", ("exhaustive", "screened", "fisher"))
    return Sensitivity(text=path, text_sha256=digest, ctx=ctx_len, chunks=chunks, bands=bands,
                       floor=GGML_TYPE_NAMES[floor], search=search)
