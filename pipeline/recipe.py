"""Recipes: ``recipes/<name>.yaml``, one schema, validated in one place.

Every error is one line naming the recipe file and the field, e.g.::

    recipes/foo.yaml: quants[2].type: unknown quant type 'Q4_Z' (llama-quantize b11312 accepts ...)

Every key, with its type and default, is declared once in :mod:`pipeline.recipe_schema` (the allowed-key
sets below are taken from it; keys not listed there are refused) and documented in ``docs/recipes.md``,
which ``make docs`` (``python -m pipeline.recipe_docs``) renders from it.

With ``awq:``, the published base file (``<name>-F16.gguf``) is still the unmodified model: it is the
reference every quant's gates are measured against, AWQ quants included. The AWQ-scaled base is an
intermediate under ``work/``. Plain and calibrated flavours of one type coexist through variants.
"""

from __future__ import annotations

import functools
import hashlib
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from . import naming
from . import recipe_schema as _schema
from .errors import PipelineError

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
VARIANT_RE = naming.VARIANT_RE  # letters only: the Hub label `_[A-Z]+` stops at a digit
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
REVISION_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
TENSOR_TYPE_RE = re.compile(r"^[A-Za-z0-9_.*+?\\\[\]()|^$-]+=[A-Za-z0-9_]+$")
OUTTYPES = ("f16", "bf16")
# What to do with multi-token-prediction (nextn) heads: keep (the converter's default), strip
# (convert with --no-mtp), separate (--no-mtp, plus a --mtp pass exporting the heads as a draft GGUF).
MTP_MODES = ("keep", "strip", "separate")
# llama-quantize's aliases, resolved so that file names and read-back types agree.
QUANT_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
# Not quantization targets: the outtype file is built by convert itself.
NOT_QUANTS = {"F16", "BF16", "F32", "COPY"}
# Types llama.cpp refuses to make without an importance matrix (llama-quant.cpp,
# tensor_requires_imatrix): their mixes contain IQ1/IQ2/IQ3_XXS tensors, or Q2_K in Q2_K_S.
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}

# The allowed keys of each section come from the declarative table in recipe_schema.py, which
# docs/recipes.md is rendered from (`make docs`): a key documented there is a key accepted here.
TOP_KEYS = _schema.keys("")
SPLIT_KEYS = _schema.keys("split")
CONFORMANCE_KEYS = _schema.keys("conformance")
# llama-gguf-split --split-max-size: an integer count of M (10^6 bytes) or G (10^9 bytes); the tool reads
# the number with %d, so it is kept well inside an int.
SPLIT_SIZE_RE = re.compile(r"^([1-9][0-9]{0,6})([MG])$")
SPLIT_UNITS = {"M": 1000**2, "G": 1000**3}
PUBLISH_KEYS = _schema.keys("publish")
# A folder inside a Hub repo: segments of [A-Za-z0-9._-] not starting with a dot (no "..", no hidden names).
REPO_PATH_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$")
AWQ_KEYS = _schema.keys("awq")
AWQ_VERSIONS = ("gemm", "gemv", "gemv_fast")
IMATRIX_KEYS = _schema.keys("imatrix")
DRAFT_KEYS = _schema.keys("draft")
SOURCE_KEYS = _schema.keys("source")  # also draft.source (the same fields)
QUANT_KEYS = _schema.keys("quants[]")
# Families that use the recipe's importance matrix unless a quant says `imatrix: false`.
IMATRIX_DEFAULT_FAMILIES = ("4bit", "3bit", "2bit")
# In this order (FAMILY_DEFAULTS' columns): the per-quant gates' keys, less the eval set name placeholder.
THRESHOLDS = tuple(f.key for f in _schema.section("quants[].gates").fields if not f.placeholder)
EVAL_KEYS = _schema.keys("gates[]")
EVAL_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")
SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
MIN_SCORED_TOKENS = 2048

# Default thresholds per quant family, used for every threshold a recipe leaves out. Set from
# llama.cpp KLD measurements of small (0.1-2B) models, which lose more than 7B+ models to the same
# type: generous enough for a healthy quant of a small model, tight enough to catch a broken one.
#                 max_ppl_ratio, max_kld_mean, max_kld_p99, min_same_top_p
FAMILY_DEFAULTS = {
    "8bit": (1.02, 0.01, 0.10, 0.95),
    "6bit": (1.04, 0.03, 0.30, 0.92),
    "5bit": (1.06, 0.05, 0.50, 0.90),
    "4bit": (1.15, 0.12, 1.00, 0.82),
    "3bit": (1.40, 0.35, 2.50, 0.70),
    "2bit": (2.50, 1.00, 5.00, 0.50),
}


