"""Stage convert: HF folder -> F16/BF16 GGUF with llama.cpp's ``convert_hf_to_gguf.py``.

The converter runs as a subprocess of the pinned (or user-provided) llama.cpp tree, with the gguf-py
vendored beside it. Its well-known failures become one clear line saying what to do.

Multi-token-prediction (nextn / MTP) heads follow the recipe's ``mtp``: ``keep`` converts as the
converter does by default (heads in the file, for the models that have them); ``strip`` passes
``--no-mtp``; ``separate`` passes ``--no-mtp`` here and :func:`convert_mtp` runs a second pass with
``--mtp``, which writes only the heads (plus the token embedding, output norm and output matrix they
use) as a GGUF that llama.cpp loads as a ``--spec-type draft-mtp`` draft of the main model. The
converter accepts both flags only for architectures whose model class sets ``supports_mtp_export``
(b11312: Glm4Moe, Glm4vMoe, Glm4MoeLite, GlmMoeDsa, Glm5Next, DeepseekV32, DeepseekV4, Qwen3Next,
Qwen3_5, Qwen3_5Moe, MiMoV2(Flash), Step3p5/Step3p7, NemotronH, HYV3, BailingMoeV3(VL), Dots3Note,
MiniCPMV4_6); for the others it exits 1 with ``--mtp / --no-nextn are not supported for <arch>``.
With ``--outfile`` the file is written under exactly that name (the ``mtp-`` prefix of its help text
applies only when the converter names the file itself).
"""

from __future__ import annotations

import json
import re
import tempfile
from functools import cache
from pathlib import Path

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.fsutil import atomic_output
from pipeline.gguf import read_header
from pipeline.gguf.edit import override_changes, rewrite_metadata
from pipeline.provenance import python_versions
from pipeline.recipe import Recipe
from pipeline.records import ConvertRecord, MtpConvertRecord
from pipeline.stagedef import Stage, mem_mb
from pipeline.stages.mtp import MTP_KEYS, mtp_facts
from pipeline.tools import Toolchain, find_toolchain, run_converter, tail

# (pattern in the converter's output, message); the first match wins.
KNOWN_FAILURES = [
    (re.compile(r"BPE pre-tokenizer was not recognized"),
     "the tokenizer's BPE pre-tokenizer is unknown to llama.cpp b{build}; point LLAMA_CPP_DIR at a newer llama.cpp build"),
    (re.compile(r"Model (\S+) is not supported"),
     "architecture {0} is not supported by llama.cpp b{build}'s converter; if its layout is one the converter "
     "knows, set source.convert_as to that class (conformance then proves it), else point LLAMA_CPP_DIR at a newer "
     "llama.cpp build"),
    (re.compile(r"(?:SafetensorError|Error while deserializing header|incomplete metadata|header too large|"
                r"MetadataIncompleteBuffer|InvalidHeader\w*|Could not read complete metadata|"
                r"mmap length is greater than file size)"),
     "a safetensors file is corrupt or truncated ({0}); fetch the source again"),
    (re.compile(r"No such file or directory: '([^']*tokenizer[^']*)'|Can't load tokenizer|"
                r"tokenizer\.model not found|Error loading tokenizer"),
     "the tokenizer could not be loaded: check the source's tokenizer files"),
    (re.compile(r"--mtp / --no-nextn are not supported for (\S+)"),
     "mtp: {mtp}: llama.cpp b{build}'s converter cannot split multi-token-prediction heads off {0} models "
     "(--mtp / --no-mtp are refused for that architecture); set `mtp: keep`"),
    (re.compile(r"No space left on device"), "no space left on device while writing the GGUF"),
]

# Converter flags of the main (model) pass per recipe ``mtp`` mode.
MAIN_MTP_ARGS = {"keep": [], "strip": ["--no-mtp"], "separate": ["--no-mtp"]}
DRAFT_MTP_ARGS = ["--mtp"]


