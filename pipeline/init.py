"""``ggufpipe init``: a starter recipe for a Hugging Face checkpoint (docs/init.md).

:func:`inspect_source` reads a local HF folder, or ``org/name[@revision]`` from the local hub cache (offline; the
revision pinned to the snapshot's commit), and refuses in one line what the build would refuse or cannot convert:
no ``config.json``, custom code (``auto_map``) or pickled-only weights without the matching opt-in, an architecture
the pinned converter does not register (the names of ``@ModelBase.register(...)`` in ``convert_hf_to_gguf.py`` and
its ``conversion/`` package, parsed as text, never imported). :func:`estimate_memory` predicts, before any GGUF
exists, the memory llama.cpp's CPU build takes to run a stock quant at a context size: the one memory model,
:func:`pipeline.memory.components`, of the quant's :func:`pipeline.devices.plan.model_shape` (config.json,
the safetensors headers and llama-quantize's type choice as ``ggufpipe plan`` condenses it). :func:`render` writes
the recipe text.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.devices.plan import model_shape
from pipeline.devices.plan_source import CONFIG_INTS, Facts, source_facts
from pipeline.errors import PipelineError
from pipeline.fsutil import parse_json, read_input
from pipeline.memory import components
from pipeline.recipe.devices import Device
from pipeline.recipe.load import load_recipe
from pipeline.stages.convert import converter_architectures
from pipeline.stages.fetch import PICKLE_PATTERNS, _wanted, check_safetensors, hub_snapshot_dir, read_config

# Stock quants a device suggestion chooses from, largest first (no IQ types: they need an importance matrix).
STOCK_QUANTS = ("Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q3_K_M", "Q2_K")
DEFAULT_QUANTS = ("Q8_0", "Q4_K_M")
MTP_CONFIG_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "mtp_num_layers")
_SAFETENSORS_DTYPES = {"F32": 4, "F16": 2, "BF16": 2, "F64": 8, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                       "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass
class CheckpointFacts:
    """What :func:`inspect_source` read from a checkpoint folder (a recipe's ``source:`` is recipe.model.Source)."""

    folder: Path
    config: dict
    tensors: dict[str, tuple[str, tuple[int, ...]]]  # name -> (safetensors dtype, shape)
    repo: str | None = None
    commit: str | None = None
    architecture: str = ""
    mtp_layers: int = 0
    mtp_key: str | None = None
    chat_template: str | None = None  # where it was found
    license: str | None = None
    license_from: str | None = None
    pickles: list[str] = field(default_factory=list)
    facts: Facts | None = None  # what ggufpipe plan reads of the checkpoint (pipeline.devices.plan.source_facts), once

    def text_config(self) -> dict:
        tc = self.config.get("text_config")
        return {**self.config, **tc} if isinstance(tc, dict) else self.config


# ------------------------------------------------------------------ the pinned converter's architectures

def model_architecture(config: dict) -> str:
    """The architecture the converter looks up (conversion/base.py get_model_architecture, text model)."""
    arches = config.get("architectures") or []
    tc = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    if tc.get("architectures"):
        arches = tc["architectures"]
    if not isinstance(arches, list) or not all(isinstance(a, str) for a in arches):
        return ""  # refused by the caller: it names no architecture the converter could look up
    return arches[0] if arches else ""


# ------------------------------------------------------------------ reading the source

def resolve(spec: str, hub_cache: Path | None = None) -> tuple[Path, str | None, str | None]:
    """``spec`` -> (folder, repo, commit): a local folder, or ``org/name[@revision]`` in the local hub cache."""
    if Path(spec).expanduser().is_dir():
        return Path(spec).expanduser().resolve(), None, None
    repo, _, revision = spec.partition("@")
    if not re.fullmatch(r"[A-Za-z0-9][\w.-]*/[\w.-]+", repo):
        raise PipelineError(f"{spec}: neither a folder nor a Hugging Face repo id (org/name[@revision])")
    if hub_cache is None:
        home = Path(os.environ.get("HF_HOME") or Path.home() / ".cache" / "huggingface")
        hub_cache = Path(os.environ.get("HF_HUB_CACHE") or home / "hub")
    snap = hub_snapshot_dir(hub_cache, repo, revision or "main")
    if not snap.is_dir():
        raise PipelineError(f"{spec}: not in the local hub cache {hub_cache} (revision {revision or 'main'}): download "
                            f"it first (`huggingface-cli download {repo}`) or give a local folder")
    if not re.fullmatch(r"[0-9a-f]{40}", snap.name):
        raise PipelineError(f"{spec}: the hub cache's snapshot {snap.name!r} is not a commit SHA: cannot pin it")
    return snap, repo, snap.name


def _files(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                  if (p.is_file() or p.is_symlink()) and not any(s.startswith(".") for s in p.relative_to(folder).parts))


def _text(path: Path, limit: int = 1 << 20) -> str | None:
    """A small optional file of the checkpoint (model card, tokenizer config) as text; None when it is not there or
    not a regular UTF-8 file (a FIFO is never waited for)."""
    try:
        return read_input(path, limit).decode("utf-8")
    except (OSError, ValueError):  # UnicodeDecodeError too
        return None


def _front_matter(readme: Path) -> dict:
    import yaml

    text = _text(readme)
    if text is None:
        return {}
    m = re.match(r"---\s*\n(.*?)\n---\s*(\n|$)", text, re.S)
    try:
        data = yaml.safe_load(m.group(1)) if m else None
    except (yaml.YAMLError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def inspect_source(spec: str, convert_script: Path, build: int, allow_pickle: bool = False,
                   trust_remote_code: bool = False, hub_cache: Path | None = None) -> CheckpointFacts:
    """Read and check the checkpoint ``spec``; refuse in one line what the build could not use."""
    folder, repo, commit = resolve(spec, hub_cache)
    files = _files(folder)
    config = read_config(folder, files, spec)
    _check_numbers(config, spec)
    if "auto_map" in config and not trust_remote_code:
        raise PipelineError(f"{spec}: config.json needs custom code (auto_map): the recipe needs "
                            "source.trust_remote_code: true; pass --trust-remote-code only if you trust it")
    pickles = [f for f in files if _wanted(f, PICKLE_PATTERNS) and not f.endswith(".json")]
    weights = [f for f in files if f.endswith(".safetensors")]
    if not weights and pickles and not allow_pickle:
        raise PipelineError(f"{spec}: only pickled weights ({pickles[0]}), which can run code when loaded: the recipe "
                            "needs source.allow_pickle: true; pass --allow-pickle only if you trust them")
    if not weights and not pickles:
        raise PipelineError(f"{spec}: no *.safetensors weights in {folder}")
    arch = model_architecture(config)
    if not arch:
        raise PipelineError(f"{spec}: config.json names no architecture (`architectures`: a list of class names): the "
                            "converter cannot pick a model class")
    if arch not in converter_architectures(convert_script):
        raise PipelineError(f"{arch} is not supported by the pinned llama.cpp converter (b{build}); it needs a llama.cpp "
                            f"build whose convert_hf_to_gguf.py registers {arch}: set LLAMA_CPP_DIR to such a build")
    tensors: dict[str, tuple[str, tuple[int, ...]]] = {}
    for f in weights:
        for name, t in check_safetensors(folder / f, f"{spec}: source").items():  # checked, then read once
            if name == "__metadata__":
                continue
            shape = t.get("shape") if isinstance(t, dict) else None
            if not (isinstance(shape, list) and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                    for x in shape)):
                raise PipelineError(f"{spec}: {f}: tensor {name[:80]!r} has no shape of non-negative integers: "
                                    "corrupt safetensors header")
            tensors[name] = (str(t.get("dtype")), tuple(shape))
    src = CheckpointFacts(folder, config, tensors, repo, commit, arch, pickles=pickles)
    tc = src.text_config()
    for key in MTP_CONFIG_KEYS:
        if isinstance(tc.get(key), int) and not isinstance(tc[key], bool) and tc[key] > 0:
            src.mtp_layers, src.mtp_key = tc[key], key
            break
    if "chat_template.jinja" in files:
        src.chat_template = "chat_template.jinja"
    elif "chat_template.json" in files:
        src.chat_template = "chat_template.json"
    else:
        text = _text(folder / "tokenizer_config.json", 64 << 20)
        try:
            tok = parse_json(text) if text is not None else None
        except ValueError:
            tok = None
        if isinstance(tok, dict) and tok.get("chat_template"):
            src.chat_template = "tokenizer_config.json"
    card = _front_matter(folder / "README.md")
    lic = card.get("license") or config.get("license")
    if isinstance(lic, list):
        lic = lic[0] if lic else None
    if isinstance(lic, str) and lic.strip():
        src.license = lic.strip()
        src.license_from = "the model card (README.md)" if card.get("license") else "config.json"
    return src


# the config.json numbers init reads itself (the estimates read the rest: pipeline.devices.plan.check_config)
_INIT_NUMBERS = ("max_position_embeddings", *MTP_CONFIG_KEYS)


def _check_numbers(config: dict, spec: str) -> None:
    tc = config.get("text_config")
    for where, cfg in (("config.json", config), ("config.json: text_config", tc if isinstance(tc, dict) else {})):
        for key in _INIT_NUMBERS:
            v = cfg.get(key)
            if v is not None and key in CONFIG_INTS:
                CONFIG_INTS[key].check(v, f"{spec}: {where}: {key}")
            elif v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 16):
                raise PipelineError(f"{spec}: {where}: {key}: must be a layer count 0..65536, got {v!r:.60}")


