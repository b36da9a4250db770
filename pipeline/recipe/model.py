"""What a recipe is: the constants of the schema and the frozen dataclasses (Recipe, Quant, EvalSet, Draft...). (see pipeline/recipe/__init__.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.gguf.types import type_bpw
from pipeline.recipe import naming
from pipeline.recipe import schema as _schema
from pipeline.recipe.devices import Device
from pipeline.recipe.evalset import EvalSet
from pipeline.recipe.imatrix import ImatrixConfig
from pipeline.recipe.mix import Flavour, Mix, Sensitivity
from pipeline.recipe.speedup import Speedup

NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
VARIANT_RE = naming.VARIANT_RE  # letters only: the Hub label `_[A-Z]+` stops at a digit
REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
# A commit, branch or tag, within what `git check-ref-format` accepts: segments of [A-Za-z0-9._-] joined by single
# slashes, none starting with a dot or ending in .lock, no "..", no dot at the end. It is joined under a hub cache's
# snapshots/ and refs/ folders (stages/fetch.py hub_snapshot_dir), so it must never climb out of them.
REVISION_RE = re.compile(r"^(?=.{1,128}\Z)(?!.*\.\.)(?!.*\.lock(?:/|\Z))(?!.*\.\Z)"
                         r"[A-Za-z0-9][A-Za-z0-9._-]*(?:/[A-Za-z0-9_-][A-Za-z0-9._-]*)*\Z")
REVISION_RULE = ("segments of A-Z a-z 0-9 . _ - joined by single slashes, none starting with a dot or ending in .lock, "
                 "no '..', no dot or slash at the end")
ARCH_CLASS_RE = re.compile(r"^[A-Z][A-Za-z0-9_]{0,99}$")  # a transformers / converter model class name
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
TENSOR_TYPE_RE = re.compile(r"^[A-Za-z0-9_.*+?\\\[\]()|^$-]+=[A-Za-z0-9_]+$")
OUTTYPES = ("f16", "bf16")
# MTP (nextn) heads: keep (the converter's default), strip (--no-mtp), separate (--no-mtp, plus a --mtp draft export)
MTP_MODES = ("keep", "strip", "separate")
MTP_DRAFT_KEY = "mtp"  # the draft key of `draft: {mtp: true}` in pairs, records and rule wildcards
# llama-quantize's aliases, resolved so that file names and read-back types agree.
QUANT_ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
# Not quantization targets: the outtype file is built by convert itself.
NOT_QUANTS = {"F16", "BF16", "F32", "COPY"}
# Types llama.cpp refuses to make without an importance matrix (llama-quant.cpp tensor_requires_imatrix)
NEEDS_IMATRIX = {"IQ1_S", "IQ1_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M", "IQ3_XXS", "IQ3_XS", "Q2_K_S"}

# The allowed keys of each section come from the declarative table in recipe_schema.py, which
# docs/recipes.md is rendered from (`make docs`): a key documented there is a key accepted here.
TOP_KEYS = _schema.keys("")
SPLIT_KEYS = _schema.keys("split")
CONFORMANCE_KEYS = _schema.keys("conformance")
# Tokenizer mismatch causes the conformance stage names (pipeline/stages/conformance/causes.py): the HF normalizer
# members llama.cpp does not apply, HF's BPE ignore_merges that the GGUF's pre-tokenizer lacks, and an added token
# HF keeps plain that the converter typed CONTROL. The limitations are llama.cpp's by design (a warning unless
# `strict`); every other cause is a defect a recipe may accept by name (`conformance.accept`).
NORMALIZER_CAUSES = {"NFC": "nfc", "NFD": "nfd", "NFKC": "nfkc", "NFKD": "nfkd", "Precompiled": "precompiled",
                     "Lowercase": "lowercase", "StripAccents": "strip-accents", "Replace": "replace",
                     "Prepend": "prepend", "Strip": "strip", "BertNormalizer": "bert", "ByteLevel": "byte-level"}
CONFORMANCE_LIMITATIONS = ("control-typed", "nfc")
ACCEPTABLE_CAUSES = tuple(sorted({*NORMALIZER_CAUSES.values(), "ignore-merges"} - set(CONFORMANCE_LIMITATIONS)))
# llama-gguf-split --split-max-size: a count of M (10^6 bytes) or G (10^9 bytes), read with %d: kept inside an int
SPLIT_SIZE_RE = re.compile(r"^([1-9][0-9]{0,6})([MG])$")
SPLIT_UNITS = {"M": 1000**2, "G": 1000**3}
PUBLISH_KEYS = _schema.keys("publish")
# A folder inside a Hub repo: segments of [A-Za-z0-9._-] not starting with a dot (no "..", no hidden names).
REPO_PATH_RE = re.compile(r"^[A-Za-z0-9_-][A-Za-z0-9._-]*(/[A-Za-z0-9_-][A-Za-z0-9._-]*)*$")
AWQ_KEYS = _schema.keys("awq")
AWQ_VERSIONS, AWQ_ENGINES = ("gemm", "gemv", "gemv_fast"), ("autoawq", "llmcompressor")
IMATRIX_KEYS = _schema.keys("imatrix")
DRAFT_KEYS = _schema.keys("draft")
SOURCE_KEYS = _schema.keys("source")  # also draft.source (the same fields)
QUANT_KEYS = _schema.keys("quants[]")
SENSITIVITY_KEYS = _schema.keys("sensitivity")
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


def first_text_set(eval_sets) -> EvalSet | None:
    """The first plain-text eval set (not chat-rendered): a draft's acceptance prompts are cut from its text."""
    return next((es for es in eval_sets if es.render == "text"), None)


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
    convert_as: str | None = None

    def describe(self) -> dict:
        if self.repo:
            return {"repo": self.repo, "revision": self.revision}
        return {"path": self.path}