def explain_failure(output: str, build: int, mtp: str = "keep") -> str:
    for rx, msg in KNOWN_FAILURES:
        m = rx.search(output)
        if m:
            groups = [g for g in m.groups() if g] or [m.group(0)]
            return msg.format(*groups, build=build, mtp=mtp)
    return f"convert_hf_to_gguf.py failed: {tail(output)}"


def gguf_metadata(recipe: Recipe, quantized_by: str) -> dict:
    """general.* keys written into the GGUF (and inherited by every quant)."""
    meta = {"general.quantized_by": quantized_by}
    src = recipe.source
    if src.repo:
        meta["general.name"] = src.repo.split("/", 1)[1]
        meta["general.source.url"] = f"https://huggingface.co/{src.repo}"
        meta["general.source.huggingface.repository"] = src.repo
    else:
        meta["general.name"] = recipe.name
    return meta


_REGISTER = re.compile(r"@ModelBase\.register\(([^)]*)\)", re.S)


@cache
def converter_architectures(convert_script: Path) -> frozenset[str]:
    """The HF architecture names ``convert_hf_to_gguf.py`` (and its ``conversion/`` package) registers."""
    files = [convert_script, *sorted((convert_script.parent / "conversion").glob("*.py"))]
    names: set[str] = set()
    for f in files:
        try:
            text = f.read_text(encoding="utf-8")
        except OSError:
            continue
        for m in _REGISTER.finditer(text):
            names.update(re.findall(r"[\"']([^\"']+)[\"']", m.group(1)))
    if not names:
        raise PipelineError(f"{convert_script}: no @ModelBase.register(...) found: not a llama.cpp converter")
    return frozenset(names)


def check_convert_as(recipe: Recipe, tc: Toolchain) -> None:
    """Refuse, in one line naming the recipe and the field, a ``source.convert_as`` that the pinned converter does not
    register (the workflow checks every recipe before any job; the stage again, run by hand)."""
    name = recipe.source.convert_as
    if name is not None and name not in converter_architectures(tc.convert_script):
        raise RecipeError(recipe.path, "source.convert_as", f"{name!r} is not a model class the pinned converter "
                          f"(llama.cpp b{tc.build_number}) registers (@ModelBase.register in conversion/)")


def convert_as(recipe: Recipe, hf_dir: Path, tc: Toolchain) -> dict | None:
    """``source.convert_as``: {"class": the class the converter is told, "architectures": config.json's}; None
    without it."""
    name = recipe.source.convert_as
    if name is None:
        return None
    check_convert_as(recipe, tc)
    config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
    return {"class": name, "architectures": config.get("architectures")}


def _model_view(hf_dir: Path, view: Path, license: str | None, arch: dict | None = None) -> Path:
    """The folder the converter reads: ``hf_dir`` itself, or a view of symlinks to its files with what the recipe
    changes: a model card whose front matter carries ``license`` (the converter takes ``general.license`` only from
    the card, not from --metadata), a config.json whose ``architectures`` is ``arch["class"]`` (convert_as)."""
    if not license and not arch:
        return hf_dir
    view.mkdir()
    replaced = {"README.md"} if license else set()
    if arch:
        replaced.add("config.json")
        config = json.loads((hf_dir / "config.json").read_text(encoding="utf-8"))
        (view / "config.json").write_text(json.dumps({**config, "architectures": [arch["class"]]}, indent=2),
                                          encoding="utf-8")
    for item in hf_dir.iterdir():
        if item.name not in replaced and not item.name.startswith("."):
            (view / item.name).symlink_to(item.resolve())
    if not license:
        return view
    # yaml (slow): every CLI start loads this module, on devices too; only a license card needs it
    import yaml

    card = hf_dir / "README.md"
    body = card.read_text(encoding="utf-8", errors="replace") if card.is_file() else ""
    front: dict = {}
    if body.startswith("---\n") and "\n---" in body[4:]:
        head, _, rest = body[4:].partition("\n---")
        try:
            loaded = yaml.safe_load(head)
        except yaml.YAMLError:
            loaded = None
        if isinstance(loaded, dict):
            front, body = loaded, rest.split("\n", 1)[1] if "\n" in rest else ""
    front["license"] = license
    (view / "README.md").write_text("---\n" + yaml.safe_dump(front, sort_keys=True) + "---\n" + body, encoding="utf-8")
    return view