def scored_tokens(ctx: int, chunks: int) -> int:
    """Tokens llama-perplexity scores: the second half of each chunk's context."""
    return chunks * (ctx - 1 - ctx // 2)


def quant_family(qtype: str) -> str:
    t = qtype.upper()
    if t.startswith("Q8") or t == "F32":
        return "8bit"
    if t.startswith("Q6"):
        return "6bit"
    if t.startswith("Q5"):
        return "5bit"
    if t.startswith(("Q4", "IQ4", "MXFP4", "NVFP4")):
        return "4bit"
    if t.startswith(("Q3", "IQ3")):
        return "3bit"
    return "2bit"


def default_thresholds(qtype: str) -> dict:
    return dict(zip(THRESHOLDS, FAMILY_DEFAULTS[quant_family(qtype)], strict=True))


@dataclass(frozen=True)
class Source:
    repo: str | None = None
    revision: str | None = None
    path: str | None = None
    allow_pickle: bool = False
    trust_remote_code: bool = False

    def describe(self) -> dict:
        if self.repo:
            return {"repo": self.repo, "revision": self.revision}
        return {"path": self.path}


@dataclass(frozen=True)
class EvalSet:
    name: str
    text: Path
    ctx: int
    chunks: int
    thresholds: tuple[tuple[str, float], ...] = ()
    text_sha256: str | None = None

    def describe(self) -> dict:
        return {"name": self.name, "text": self.text.name, "ctx": self.ctx, "chunks": self.chunks}


@dataclass(frozen=True)
class AwqConfig:
    """``awq:``: AutoAWQ scale search folded into the FP weights before convert."""

    calibration: Path
    w_bit: int = 4
    q_group_size: int = 128
    zero_point: bool = True
    version: str = "gemm"
    n_samples: int = 64
    seq_len: int = 256
    apply_clip: bool = True

    def describe(self) -> dict:
        return {"calibration": self.calibration.name, "w_bit": self.w_bit, "q_group_size": self.q_group_size,
                "zero_point": self.zero_point, "version": self.version, "n_samples": self.n_samples,
                "seq_len": self.seq_len, "apply_clip": self.apply_clip}


@dataclass(frozen=True)
class ImatrixConfig:
    """``imatrix:``: llama-imatrix over the calibration text, once per base GGUF."""

    calibration: Path
    ctx: int = 512
    chunks: int = 32

    def describe(self) -> dict:
        return {"calibration": self.calibration.name, "ctx": self.ctx, "chunks": self.chunks}


@dataclass(frozen=True)
class Publish:
    """``publish:``: where ``ggufpipe hub-publish`` uploads the artifact folder (pipeline/hub.py), and
    whether the publish stage writes an Ollama ``Modelfile.<QUANT>`` beside each model file."""

    hf_repo: str
    revision: str = "main"
    private: bool = False
    path_in_repo: str = ""
    ollama: bool = True
    ollama_template: str | None = None


@dataclass(frozen=True)
class Split:
    """``split:``: publish a model file as ``llama-gguf-split`` shards in a folder ``<name>-<KEY>/``.

    ``max_size`` bounds the tensor data of each shard (llama-gguf-split's own meaning: the first shard
    also carries all the metadata, the tokenizer included); a tensor larger than it is refused by the
    split stage, since no shard could hold it."""

    max_size: str  # as llama-gguf-split takes it: N followed by M (10^6 bytes) or G (10^9 bytes)
    where: str = field(default="split", compare=False)  # the recipe field it came from, for error lines

    @property
    def max_bytes(self) -> int:
        m = SPLIT_SIZE_RE.match(self.max_size)
        assert m is not None
        return int(m.group(1)) * SPLIT_UNITS[m.group(2)]

    def args(self) -> list[str]:
        return ["--split", "--split-max-size", self.max_size]

    def describe(self) -> dict:
        return {"max_size": self.max_size, "max_size_bytes": self.max_bytes}


@dataclass(frozen=True)
class Quant:
    type: str
    variant: str | None = None
    output_tensor_type: str | None = None
    token_embedding_type: str | None = None
    tensor_types: tuple[str, ...] = ()
    pure: bool = False
    leave_output_tensor: bool = False
    gates: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # (eval set or "*", thresholds)
    awq: bool = False  # quantized from the AWQ-scaled base (recipe has `awq:`, quant did not opt out)
    imatrix: bool = False  # quantized with the recipe's importance matrix
    split: Split | None = None  # published as shards (its own `split:` or the recipe's default)

    @property
    def base(self) -> str:
        """Which base GGUF this quant is made from: ``plain`` (the published F16) or ``awq``."""
        return "awq" if self.awq else "plain"

    @property
    def key(self) -> str:
        """The Snakemake wildcard value, file-name suffix and label: TYPE[_VARIANT] (pipeline/naming.py)."""
        return naming.quant_label(self.type, self.variant)

    def quantize_args(self) -> list[str]:
        args: list[str] = []
        if self.pure:
            args.append("--pure")
        if self.leave_output_tensor:
            args.append("--leave-output-tensor")
        if self.output_tensor_type:
            args += ["--output-tensor-type", self.output_tensor_type]
        if self.token_embedding_type:
            args += ["--token-embedding-type", self.token_embedding_type]
        for tt in self.tensor_types:
            args += ["--tensor-type", tt]
        return args

    def describe(self) -> dict:
        out: dict[str, Any] = {"type": self.type}
        if self.variant:
            out["variant"] = self.variant
        args = self.quantize_args()
        if args:
            out["llama_quantize_args"] = args
        if self.awq:
            out["awq"] = True
        if self.imatrix:
            out["imatrix"] = True
        return out


@dataclass(frozen=True)
class Draft:
    """A draft model for speculative decoding, built beside the main model or given as a GGUF."""

    source: Source | None
    gguf: Path | None
    outtype: str
    quants: tuple[Quant, ...]
    pairs: tuple[tuple[str, str], ...]  # (main quant key, draft quant key or "gguf")
    n_max: tuple[int, ...]  # draft lengths measured; the best one goes into the deployment line
    eval_text: Path
    min_acceptance: float | None = None
    prompts: int = 3
    n_predict: int = 96


@dataclass(frozen=True)
class Conformance:
    """Recipe ``conformance:``: the base GGUF checked against the HF model (pipeline/conformance/)."""

    enabled: bool = True
    chunks: int = 4
    text: Path | None = None  # logit-fidelity text of a recipe without eval sets (a built draft: the main's first)

    def describe(self) -> dict:
        return {"enabled": self.enabled, "chunks": self.chunks}


@dataclass(frozen=True)
class Recipe:
    path: Path
    sha256: str
    name: str
    source: Source
    outtype: str
    quants: tuple[Quant, ...]
    description: str | None = None
    license: str | None = None
    eval_sets: tuple[EvalSet, ...] = ()
    bench: bool = True
    draft: Draft | None = None
    awq: AwqConfig | None = None
    imatrix: ImatrixConfig | None = None
    mtp: str = "keep"
    publish: Publish | None = None
    split: Split | None = None  # top-level default: the base file, the MTP draft, quants without their own
    conformance: Conformance = Conformance()
    # the fix path: written into the base GGUF after convert (pipeline/convert.py), so every quant carries them
    chat_template_override: Path | None = None
    eos_token_ids: tuple[int, ...] | None = None
    add_bos: bool | None = None
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def vocab_overrides(self) -> dict:
        """The fix-path keys the recipe sets (template as its file's text), for the convert stage and the manifest."""
        out: dict = {}
        if self.chat_template_override is not None:
            out["chat_template"] = self.chat_template_override.read_text(encoding="utf-8")
        if self.eos_token_ids is not None:
            out["eos_token_ids"] = list(self.eos_token_ids)
        if self.add_bos is not None:
            out["add_bos"] = self.add_bos
        return out

    @property
    def bases(self) -> list[str]:
        """Base GGUFs the quants are made from (``plain`` is always built: it is the gates' reference)."""
        return ["plain"] + (["awq"] if any(q.awq for q in self.quants) else [])

    @property
    def imatrix_bases(self) -> list[str]:
        return sorted({q.base for q in self.quants if q.imatrix})

    @property
    def draft_name(self) -> str:
        return f"{self.name}-draft"

    def draft_recipe(self) -> Recipe | None:
        """The draft as a recipe of its own (``<name>-draft``), built by the same stages."""
        d = self.draft
        if d is None or d.source is None:
            return None
        text = self.eval_sets[0].text if self.eval_sets else None
        return Recipe(path=self.path, sha256=self.sha256, name=self.draft_name, source=d.source, outtype=d.outtype,
                      quants=d.quants, description=f"draft model of {self.name}", license=self.license,
                      eval_sets=(), bench=False, draft=None, raw={},
                      conformance=replace(self.conformance, text=text))

    def eval_set(self, name: str) -> EvalSet:
        for es in self.eval_sets:
            if es.name == name:
                return es
        raise PipelineError(f"{self.path}: no eval set {name!r}")

    def thresholds(self, key: str, set_name: str) -> dict:
        """Effective thresholds of quant ``key`` on eval set ``set_name``: family defaults, then the
        eval set's, then the quant's overrides for all sets, then its overrides for this set."""
        q = self.quant(key)
        out = default_thresholds(q.type)
        out.update(dict(self.eval_set(set_name).thresholds))
        for target in ("*", set_name):
            for name, values in q.gates:
                if name == target:
                    out.update(dict(values))
        return out

    def quant(self, key: str) -> Quant:
        for q in self.quants:
            if q.key == key:
                return q
        raise PipelineError(f"{self.path}: no quant {key!r} (has {', '.join(q.key for q in self.quants)})")

    def file_for(self, key: str) -> str:
        """The GGUF of ``key`` as built in ``work/`` (whole, even when it is published split)."""
        return f"{self.name}-{key}.gguf"

    @property
    def model_keys(self) -> list[str]:
        """Keys of every model file a recipe can publish: the base (``F16``/``BF16``), each quant, and
        the MTP draft (``mtp-F16_MTP``) of ``mtp: separate``."""
        keys = [self.outtype.upper(), *(q.key for q in self.quants)]
        if self.mtp == "separate":
            keys.append(self.mtp_key)
        return keys

    def split_for(self, key: str) -> Split | None:
        """How file ``key`` is split (None: published whole)."""
        if key == self.mtp_key:  # whole at the repo root: llama.cpp looks for the sidecar only in the model's
            return None  # folder or above (find_best_sibling, download.cpp:574-582), never in a shard folder
        if key == self.outtype.upper():
            return self.split
        return self.quant(key).split

    def artifact_for(self, key: str) -> str:
        """What ``artifacts/<name>/`` holds for ``key``: the file ``<name>-<KEY>.gguf``, or for a split
        file the folder ``<name>-<KEY>`` of its shards ``<name>-<KEY>-0000i-of-0000N.gguf``."""
        return f"{self.name}-{key}" if self.split_for(key) else self.file_for(key)

    def published_names(self, where: str = "quants") -> list[naming.Published]:
        """Every model file this recipe publishes, as the resolvers see it (pipeline/naming.py); a split file by
        the name of its first shard of a representative two."""
        out = []
        for key in self.model_keys:
            if key == self.outtype.upper():
                entry = f"the base file ({key})"
            elif key == self.mtp_key:
                entry = f"the MTP draft ({key})"
            else:
                i = next(i for i, q in enumerate(self.quants) if q.key == key)
                entry = f"{where}[{i}] ({key})"
            art = self.artifact_for(key)
            paths = (f"{art}/{art}-00001-of-00002.gguf", f"{art}/{art}-00002-of-00002.gguf") \
                if self.split_for(key) else (art,)
            folder = self.publish.path_in_repo.strip("/") if self.publish else ""
            paths = tuple(f"{folder}/{p}" for p in paths) if folder else paths
            out.append(naming.Published(naming.label_of_key(key), entry, paths, sidecar=key == self.mtp_key))
        return out

    @property
    def base_file(self) -> str:
        return f"{self.name}-{self.outtype.upper()}.gguf"

    @property
    def mtp_file(self) -> str:
        """The MTP-head draft exported by ``mtp: separate``."""
        return f"{self.name}-{self.mtp_key}.gguf"

    @property
    def mtp_key(self) -> str:
        """``mtp-F16_MTP``: llama.cpp's sidecar marker and a Hub label of its own (pipeline/naming.py)."""
        return naming.mtp_key(self.outtype)


# --------------------------------------------------------------------------- helpers


class _Ctx:
    def __init__(self, path: Path):
        self.path = path

    def fail(self, where: str, msg: str):
        raise PipelineError(f"{self.path}: {where}: {msg}")

    def mapping(self, value, where: str, allowed: set[str]) -> dict:
        if not isinstance(value, dict):
            self.fail(where, f"must be a mapping, got {type(value).__name__}")
        for k in value:
            if not isinstance(k, str) or k not in allowed:
                self.fail(f"{where}.{k}" if where else str(k),
                          f"unknown key (allowed: {', '.join(sorted(allowed))})")
        return value

    def string(self, value, where: str, pattern: re.Pattern | None = None, what: str = "") -> str:
        if not isinstance(value, str) or not value.strip():
            self.fail(where, f"must be a non-empty string, got {value!r}")
        if pattern and not pattern.match(value):
            self.fail(where, f"{value!r} is not {what or 'valid'}")
        return value

    def boolean(self, value, where: str) -> bool:
        if not isinstance(value, bool):
            self.fail(where, f"must be true or false, got {value!r}")
        return value


def _thresholds(ctx: _Ctx, d: dict, where: str) -> tuple[tuple[str, float], ...]:
    out = []
    for name in THRESHOLDS:
        if name not in d:
            continue
        v = d[name]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            ctx.fail(f"{where}.{name}", f"must be a number, got {v!r}")
        if v < 0 or (name == "min_same_top_p" and v > 1) or (name == "max_ppl_ratio" and v < 1):
            rng = "between 0 and 1" if name == "min_same_top_p" else ">= 1" if name == "max_ppl_ratio" else ">= 0"
            ctx.fail(f"{where}.{name}", f"{v!r} is out of range (must be {rng})")
        out.append((name, float(v)))
    return tuple(out)


def _integer(ctx: _Ctx, v, where: str, lo: int) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < lo:
        ctx.fail(where, f"must be an integer >= {lo}, got {v!r}")
    return v


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
        for req in ("text", "ctx", "chunks"):
            if req not in d:
                ctx.fail(f"{where}.{req}", "missing")
        text = _text_path(ctx, d["text"], f"{where}.text", "eval text")
        sha = d.get("text_sha256")
        if sha is not None:
            sha = ctx.string(sha, f"{where}.text_sha256", SHA256_RE, "a SHA256 (64 lowercase hex)")
        n_ctx = _integer(ctx, d["ctx"], f"{where}.ctx", 16)
        chunks = _integer(ctx, d["chunks"], f"{where}.chunks", 1)
        scored = scored_tokens(n_ctx, chunks)
        if scored < MIN_SCORED_TOKENS:
            ctx.fail(f"{where}.chunks", f"ctx {n_ctx} x {chunks} chunks scores only {scored} tokens; at least "
                                        f"{MIN_SCORED_TOKENS} are needed for a meaningful evaluation")
        if any(es.name == name for es in sets):
            ctx.fail(f"{where}.name", f"eval set {name!r} repeats")
        sets.append(EvalSet(name=name, text=text, ctx=n_ctx, chunks=chunks,
                            thresholds=_thresholds(ctx, d, where), text_sha256=sha))
    return tuple(sets)


def _parse_quant_gates(ctx: _Ctx, value, where: str, set_names: set[str]):
    if not isinstance(value, dict) or not value:
        ctx.fail(where, "must be a mapping of thresholds, or of eval set name -> thresholds")
    if not set_names:
        ctx.fail(where, "per-quant gates need a top-level `gates:` section")
    if all(k in THRESHOLDS for k in value):
        return (("*", _thresholds(ctx, value, where)),)
    out = []
    for k, v in value.items():
        if k in THRESHOLDS:
            ctx.fail(f"{where}.{k}", "do not mix thresholds with per-eval-set entries")
        if k not in set_names:
            ctx.fail(f"{where}.{k}", f"unknown key (thresholds: {', '.join(THRESHOLDS)}; eval sets: "
                                     f"{', '.join(sorted(set_names))})")
        d = ctx.mapping(v, f"{where}.{k}", set(THRESHOLDS))
        out.append((k, _thresholds(ctx, d, f"{where}.{k}")))
    return tuple(out)


@functools.lru_cache(maxsize=4)
def known_quant_types(quantize_exe: str) -> tuple[frozenset[str], int]:
    """Quant type names accepted by this llama-quantize (parsed from its usage text)."""
    import subprocess

    out = subprocess.run([quantize_exe, "--help"], capture_output=True, text=True, timeout=60)
    text = out.stdout + out.stderr
    types = set(re.findall(r"^\s+\d+\s+or\s+([A-Z0-9_]+)\s*:", text, flags=re.M))
    types |= set(re.findall(r"^\s+([A-Z][A-Z0-9_]+)\s+:", text, flags=re.M))
    if not types:
        raise PipelineError(f"could not read the quant types from `{quantize_exe} --help`")
    from pathlib import Path as _P

    from .tools import read_build_version

    build = read_build_version(_P(quantize_exe).parent / "llama-perplexity")[0]
    return frozenset(types), build


@functools.lru_cache(maxsize=1)
def gguf_file_types() -> frozenset[str]:
    """Quant types that the importable ``gguf`` package can name (LlamaFileType.MOSTLY_*).

    Read from the source of its ``constants`` module (the ``MOSTLY_*`` members of ``class LlamaFileType``)
    unless ``gguf`` is already imported: the package itself imports numpy and more (0.7 s), and even
    executing ``constants.py`` alone (its many enums) took 35 ms, paid by every Snakemake start and every
    stage for loading a recipe. tests/unit/test_tools.py checks the text reading against the enum."""
    import importlib.util
    import sys

    mod = sys.modules.get("gguf")
    if mod is not None:
        return frozenset(m.name[len("MOSTLY_"):] for m in mod.LlamaFileType if m.name.startswith("MOSTLY_"))
    spec = importlib.util.find_spec("gguf")
    if spec is None or not spec.submodule_search_locations:
        return frozenset()
    return file_types_in_source((Path(next(iter(spec.submodule_search_locations))) / "constants.py").read_text(
        encoding="utf-8"))


def file_types_in_source(text: str) -> frozenset[str]:
    """The ``MOSTLY_*`` member names (less the prefix) of ``class LlamaFileType`` in gguf-py's constants.py."""
    body = re.search(r"^class LlamaFileType\b.*?:\n(.*?)(?=^\S)", text, re.M | re.S)
    return frozenset(re.findall(r"^[ \t]+MOSTLY_(\w+)[ \t]*=", body.group(1), re.M)) if body else frozenset()


def _check_quant_type(ctx: _Ctx, value: str, where: str, known: set[str] | None, build: int | None) -> str:
    t = value.strip().upper()
    t = QUANT_ALIASES.get(t, t)
    if t in NOT_QUANTS:
        ctx.fail(where, f"{t} is not a quantization (the {t.lower()} file comes from `outtype`)")
    if known is not None and t not in known:
        ctx.fail(where, f"unknown quant type {value!r} (llama-quantize b{build} accepts: {', '.join(sorted(known - NOT_QUANTS))})")
    if t not in gguf_file_types():
        ctx.fail(where, f"quant type {t} is unknown to the installed gguf Python package, which could not read the "
                        "result back; install the gguf-py of the pinned llama.cpp (`make tools`)")
    return t


def key_ref(text: str) -> str:
    """A file key as a recipe or a command line writes it: ``Q4_K_M``, ``q4_k``(alias), ``Q4_K_M_IMAT``, or the
    pre-#16 ``Q4_K_M-imat`` (renamed: CHANGELOG.md); ``gguf`` (a given draft GGUF) as is."""
    if text == "gguf":
        return text
    if "-" in text and not text.startswith(naming.MTP_MARK):
        t, v = text.split("-", 1)
        return naming.quant_label(QUANT_ALIASES.get(t.upper(), t.upper()), v)
    if text.lower().startswith(naming.MTP_MARK):
        rest = text[len(naming.MTP_MARK):].upper()
        return naming.mtp_key(rest[: -len(naming.MTP_SUFFIX)] if rest.endswith(naming.MTP_SUFFIX) else rest)
    return QUANT_ALIASES.get(text.upper(), text.upper())


def _parse_quant(ctx: _Ctx, item, where: str, known, build, set_names: set[str]) -> Quant:
    if isinstance(item, str):
        return Quant(type=_check_quant_type(ctx, item, where, known, build))
    d = ctx.mapping(item, where, QUANT_KEYS)
    if "type" not in d:
        ctx.fail(f"{where}.type", "missing")
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


def _parse_split(ctx: _Ctx, value, where: str, allow_false: bool = False) -> Split | None:
    """``split: {max_size: 2G}`` (or, for one quant, ``split: false``: published whole)."""
    if value is False and allow_false:
        return None
    if not isinstance(value, dict):
        ctx.fail(where, "must be a mapping {max_size: N(M|G)}" + (" or false" if allow_false else "")
                 + f", got {value!r}")
    d = ctx.mapping(value, where, SPLIT_KEYS)
    if "max_size" not in d:
        ctx.fail(f"{where}.max_size", "missing (the most tensor data per shard, e.g. 2G or 500M)")
    size = d["max_size"]
    if isinstance(size, bool) or not isinstance(size, str) or not SPLIT_SIZE_RE.match(size.strip()):
        ctx.fail(f"{where}.max_size", f"{size!r} is not a size llama-gguf-split takes: a whole number > 0 followed "
                                      "by M (10^6 bytes) or G (10^9 bytes), e.g. 500M or 2G")
    return Split(max_size=size.strip(), where=where)


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
        revision = ctx.string(rev, f"{where}.revision", REVISION_RE, "a git revision")
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
    )