@dataclass(frozen=True)
class AwqConfig:
    """``awq:``: AWQ scale search folded into the FP weights; ``engine``/``apply_clip`` ``None``: the stage's choice."""

    calibration: Path
    engine: str | None = None
    w_bit: int = 4
    q_group_size: int = 128
    zero_point: bool = True
    version: str = "gemm"
    n_samples: int = 64
    seq_len: int = 256
    apply_clip: bool | None = None

    def clip(self, engine: str) -> bool:  # a clipping search after the scale search, with ``engine``
        return self.apply_clip if self.apply_clip is not None else engine == "autoawq"

    def describe(self) -> dict:  # the engine only where named: older recipes keep their keys (and rerun trigger)
        return {"calibration": self.calibration.name, **({"engine": self.engine} if self.engine else {}),
                "w_bit": self.w_bit, "q_group_size": self.q_group_size, "zero_point": self.zero_point,
                "version": self.version, "n_samples": self.n_samples, "seq_len": self.seq_len,
                "apply_clip": self.clip(self.engine or "autoawq")}


@dataclass(frozen=True)
class Publish:
    """``publish:``: where ``ggufpipe hub-publish`` uploads the artifact folder (pipeline/distribution/hub.py), and
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
    tensor_types_file: Path | None = None  # llama-quantize --tensor-type-file (pipeline/recipe/tensor_map.py)
    tensor_map: tuple[tuple[str, str, int], ...] = ()  # its entries: (pattern, TYPE, line)
    pure: bool = False
    leave_output_tensor: bool = False
    gates: tuple[tuple[str, tuple[tuple[str, float], ...]], ...] = ()  # (eval set or "*", thresholds)
    awq: bool = False  # quantized from the AWQ-scaled base (recipe has `awq:`, quant did not opt out)
    imatrix: bool = False  # quantized with the recipe's importance matrix
    split: Split | None = None  # published as shards (its own `split:` or the recipe's default)
    mix: Mix | None = None  # `type: mix`: the map is solved (pipeline/stages/mix/), `type` is the label's type

    @property
    def base(self) -> str:
        """Which base GGUF this quant is made from: ``plain`` (the published F16) or ``awq``."""
        return "awq" if self.awq else "plain"

    @property
    def flavour(self) -> str:
        """What a mix's sensitivity is measured on, by name: its base, with or without the importance matrix."""
        return str(Flavour(self.base, self.imatrix))

    @property
    def key(self) -> str:
        """The Snakemake wildcard value, file-name suffix and label: TYPE[_VARIANT] (pipeline/recipe/naming.py)."""
        return naming.quant_label(self.type, self.variant)

    def quantize_args(self, map_name: bool = False) -> list[str]:
        """llama-quantize's options; ``map_name``: the map file by its name (records), not its path."""
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
        if self.tensor_types_file:
            args += ["--tensor-type-file", self.tensor_types_file.name if map_name else str(self.tensor_types_file)]
        return args

    def tensor_patterns(self) -> list[tuple[str, str, str]]:
        """Every ``--tensor-type`` pattern in llama-quantize's order (first match wins): (pattern, TYPE, where)."""
        out = []
        for j, tt in enumerate(self.tensor_types):
            pattern, _, qtype = tt.partition("=")
            out.append((pattern.lower(), qtype.upper(), f"tensor_types[{j}]"))
        name = self.tensor_types_file.name if self.tensor_types_file else ""
        out += [(pattern, qtype, f"tensor_types_file {name} line {line}") for pattern, qtype, line in self.tensor_map]
        return out

    def describe(self) -> dict:
        out: dict[str, Any] = {"type": self.type}
        if self.variant:
            out["variant"] = self.variant
        args = self.quantize_args(map_name=True)
        if args:
            out["llama_quantize_args"] = args
        if self.awq:
            out["awq"] = True
        if self.imatrix:
            out["imatrix"] = True
        if self.mix:
            out["mix"] = self.mix.describe()
        return out