def _run(recipe: Recipe, hf_dir: Path, out_gguf: Path, extra: list[str], log: Path | None, quantized_by: str,
         tc: Toolchain, check=None) -> tuple[dict, float, dict | None]:
    """One converter pass into ``out_gguf`` (atomically); ``check(tmp_gguf)`` may refuse the result
    before it is renamed into place. Returns (general.* metadata written, seconds, :func:`convert_as`)."""
    if not (hf_dir / "config.json").is_file():
        raise PipelineError(f"{recipe.path}: convert: {hf_dir} has no config.json (run the fetch stage first)")
    meta = gguf_metadata(recipe, quantized_by)
    arch = convert_as(recipe, hf_dir, tc)
    with tempfile.TemporaryDirectory(prefix="ggufpipe-convert-") as tmpd, atomic_output(out_gguf) as tmp:
        meta_file = Path(tmpd) / "metadata.json"
        meta_file.write_text(json.dumps(meta))
        model_dir = _model_view(hf_dir, Path(tmpd) / "model", recipe.license, arch)
        args = [str(model_dir), "--outfile", str(tmp), "--outtype", recipe.outtype, "--metadata", str(meta_file), *extra]
        res = run_converter(tc, args, log)
        if res.returncode != 0 or not tmp.is_file():
            raise ToolError("convert_hf_to_gguf.py", res.returncode, log, f"{recipe.path}: convert: "
                            f"{explain_failure(res.output, tc.build_number, recipe.mtp)}" + (f" [log: {log}]" if log else ""))
        if check:
            check(tmp)
    return meta, res.seconds, arch


def convert(recipe: Recipe, hf_dir: str | Path, out_gguf: str | Path, record: str | Path,
            log: str | Path | None = None, quantized_by: str = "ggufpipe", tc: Toolchain | None = None) -> dict:
    """Entry function: convert ``hf_dir`` to ``out_gguf`` (recipe.outtype, MTP heads per recipe.mtp);
    write ``record``."""
    tc = tc or find_toolchain()
    hf_dir, out_gguf, record = Path(hf_dir), Path(out_gguf), Path(record)
    log = Path(log) if log else None
    extra = MAIN_MTP_ARGS[recipe.mtp]

    overrides = recipe.vocab_overrides

    def finish(tmp: Path) -> None:
        left = mtp_facts(tmp)["tensors"] if extra else 0
        if left:
            raise PipelineError(f"{recipe.path}: convert: mtp: {recipe.mtp}: the converter left {left} nextn tensors "
                                f"in {out_gguf.name} despite --no-mtp")
        if overrides:  # the fix path: written into the base, so that every quant made from it carries it
            tokens = read_header(tmp).metadata.get("tokenizer.ggml.tokens")
            rewrite_metadata(tmp, override_changes(overrides, getattr(tokens, "count", 0), str(recipe.path)))

    meta, seconds, arch = _run(recipe, hf_dir, out_gguf, extra, log, quantized_by, tc, finish)
    rec = ConvertRecord(outtype=recipe.outtype, tool="convert_hf_to_gguf.py", toolchain=tc.describe(),
                        python=python_versions(env="converter"), gguf_metadata=meta, seconds=round(seconds, 1))
    if arch:
        rec.convert_as = arch
    if recipe.mtp != "keep":
        rec.mtp = {"mode": recipe.mtp, "converter_args": extra}
    if overrides:
        rec.vocab_overrides = overrides
    rec.write(record)
    return rec.to_dict()