def _parse_quants(ctx: _Ctx, qs, where: str, known, build, set_names: set[str], has_awq: bool = False,
                  has_imatrix: bool = False, split: Split | None = None) -> tuple[Quant, ...]:
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


def _text_path(ctx: _Ctx, value, where: str, what: str) -> Path:
    p = Path(ctx.string(value, where)).expanduser()
    if not p.is_absolute():
        p = (ctx.path.parent / p).resolve()
    if not p.is_file():
        ctx.fail(where, f"{what} {p} does not exist")
    size = p.stat().st_size
    if not size or (size < (1 << 20) and not p.read_bytes().strip()):
        ctx.fail(where, f"{what} {p} is empty")
    return p


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
    w_bit = d.get("w_bit", 4)
    if w_bit not in (2, 3, 4, 8) or isinstance(w_bit, bool):
        ctx.fail("awq.w_bit", f"must be 2, 3, 4 or 8, got {w_bit!r}")
    group = d.get("q_group_size", 128)
    if isinstance(group, bool) or not isinstance(group, int) or (group != -1 and group not in (32, 64, 128, 256)):
        ctx.fail("awq.q_group_size", f"must be 32, 64, 128, 256 or -1 (per channel), got {group!r}")
    version = d.get("version", "gemm")
    if not isinstance(version, str) or version.lower() not in AWQ_VERSIONS:
        ctx.fail("awq.version", f"must be one of {', '.join(AWQ_VERSIONS)}, got {version!r}")
    return AwqConfig(calibration=cal, w_bit=w_bit, q_group_size=group,
                     zero_point=ctx.boolean(d.get("zero_point", True), "awq.zero_point"), version=version.lower(),
                     n_samples=_integer(ctx, d.get("n_samples", 64), "awq.n_samples", 1),
                     seq_len=_integer(ctx, d.get("seq_len", 256), "awq.seq_len", 16),
                     apply_clip=ctx.boolean(d.get("apply_clip", True), "awq.apply_clip"))