def checkpoint_dtype(src: CheckpointFacts) -> str:
    """The dtype that holds most of the checkpoint's parameters (safetensors), else config's torch_dtype."""
    count: dict[str, int] = {}
    for dtype, shape in src.tensors.values():
        count[dtype] = count.get(dtype, 0) + math.prod(shape)
    if count:
        return max(count, key=count.get)
    return {"bfloat16": "BF16", "float16": "F16"}.get(str(src.config.get("torch_dtype") or src.config.get("dtype")), "F32")


def slug(text: str) -> str:
    s = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    s = re.sub(r"\.\.+", ".", s)[:64].strip("-._")
    return s or "model"


# ------------------------------------------------------------------ memory estimate before any GGUF exists

def estimate_memory(src: CheckpointFacts, ftype: str, ctx: int, arch: str = "x86_64", kv_type: str = "f16") -> dict:
    """Predicted peak RSS (bytes) of ``llama-bench -p ctx`` on the pinned CPU build for the ``ftype`` quant of
    ``src``: :func:`pipeline.memory.components` of the GGUF :func:`pipeline.devices.plan.model_shape`
    predicts (docs/init.md)."""
    if src.facts is None:
        src.facts = source_facts(src.folder)
    return components(model_shape(src.facts, ftype), ctx, kv_type, arch)