def convert_mtp(recipe: Recipe, hf_dir: str | Path, out_gguf: str | Path, record: str | Path,
                log: str | Path | None = None, quantized_by: str = "ggufpipe", tc: Toolchain | None = None) -> dict:
    """Entry function (``mtp: separate``): export only the MTP heads of ``hf_dir`` to ``out_gguf``
    (``--mtp``), a draft for llama.cpp's ``--spec-type draft-mtp``; write ``record``. A model without
    MTP heads is refused: the converter would write a draft holding none."""
    if recipe.mtp != "separate":
        raise PipelineError(f"{recipe.path}: mtp: {recipe.mtp}: the MTP draft is exported only with `mtp: separate`")
    tc = tc or find_toolchain()
    hf_dir, out_gguf, record = Path(hf_dir), Path(out_gguf), Path(record)
    log = Path(log) if log else None
    facts: dict = {}

    def has_heads(tmp: Path) -> None:
        facts.update(mtp_facts(tmp))
        if not facts["tensors"]:
            raise PipelineError(f"{recipe.path}: convert: mtp: separate: the model has no multi-token-prediction heads "
                                "(the converter's --mtp export holds no nextn tensors); set `mtp: keep`")
        if recipe.vocab_overrides:  # the draft carries the model's vocabulary: the same fix-path keys
            tokens = read_header(tmp).metadata.get("tokenizer.ggml.tokens")
            rewrite_metadata(tmp, override_changes(recipe.vocab_overrides, getattr(tokens, "count", 0),
                                                   str(recipe.path)))

    meta, seconds, _ = _run(recipe, hf_dir, out_gguf, DRAFT_MTP_ARGS, log, quantized_by, tc, has_heads)
    rec = MtpConvertRecord(outtype=recipe.outtype, tool="convert_hf_to_gguf.py", converter_args=DRAFT_MTP_ARGS,
                           toolchain=tc.describe(), python=python_versions(env="converter"), gguf_metadata=meta,
                           mtp={k: facts[k] for k in MTP_KEYS}, seconds=round(seconds, 1))
    rec.write(record)
    return rec.to_dict()


def _trigger(r, wc, s) -> dict:
    # convert_as only when set: a recipe without it keeps its trigger
    extra = {"convert_as": r.source.convert_as} if r.source.convert_as else {}
    return {"outtype": r.outtype, "license": r.license, "mtp": r.mtp, **extra, "quantized_by": s.quantized_by,
            "build": s.build_number, "commit": s.commit, "vocab_overrides": r.vocab_overrides}


def _resources(disk: float) -> dict:
    return {"mem_mb": lambda s: mem_mb(s.total, 1.5), "disk_mb": lambda s: mem_mb(s.total, disk),
            "runtime": lambda s: int(30 + s.total / 100)}


def _convert(j, fn) -> None:
    fn(j.recipe, j.input["hf"], j.output["gguf"], j.output["record"], log=j.log, quantized_by=j.options["quantized_by"])


CONVERT = Stage(
    "convert", "convert", order=20, log="convert-{outtype}", wildcards=("outtype",), options=("quantized_by",),
    run=lambda j: _convert(j, convert), inputs=lambda r, wc, L: {"hf": L.hf(r.name)},
    outputs=lambda L: {"gguf": L.gguf("{name}", "{outtype}"), "record": L.convert_record_at("{name}", "{outtype}")},
    trigger=_trigger, resources=_resources(2.5), envs=("converter",),
)
CONVERT_MTP = Stage(
    "convert_mtp", "convert-mtp", order=21, log="convert-mtp-{outtype}", wildcards=("outtype",),
    options=("quantized_by",), run=lambda j: _convert(j, convert_mtp), inputs=lambda r, wc, L: {"hf": L.hf(r.name)},
    outputs=lambda L: {"gguf": L.mtp_gguf_at("{name}", "{outtype}"), "record": L.mtp_record_at("{name}", "{outtype}")},
    trigger=_trigger, resources=_resources(1.5), envs=("converter",),
)
CONVERT_AWQ = Stage(
    "convert_awq", "convert-awq", order=31, log="convert-{outtype}-awq", wildcards=("outtype",),
    options=("quantized_by",), run=lambda j: _convert(j, convert), inputs=lambda r, wc, L: {"hf": L.hf_awq(r.name)},
    outputs=lambda L: {"gguf": L.awq_gguf_at("{name}", "{outtype}"),
                       "record": L.awq_convert_record_at("{name}", "{outtype}")},
    trigger=_trigger, resources=_resources(2.5), envs=("converter",),
)