def _parse_publish(ctx: _Ctx, value) -> Publish:
    d = ctx.mapping(value, "publish", PUBLISH_KEYS)
    if "hf_repo" not in d:
        ctx.fail("publish.hf_repo", "missing (the Hugging Face repo to upload to, org/name)")
    repo = ctx.string(d["hf_repo"], "publish.hf_repo", REPO_RE, "a Hugging Face repo id (org/name)")
    rev = d.get("revision", "main")
    if not isinstance(rev, str):
        ctx.fail("publish.revision", f"must be a branch name (a string), got {rev!r}")
    rev = ctx.string(rev, "publish.revision", REVISION_RE, "a branch name")
    if COMMIT_RE.match(rev) or rev.endswith("/") or "//" in rev or ".." in rev:
        ctx.fail("publish.revision", f"{rev!r} is not a branch name (a commit cannot be committed to)")
    prefix = d.get("path_in_repo", "")
    if prefix is None:
        prefix = ""
    if not isinstance(prefix, str):
        ctx.fail("publish.path_in_repo", f"must be a folder path in the repo (a string), got {prefix!r}")
    prefix = prefix.strip("/")
    if prefix and not REPO_PATH_RE.match(prefix):
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
    cal = _calibration(ctx, d, "imatrix", eval_sets)
    return ImatrixConfig(calibration=cal, ctx=_integer(ctx, d.get("ctx", 512), "imatrix.ctx", 16),
                         chunks=_integer(ctx, d.get("chunks", 32), "imatrix.chunks", 1))