def suggest(src: CheckpointFacts, device: Device) -> tuple[str | None, dict[str, int]]:
    """The largest stock quant whose estimated memory fits ``device`` (None: none does), and every estimate."""
    est = {q: estimate_memory(src, q, device.ctx, device.arch)["total"] for q in STOCK_QUANTS}
    return next((q for q in STOCK_QUANTS if est[q] <= device.memory_bytes), None), est


# ------------------------------------------------------------------ the recipe text

def _q(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def render(src: CheckpointFacts, name: str, out: Path, gates_text: Path, quants: list[str], devices: list[Device],
           build: int, allow_pickle: bool, trust_remote_code: bool) -> str:
    mib = 1 << 20
    where = f"{src.repo}@{src.commit}" if src.repo else str(src.folder)
    lines = [f"# Starter recipe written by `ggufpipe init` from {where} (llama.cpp converter b{build}).",
             "# Every choice below is commented; edit it, then `ggufpipe validate` and `ggufpipe build` it.",
             f"name: {name}",
             f"description: {_q((src.repo or src.folder.name) + ', GGUF')}"]
    if src.license:
        lines += [f"license: {_q(src.license)}  # from {src.license_from}"]
    else:
        lines += ["# license: no license found in the model card or config.json; set one before publishing"]
    lines += ["source:"]
    if src.repo:
        lines += [f"  repo: {src.repo}", f"  revision: {_q(src.commit)}  # the commit the local hub cache holds"]
    else:
        lines += [f"  path: {_q(str(src.folder))}  # absolute: a relative path is read from the build's folder"]
    if allow_pickle:
        lines += ["  allow_pickle: true  # asked for with --allow-pickle: pickled weights can run code when loaded"]
    if trust_remote_code:
        lines += ["  trust_remote_code: true  # asked for with --trust-remote-code: config.json names custom code"]
    dtype = checkpoint_dtype(src)
    outtype = "bf16" if dtype == "BF16" else "f16"
    lines += [f"outtype: {outtype}  # the checkpoint is {dtype}"
              + (": bf16 keeps its values exactly" if outtype == "bf16" else "")]
    lines += [f"# architecture {src.architecture}: registered by the pinned converter (b{build})"]
    if src.mtp_layers:
        lines += [f"mtp: keep  # {src.mtp_key} = {src.mtp_layers}: the multi-token-prediction layers stay in every file "
                  "(strip / separate: docs/drafts.md)"]
    try:  # the plan's reading of the checkpoint; a layout it cannot read only loses these two notes
        f = src.facts = src.facts or source_facts(src.folder)
    except (PipelineError, KeyError, ValueError, TypeError):
        f = None
    if f and f.n_expert:
        lines += [f"# mixture of experts: {f.n_expert_used} of {f.n_expert} experts per token, {f.n_params / 1e9:.2f} B "
                  f"parameters, {f.n_active / 1e9:.2f} B active; every expert is mapped, so the device estimates count "
                  "all of them; an imatrix quant can gate cold experts with imatrix.min_expert_coverage "
                  "(docs/calibration.md)"]
    if f and any(f.recurrent):
        lines += [f"# hybrid: {sum(f.recurrent)} of {f.n_layer} layers are linear attention, with a recurrent state per "
                  "sequence in the place of a KV cache (counted in the device estimates)"]
    lines += ["# chat template: " + (f"found in {src.chat_template}; the conformance stage renders it with both engines"
                                      if src.chat_template else "none found (a base model?); chat_template_override adds one")]
    notes: dict[str, list[str]] = {}
    for d in devices:
        pick, est = suggest(src, d)
        desc = f"{d.name} ({d.memory}, ctx {d.ctx}, {d.arch})"
        if pick is None:
            lines += [f"# {desc}: no stock quant fits: {STOCK_QUANTS[-1]} needs about {est[STOCK_QUANTS[-1]] / mib:.0f} MiB"]
            continue
        notes.setdefault(pick, []).append(f"{desc}: {pick}, about {est[pick] / mib:.0f} MiB")
    chosen = [q for q in STOCK_QUANTS if q in notes or q in quants] + [q for q in quants if q not in STOCK_QUANTS]
    lines += ["quants:"]
    for q in chosen:
        lines += [f"  # {n}: the largest stock quant that fits" for n in notes.get(q, [])]
        why = ("default" if list(quants) == list(DEFAULT_QUANTS) else "asked for") if q in quants else "for the device above"
        lines += [f"  - {q}  # {why}"]
    if devices:
        lines += ["# device estimates: weights from the safetensors shapes and llama-quantize's type rules, plus KV, compute",
                  "# and process as `ggufpipe fit` counts them (docs/init.md); check the built file with `ggufpipe fit`",
                  "devices:  # from --device: the build predicts each file's memory on them and writes a launch line"]
        lines += [f"  - {{name: {d.name}, memory: {_q(d.memory)}, ctx: {d.ctx}, arch: {d.arch}}}" for d in devices]
    ctx = max(16, min(512, int(src.text_config().get("max_position_embeddings") or 512)))
    scored = ctx - 1 - ctx // 2
    chunks = max(16, -(-2048 // scored))
    sha = hashlib.sha256(gates_text.read_bytes()).hexdigest()
    rel = os.path.relpath(gates_text.resolve(), out.parent.resolve())
    if rel.split(os.sep)[:3] == [os.pardir] * 3:  # far outside the recipe's folder: absolute is clearer
        rel = str(gates_text.resolve())
    rel_note = "relative to this file" if not os.path.isabs(rel) else "absolute: far from this file's folder"
    lines += ["gates:  # each quant is measured against the unquantized file; thresholds: the quant family's defaults",
              "  - name: " + (slug(gates_text.stem).replace(".", "-") or "eval")[:32],
              f"    text: {_q(rel)}  # {rel_note}",
              f"    text_sha256: {sha}",
              f"    ctx: {ctx}  # min(512, max_position_embeddings)",
              f"    chunks: {chunks}  # at least 2048 scored tokens (chunks x (ctx - 1 - ctx // 2))", ""]
    return "\n".join(lines)


def write_recipe(out: Path, text: str, quantize_exe: str | None):
    """Write ``text`` to ``out`` atomically and never over an existing file; validate it first (load_recipe)."""
    if out.exists() or out.is_symlink():
        raise PipelineError(f"{out} exists: not overwritten (remove it or pass another --out)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.init-{os.getpid()}.yaml"
    try:
        tmp.write_text(text, encoding="utf-8")
        recipe = load_recipe(tmp, quantize_exe)
        try:
            os.link(tmp, out)  # fails if out appeared meanwhile: never overwritten
        except FileExistsError:
            raise PipelineError(f"{out} exists: not overwritten (remove it or pass another --out)") from None
    finally:
        tmp.unlink(missing_ok=True)
    return recipe
