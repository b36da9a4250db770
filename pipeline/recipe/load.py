"""Entry points: :func:`load_recipe` (one file, validated, with the naming check) and :func:`load_recipes`. (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from pipeline import yamlfile
from pipeline.errors import RecipeError
from pipeline.fsutil import read_input
from pipeline.gguf.vocab_defaults import BPE_PRE_NAMES
from pipeline.recipe import naming
from pipeline.recipe.devices import parse_devices
from pipeline.recipe.model import MTP_MODES, NAME_RE, OUTTYPES, TOP_KEYS, Conformance, Recipe
from pipeline.recipe.parse import (
    _parse_awq,
    _parse_conformance,
    _parse_draft,
    _parse_eval_sets,
    _parse_imatrix,
    _parse_publish,
    _parse_quants,
    _parse_source,
)
from pipeline.recipe.parse_base import _Ctx, _parse_split, _text_path
from pipeline.recipe.parse_mix import _parse_sensitivity
from pipeline.recipe.quant_types import known_quant_types

RECIPE_MAX_BYTES = 1 << 20  # the largest recipe in recipes/ is under 10 kB


def load_recipe(path: str | Path, quantize_exe: str | None = None) -> Recipe:
    """Read and validate one recipe. ``quantize_exe`` enables the check against llama-quantize."""
    path = Path(path)
    ctx = _Ctx(path)
    raw_bytes, data = _read_yaml(path)
    d, name = _parse_top_level(ctx, data)
    source = _parse_source(ctx, d["source"], "source")
    outtype = ctx.choice(d.get("outtype", "f16"), "outtype", OUTTYPES)
    mtp = ctx.choice(d.get("mtp", "keep"), "mtp", MTP_MODES)
    if "quants" in d and not isinstance(d["quants"], list):
        ctx.fail("quants", "must be a non-empty list")
    # the checks run in the order of the fields below: the first failure is the one-line message
    quant_fields = _parse_quant_fields(ctx, d, quantize_exe, outtype, mtp)
    other_fields = _parse_other_fields(ctx, d, quant_fields["eval_sets"])
    recipe = Recipe(
        path=path,
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        name=name,
        source=source,
        outtype=outtype,
        mtp=mtp,
        **quant_fields,
        **other_fields,
        raw=d,
    )
    _check_published_names(ctx, recipe)
    return recipe


def _read_yaml(path: Path) -> tuple[bytes, object]:
    """The file's bytes (hashed into the recipe) and its parsed YAML."""
    # yaml (slow): the device commands load this module but read no recipe
    import yaml

    try:
        raw_bytes = read_input(path, RECIPE_MAX_BYTES)
    except OSError as exc:
        raise RecipeError(path, None, f"cannot read recipe: {exc.strerror}") from exc
    except ValueError as exc:
        raise RecipeError(path, None, f"cannot read recipe: {exc}") from None
    try:
        data = yamlfile.load(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise RecipeError(path, None, "not UTF-8 text") from None
    except yamlfile.YAMLInputError as exc:
        raise RecipeError(path, f"line {exc.line}" if exc.line else "YAML", exc.message) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        raise RecipeError(path, where, f"malformed YAML: {getattr(exc, 'problem', None) or exc}") from None
    return raw_bytes, data


def _parse_top_level(ctx: _Ctx, data) -> tuple[dict, str]:
    """The top-level mapping (known keys, required ones present) and the recipe's name."""
    if data is None:
        ctx.fail("recipe", "file is empty")
    d = ctx.mapping(data, "", TOP_KEYS)
    for req in ("name", "source", "quants"):
        if req not in d:
            ctx.fail(req, "missing")
    name = ctx.string(d["name"], "name", NAME_RE, "a valid name (lowercase slug: a-z 0-9 . _ -, starting with a letter or digit)")
    if ".." in name:
        ctx.fail("name", f"{name!r} must not contain '..'")
    return d, name


def _parse_quant_fields(ctx: _Ctx, d: dict, quantize_exe: str | None, outtype: str, mtp: str) -> dict:
    """Eval sets, the quants and the sections they depend on (awq, imatrix, split, sensitivity, draft)."""
    eval_sets = _parse_eval_sets(ctx, d["gates"]) if "gates" in d else ()
    set_names = {es.name for es in eval_sets}
    bench = ctx.boolean(d.get("bench", True), "bench")
    known = build = None
    if quantize_exe:
        known_set, build = known_quant_types(quantize_exe)
        known = set(known_set)
    awq = _parse_awq(ctx, d["awq"], eval_sets) if "awq" in d else None
    imatrix = _parse_imatrix(ctx, d["imatrix"], eval_sets) if "imatrix" in d else None
    split = _parse_split(ctx, d["split"], "split") if "split" in d and d["split"] is not None else None
    sensitivity = _parse_sensitivity(ctx, d["sensitivity"], eval_sets) if "sensitivity" in d else None
    quants = _parse_quants(ctx, d["quants"], "quants", known, build, set_names, awq is not None, imatrix is not None,
                           split, sensitivity)
    if sensitivity is not None and not any(q.mix for q in quants):
        ctx.fail("sensitivity", "no quant is a mix (`type: mix`): nothing would use the measurement")
    draft = _parse_draft(ctx, d["draft"], quants, eval_sets, known, build, outtype, mtp) if "draft" in d else None
    return {"eval_sets": eval_sets, "bench": bench, "awq": awq, "imatrix": imatrix, "split": split,
            "sensitivity": sensitivity, "quants": quants, "draft": draft}


def _parse_other_fields(ctx: _Ctx, d: dict, eval_sets: tuple) -> dict:
    """Publish, conformance, the fix path (template, eos ids, add_bos), devices and the free-text fields."""
    publish = _parse_publish(ctx, d["publish"]) if "publish" in d else None
    conformance = _parse_conformance(ctx, d["conformance"]) if "conformance" in d else Conformance()
    template = (_text_path(ctx, d["chat_template_override"], "chat_template_override", "chat template")
                if d.get("chat_template_override") is not None else None)
    eos_ids = _parse_eos_token_ids(ctx, d)
    add_bos = ctx.boolean(d["add_bos"], "add_bos") if d.get("add_bos") is not None else None
    pre = None
    if d.get("tokenizer_pre") is not None:
        pre = ctx.string(d["tokenizer_pre"], "tokenizer_pre")
        if pre not in BPE_PRE_NAMES:
            ctx.fail("tokenizer_pre", f"{pre!r} is not a BPE pre-tokenizer llama.cpp b11312 knows "
                                      "(src/llama-vocab.cpp; e.g. llama-bpe, qwen2, minicpm5)")
    devices = parse_devices(ctx, d.get("devices"))
    auto = next((i for i, dev in enumerate(devices) if dev.kv_type == "auto"), None)
    if auto is not None and not any(es.kv_types for es in eval_sets):
        ctx.fail(f"devices[{auto}].kv_type", "auto takes the smallest KV type measured inside the thresholds: it "
                                            "needs a gates eval set with kv_types (e.g. [f16, q8_0, q4_0])")
    device_slice = _parse_device_slice(ctx, d, eval_sets)
    for key in ("description", "license"):
        if key in d and d[key] is not None:
            ctx.string(d[key], key)
    return {"publish": publish, "conformance": conformance, "chat_template_override": template,
            "eos_token_ids": eos_ids, "add_bos": add_bos, "tokenizer_pre": pre, "devices": devices,
            "device_slice": device_slice, "description": d.get("description"), "license": d.get("license")}


def _parse_eos_token_ids(ctx: _Ctx, d: dict) -> tuple[int, ...] | None:
    if d.get("eos_token_ids") is None:
        return None
    ids = d["eos_token_ids"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= 3:
        ctx.fail("eos_token_ids", f"must be a list of 1 to 3 token ids (eos, eot, eom), got {ids!r}")
    return tuple(ctx.number(v, f"eos_token_ids[{i}]", "") for i, v in enumerate(ids))


def _parse_device_slice(ctx: _Ctx, d: dict, eval_sets: tuple) -> int:
    """Chunks of the first eval set for `ggufpipe device-check`: up to 2 by default, 0 without gates."""
    if d.get("device_slice") is None:
        return min(2, eval_sets[0].chunks) if eval_sets else 0
    device_slice = ctx.number(d["device_slice"], "device_slice", "")
    if device_slice > 2:
        ctx.fail("device_slice", f"must be 0, 1 or 2 (chunks of the first eval set), got {device_slice}")
    if device_slice and not eval_sets:
        ctx.fail("device_slice", "needs a `gates:` section (the slice is cut from its first eval set)")
    if device_slice > (eval_sets[0].chunks if eval_sets else 0):
        ctx.fail("device_slice", f"{device_slice} chunks, the first eval set {eval_sets[0].name!r} has "
                                 f"{eval_sets[0].chunks}")
    return device_slice


def _check_published_names(ctx: _Ctx, recipe: Recipe) -> None:
    # names both resolvers read right, in the recipe's repository and in its draft's (pipeline/recipe/naming.py)
    for r, where in ((recipe, "quants"), (recipe.draft_recipe(), "draft.quants")):
        if r is not None:
            problems = naming.check_repo(r.published_names(where))
            if problems:
                ctx.fail(where, f"file names collide: {problems[0]}")


def load_recipes(folder: str | Path, quantize_exe: str | None = None) -> list[Recipe]:
    """All ``*.yaml`` recipes of a folder, with names checked to be unique."""
    folder = Path(folder)
    recipes = [load_recipe(p, quantize_exe) for p in sorted(folder.glob("*.yaml"))]
    by_name: dict[str, Path] = {}
    for r in recipes:
        if r.name in by_name:
            raise RecipeError(r.path, "name", f"{r.name!r} is already used by {by_name[r.name]}")
        by_name[r.name] = r.path
    return recipes