@dataclass(frozen=True)
class Draft:
    """A draft for speculative decoding: a model built beside the main model, a given GGUF, or (``mtp``) the
    main model's own multi-token-prediction heads."""

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
    mtp: bool = False  # the main model's MTP heads are the draft (llama.cpp --spec-type draft-mtp)
    speedup: Speedup | None = Speedup()  # None: speed-up not measured (draft.speedup: false)
    min_speedup: float | None = None

    @property
    def spec_type(self) -> str:
        """llama.cpp's ``--spec-type`` of this draft (common/speculative.cpp:33-45 of b11312)."""
        return "draft-mtp" if self.mtp else "draft-simple"


@dataclass(frozen=True)
class Conformance:
    """Recipe ``conformance:``: the base GGUF checked against the HF model (pipeline/stages/conformance/)."""

    enabled: bool = True
    chunks: int = 4
    text: Path | None = None  # logit-fidelity text of a recipe without eval sets (a built draft: the main's first)
    accept: tuple[str, ...] = ()  # defect causes published as known differences (ACCEPTABLE_CAUSES)
    strict: bool = False  # the known limitations (CONFORMANCE_LIMITATIONS) fail too

    def describe(self) -> dict:
        # accept and strict only when set: a recipe without them keeps its trigger
        extra = {"accept": list(self.accept)} if self.accept else {}
        return {"enabled": self.enabled, "chunks": self.chunks, **extra, **({"strict": True} if self.strict else {})}


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
    sensitivity: Sensitivity | None = None  # measured for the mixes (`type: mix` quants)
    # the fix path: written into the base GGUF after convert (pipeline/stages/convert.py), so every quant carries them
    chat_template_override: Path | None = None
    eos_token_ids: tuple[int, ...] | None = None
    add_bos: bool | None = None
    tokenizer_pre: str | None = None
    device_slice: int = 0  # chunks of the first eval set published for `ggufpipe device-check` (0: none)
    devices: tuple[Device, ...] = ()  # target devices the publish stage predicts memory on (pipeline/recipe/devices.py)
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
        if self.tokenizer_pre is not None:
            out["tokenizer_pre"] = self.tokenizer_pre
        return out

    @property
    def bases(self) -> list[str]:
        """Base GGUFs the quants are made from (``plain`` is always built: it is the gates' reference)."""
        return ["plain"] + (["awq"] if any(q.awq for q in self.quants) else [])

    @property
    def mix_flavours(self) -> list[str]:
        """The flavours (base, importance matrix) some mix is solved for: one sensitivity measurement each."""
        return sorted({q.flavour for q in self.quants if q.mix})

    def mix_candidates(self, flavour: str) -> tuple[str, ...]:
        """Every candidate the mixes of ``flavour`` may choose: the union, in the ladder's order (bits, then name)."""
        found = {c for q in self.quants if q.mix and q.flavour == flavour for c in q.mix.candidates}
        return tuple(sorted(found, key=lambda t: (type_bpw(t), t)))

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
        first = first_text_set(self.eval_sets)
        text = first.text if first else self.conformance.text
        return Recipe(path=self.path, sha256=self.sha256, name=self.draft_name, source=d.source, outtype=d.outtype,
                      quants=d.quants, description=f"draft model of {self.name}", license=self.license,
                      eval_sets=(), bench=False, draft=None, raw={},
                      conformance=replace(self.conformance, text=text),
                      # the pre-tokenizer is part of the shared vocabulary (the vocab rule compares it)
                      tokenizer_pre=self.tokenizer_pre)

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
        if q.mix and q.mix.target:  # a quality target is a promise the gates hold the mix to
            out[q.mix.target[0]] = min(out[q.mix.target[0]], q.mix.target[1])
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
        keys = [self.base_key, *(q.key for q in self.quants)]
        if self.mtp == "separate":
            keys.append(self.mtp_key)
        return keys

    def split_for(self, key: str) -> Split | None:
        """How file ``key`` is split (None: published whole)."""
        if key == self.mtp_key:  # whole at the repo root: llama.cpp looks for the sidecar only in the model's
            return None  # folder or above (find_best_sibling, download.cpp:574-582), never in a shard folder
        if key == self.base_key:
            return self.split
        return self.quant(key).split

    def artifact_for(self, key: str) -> str:
        """What ``artifacts/<name>/`` holds for ``key``: the file ``<name>-<KEY>.gguf``, or for a split
        file the folder ``<name>-<KEY>`` of its shards ``<name>-<KEY>-0000i-of-0000N.gguf``."""
        return f"{self.name}-{key}" if self.split_for(key) else self.file_for(key)

    def published_names(self, where: str = "quants") -> list[naming.Published]:
        """Every model file this recipe publishes, as the resolvers see it (pipeline/recipe/naming.py); a split file by
        the name of its first shard of a representative two."""
        out = []
        for key in self.model_keys:
            if key == self.base_key:
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
    def base_key(self) -> str:
        """``F16``/``BF16``: the model key of the base file, the quants' source (the outtype, upper-cased)."""
        return self.outtype.upper()

    @property
    def first_eval_set(self) -> EvalSet | None:
        """The eval set the device slice, the draft's agreement and conformance's logits use (None: no gates)."""
        return self.eval_sets[0] if self.eval_sets else None

    @property
    def long_eval_set(self) -> EvalSet | None:
        """The first ``ctx: long`` eval set: conformance's logit check also runs on its one long chunk."""
        return next((es for es in self.eval_sets if es.long), None)

    @property
    def base_file(self) -> str:
        return f"{self.name}-{self.base_key}.gguf"

    @property
    def mtp_file(self) -> str:
        """The MTP-head draft exported by ``mtp: separate``."""
        return f"{self.name}-{self.mtp_key}.gguf"

    @property
    def mtp_key(self) -> str:
        """``mtp-F16_MTP``: llama.cpp's sidecar marker and a Hub label of its own (pipeline/recipe/naming.py)."""
        return naming.mtp_key(self.outtype)