@functools.lru_cache(maxsize=64)
def _file_sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    from .fsutil import sha256_file

    return sha256_file(path)  # cached per (path, size, mtime): recipes share calibration and eval texts


def _file_sha256(path: Path) -> str:
    st = path.stat()
    return _file_sha256_cached(str(path), st.st_size, st.st_mtime_ns)


def _parse_draft(ctx: _Ctx, value, main_quants: tuple[Quant, ...], eval_sets, known, build, outtype: str) -> Draft:
    d = ctx.mapping(value, "draft", DRAFT_KEYS)
    if ("source" in d) == ("gguf" in d):
        ctx.fail("draft", "give exactly one of `source` (built like the main model) or `gguf` (an existing file)")
    source = gguf = None
    quants: tuple[Quant, ...] = ()
    if "source" in d:
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
        from .gguf import read_header

        try:  # magic, header and tensor data inside the file (standard library; reads the header only)
            read_header(gguf)
        except PipelineError as exc:
            ctx.fail("draft.gguf", str(exc))
    d_outtype = d.get("outtype", outtype)
    if d_outtype not in OUTTYPES:
        ctx.fail("draft.outtype", f"{d_outtype!r} is not one of {', '.join(OUTTYPES)}")
    main_keys = [q.key for q in main_quants]
    draft_keys = [q.key for q in quants] if quants else ["gguf"]
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
    if not n_max or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= 64 for n in n_max):
        ctx.fail("draft.n_max", f"must be a draft length 1-64 or a list of them, got {d.get('n_max')!r}")
    text = d.get("eval_text")
    if text is not None:
        text = _text_path(ctx, text, "draft.eval_text", "draft eval text")
    elif eval_sets:
        text = eval_sets[0].text
    else:
        ctx.fail("draft.eval_text", "missing (and there is no gates eval set to take the text from)")
    min_acc = d.get("min_acceptance")
    if min_acc is not None and (isinstance(min_acc, bool) or not isinstance(min_acc, (int, float)) or not 0 <= min_acc <= 1):
        ctx.fail("draft.min_acceptance", f"must be a number between 0 and 1, got {min_acc!r}")
    prompts = _integer(ctx, d.get("prompts", 3), "draft.prompts", 1)
    n_predict = _integer(ctx, d.get("n_predict", 96), "draft.n_predict", 8)
    return Draft(source=source, gguf=gguf, outtype=d_outtype, quants=quants, pairs=tuple(pairs),
                 n_max=tuple(sorted(set(n_max))), eval_text=text, min_acceptance=min_acc, prompts=prompts,
                 n_predict=n_predict)


def load_recipe(path: str | Path, quantize_exe: str | None = None) -> Recipe:
    """Read and validate one recipe. ``quantize_exe`` enables the check against llama-quantize."""
    import yaml

    path = Path(path)
    ctx = _Ctx(path)
    try:
        raw_bytes = path.read_bytes()
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read recipe: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(raw_bytes.decode("utf-8"))
    except UnicodeDecodeError:
        raise PipelineError(f"{path}: not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark else "YAML"
        raise PipelineError(f"{path}: {where}: malformed YAML: {getattr(exc, 'problem', None) or exc}") from None
    if data is None:
        ctx.fail("recipe", "file is empty")
    d = ctx.mapping(data, "", TOP_KEYS)
    for req in ("name", "source", "quants"):
        if req not in d:
            ctx.fail(req, "missing")
    name = ctx.string(d["name"], "name", NAME_RE, "a valid name (lowercase slug: a-z 0-9 . _ -, starting with a letter or digit)")
    if ".." in name:
        ctx.fail("name", f"{name!r} must not contain '..'")

    source = _parse_source(ctx, d["source"], "source")

    outtype = d.get("outtype", "f16")
    if outtype not in OUTTYPES:
        ctx.fail("outtype", f"{outtype!r} is not one of {', '.join(OUTTYPES)}")
    mtp = d.get("mtp", "keep")
    if mtp not in MTP_MODES:
        ctx.fail("mtp", f"{mtp!r} is not one of {', '.join(MTP_MODES)}")

    if "quants" in d and not isinstance(d["quants"], list):
        ctx.fail("quants", "must be a non-empty list")
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
    quants = _parse_quants(ctx, d["quants"], "quants", known, build, set_names, awq is not None, imatrix is not None,
                           split)
    draft = _parse_draft(ctx, d["draft"], quants, eval_sets, known, build, outtype) if "draft" in d else None
    publish = _parse_publish(ctx, d["publish"]) if "publish" in d else None
    conformance = _parse_conformance(ctx, d["conformance"]) if "conformance" in d else Conformance()
    template = (_text_path(ctx, d["chat_template_override"], "chat_template_override", "chat template")
                if d.get("chat_template_override") is not None else None)
    eos_ids = None
    if d.get("eos_token_ids") is not None:
        ids = d["eos_token_ids"]
        if not isinstance(ids, list) or not 1 <= len(ids) <= 3:
            ctx.fail("eos_token_ids", f"must be a list of 1 to 3 token ids (eos, eot, eom), got {ids!r}")
        eos_ids = tuple(_integer(ctx, v, f"eos_token_ids[{i}]", 0) for i, v in enumerate(ids))
    add_bos = ctx.boolean(d["add_bos"], "add_bos") if d.get("add_bos") is not None else None

    for key in ("description", "license"):
        if key in d and d[key] is not None:
            ctx.string(d[key], key)
    recipe = Recipe(
        path=path,
        sha256=hashlib.sha256(raw_bytes).hexdigest(),
        name=name,
        source=source,
        outtype=outtype,
        quants=quants,
        description=d.get("description"),
        license=d.get("license"),
        eval_sets=eval_sets,
        bench=bench,
        draft=draft,
        awq=awq,
        imatrix=imatrix,
        mtp=mtp,
        publish=publish,
        split=split,
        conformance=conformance,
        chat_template_override=template,
        eos_token_ids=eos_ids,
        add_bos=add_bos,
        raw=d,
    )
    # names both resolvers read right, in the recipe's repository and in its draft's (pipeline/naming.py)
    for r, where in ((recipe, "quants"), (recipe.draft_recipe(), "draft.quants")):
        if r is not None:
            problems = naming.check_repo(r.published_names(where))
            if problems:
                ctx.fail(where, f"file names collide: {problems[0]}")
    return recipe


def _parse_conformance(ctx: _Ctx, value) -> Conformance:
    if value is False:
        return Conformance(enabled=False)
    if value is True:
        return Conformance()
    c = ctx.mapping(value, "conformance", CONFORMANCE_KEYS)
    return Conformance(chunks=_integer(ctx, c.get("chunks", 4), "conformance.chunks", 1))


def load_recipes(folder: str | Path, quantize_exe: str | None = None) -> list[Recipe]:
    """All ``*.yaml`` recipes of a folder, with names checked to be unique."""
    folder = Path(folder)
    recipes = [load_recipe(p, quantize_exe) for p in sorted(folder.glob("*.yaml"))]
    by_name: dict[str, Path] = {}
    for r in recipes:
        if r.name in by_name:
            raise PipelineError(f"{r.path}: name: {r.name!r} is already used by {by_name[r.name]}")
        by_name[r.name] = r.path
    return recipes
