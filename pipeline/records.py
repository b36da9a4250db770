"""The stage records: the JSON file each stage writes beside its output (``work/<name>/records/``, ``eval/``,
``bench/``, ``draft/``), read by later stages and by publish.

One dataclass per record kind, its fields in the order the file lists its keys. :meth:`StageRecord.write` writes it
atomically (indent 2, UTF-8, a final newline: the bytes the stages always wrote); :meth:`StageRecord.read` reads it.
A field that defaults to :data:`ABSENT` is a key some records lack (a variant, or a key older records did not have):
it is left out of the file, and ``rec.get(key)`` reads it. Reading is lenient like a dict: a key the file lacks is
absent, and only using it fails (:class:`~pipeline.errors.PipelineError` naming the file); keys the class does not
know are kept in ``extra`` and written back after the known ones.

Nested values (metrics, toolchain, tensor types, ...) stay plain dicts and lists: the manifest copies them as they are.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, ClassVar

from pipeline.errors import PipelineError
from pipeline.fsutil import write_json_atomic


class _Absent:
    """The value of a field whose key the record does not have."""

    _instance = None

    def __new__(cls):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


def _parse(path: str | Path):
    return json.loads(Path(path).read_text())


def load_json(path: str | Path, who: str = "publish"):
    """A JSON file a stage reads (a stage record, ``devices.json``), or one clear error line."""
    try:
        return _parse(path)
    except (OSError, ValueError) as exc:
        raise PipelineError(f"{who}: cannot read stage record {path}: {exc}") from None


def record(cls):
    """The dataclass decorator of a record kind: keyword-only fields (in file order, required and optional mixed),
    equality and repr by the written keys."""
    return dataclasses.dataclass(kw_only=True, eq=False, repr=False)(cls)


@record
class StageRecord:
    KIND: ClassVar[str] = "stage"
    extra: dict = dataclasses.field(default_factory=dict)  # keys this class does not name, written last
    _path: str | None = dataclasses.field(default=None, compare=False)  # the file it was read from (errors)

    def __getattribute__(self, name: str):
        value = object.__getattribute__(self, name)
        if value is ABSENT and not name.startswith("_"):
            where = object.__getattribute__(self, "_path") or f"the {type(self).KIND} record"
            raise PipelineError(f"{where}: no {name!r} in the stage record: re-run the stage that writes it")
        return value

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls) if f.name not in ("extra", "_path")]

    @classmethod
    def from_dict(cls, data: dict, path: str | Path | None = None):
        if not isinstance(data, dict):
            article = "an" if cls.KIND[0] in "aeiou" else "a"
            raise PipelineError(f"{path or cls.KIND}: {article} {cls.KIND} record must be a JSON object")
        known = cls.keys()
        kw = {k: data.get(k, ABSENT) for k in known}
        return cls(**kw, extra={k: v for k, v in data.items() if k not in known},
                   _path=str(path) if path is not None else None)

    @classmethod
    def read(cls, path: str | Path, who: str = "publish"):
        """The record at ``path``; ``who`` names the reader in the error line of a missing or damaged file."""
        return cls.from_dict(load_json(path, who), path)

    @classmethod
    def parse(cls, path: str | Path):
        """The record at ``path``, raising OSError or ValueError as they come (for a reader with its own message)."""
        return cls.from_dict(_parse(path), path)

    def to_dict(self) -> dict:
        raw = object.__getattribute__
        out = {k: raw(self, k) for k in self.keys() if raw(self, k) is not ABSENT}
        out.update(raw(self, "extra"))
        return out

    def write(self, path: str | Path) -> None:
        write_json_atomic(path, self.to_dict())

    def get(self, key: str, default=None):
        """The value of ``key`` (a field or an extra key), ``default`` when the record lacks it."""
        return self.to_dict().get(key, default)

    def has(self, key: str) -> bool:
        return key in self.to_dict()

    def __eq__(self, other) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.to_dict()!r})"


# --------------------------------------------------------------------------- source and conversion


@record
class FetchRecord(StageRecord):
    """fetch: the resolved source (repo and commit, or folder) and every fetched file's SHA256 and size."""
    KIND: ClassVar[str] = "fetch"
    source: dict
    files: dict


@record
class ConvertRecord(StageRecord):
    """convert (and the AWQ-folded convert): the converter, toolchain, Python packages, metadata written."""
    KIND: ClassVar[str] = "convert"
    outtype: str
    tool: str
    toolchain: dict
    python: dict
    gguf_metadata: dict
    seconds: float
    mtp: dict = ABSENT  # recipe mtp: strip / separate: {mode, converter_args}
    vocab_overrides: dict = ABSENT  # the fix path's keys
    convert_as: dict = ABSENT  # source.convert_as: {class, architectures (config.json's)}


@record
class MtpConvertRecord(StageRecord):
    """convert-mtp (recipe ``mtp: separate``): the MTP-head draft exported with ``--mtp``."""
    KIND: ClassVar[str] = "convert-mtp"
    outtype: str
    tool: str
    converter_args: list
    toolchain: dict
    python: dict
    gguf_metadata: dict
    mtp: dict
    seconds: float


@record
class AwqRecord(StageRecord):
    KIND: ClassVar[str] = "awq"
    params: dict
    calibration_sha256: str
    device: str
    threads: int | None  # None on CUDA; absent from records older than the key
    torch: str
    engine: str = ABSENT  # autoawq | llmcompressor; absent from records older than the key (autoawq)
    autoawq: str | None
    llmcompressor: str | None = ABSENT
    transformers: str | None
    copied_from_source: list
    seconds: float


@record
class ImatrixRecord(StageRecord):
    KIND: ClassVar[str] = "imatrix"
    base: str
    params: dict
    calibration_sha256: str
    calibration_tokens: int
    sha256: str
    facts: dict
    tool: str
    toolchain: dict
    threads: int
    seconds: float
    experts: list = ABSENT  # MoE: per layer the experts the calibration reached (pipeline/stages/imatrix_coverage.py)
    render: dict = ABSENT  # calibration {conversations: FILE}: how they were rendered (pipeline/stages/eval_sets.py)


@record
class QuantRecord(StageRecord):
    KIND: ClassVar[str] = "quant"
    quant: dict
    base: str
    tool: str
    toolchain: dict
    seconds: float
    tensor_types: dict
    tensor_types_file: dict = ABSENT  # {file, sha256}: the map llama-quantize was given
    imatrix_sha256: str = ABSENT
    mix: dict = ABSENT  # the solve's layout record (MixLayoutRecord.to_dict())


# --------------------------------------------------------------------------- measurements


@record
class EvalBaseRecord(StageRecord):
    KIND: ClassVar[str] = "eval-base"
    eval_set: str
    text: str
    text_sha256: str
    text_tokens: int
    ctx: int
    chunks: int
    scored_tokens: int
    threads: int
    ppl: float
    ppl_stderr: float
    seconds: float
    render: dict = ABSENT  # render: chat: how the conversations became ids (pipeline/stages/eval_sets.py)


@record
class EvalRecord(StageRecord):
    KIND: ClassVar[str] = "eval"
    eval_set: str
    text: str
    text_sha256: str
    ctx: int
    chunks: int
    scored_tokens: int
    threads: int
    metrics: dict
    chunk_rows: list  # the running statistics after each chunk (the device slice's values)
    seconds: float
    kv: dict = ABSENT  # eval set kv_types: {kv type: statistics} of the runs with -ctk/-ctv (f16 is ``metrics``)


@record
class BenchRecord(StageRecord):
    KIND: ClassVar[str] = "bench"
    pp_tokens_per_s: float
    pp_tokens: int
    tg_tokens_per_s: float
    tg_tokens: int
    threads: int
    machine: str
    label: str


@record
class DeviceSliceRecord(StageRecord):
    KIND: ClassVar[str] = "device-slice"
    eval_set: str
    text: str
    text_sha256: str
    ctx: int
    chunks: int
    scored_tokens: int
    n_vocab: int
    file: str
    sha256: str
    size_bytes: int
    threads: int
    base_metrics: dict
    seconds: float


@record
class ConformanceRecord(StageRecord):
    """conformance: the verdict (``skipped`` when the recipe opts out: then only the first six keys)."""
    KIND: ClassVar[str] = "conformance"
    recipe: str
    passed: bool
    skipped: str = ABSENT
    failures: list
    warnings: list
    checks: dict
    thresholds: dict = ABSENT
    chunks: int = ABSENT
    threads: int | None = ABSENT
    gguf: str = ABSENT
    vocab: dict = ABSENT
    helper_requests: int = ABSENT
    toolchain: dict = ABSENT
    python: dict = ABSENT
    details: dict = ABSENT
    seconds: dict = ABSENT


# --------------------------------------------------------------------------- drafts (speculative decoding)


@record
class VocabRecord(StageRecord):
    KIND: ClassVar[str] = "vocab"
    compatible: bool
    rule: str | None
    reason: str | None
    diff: list
    warnings: list
    main: dict
    draft: dict
    main_file: str
    draft_file: str
    message: str = ABSENT  # incompatible pairs: the one-line failure


@record
class AcceptanceRecord(StageRecord):
    """acceptance (``spec``): measured acceptance of one pair, or ``skipped`` (then only the first seven keys)."""
    KIND: ClassVar[str] = "acceptance"
    eval_text: str
    text_sha256: str
    prompts: int
    n_predict: int
    threads: int
    spec_type: str = ABSENT  # absent from records older than MTP drafts
    skipped: str = ABSENT
    by_n_max: dict = ABSENT
    best_n_max: int = ABSENT
    acceptance_rate: float = ABSENT
    drafted: int = ABSENT
    accepted: int = ABSENT
    draft_cost_ratio: float = ABSENT
    command: str = ABSENT
    served: dict = ABSENT
    label: str = ABSENT
    build_box_decode_tokens_per_s: dict = ABSENT  # volatile: the manifest's build section


@record
class SpeedupRecord(StageRecord):
    """speedup: decode speed with the draft over without, measured with llama-server (pipeline/stages/speedup.py), or
    ``skipped``. Volatile as a whole: the manifest's ``build`` section."""
    KIND: ClassVar[str] = "speedup"
    eval_text: str
    text_sha256: str
    prompts: int
    n_predict: int
    threads: int
    spec_type: str
    rounds: int
    ctx: int
    prompt_chars: int = ABSENT
    skipped: str = ABSENT
    box: str = ABSENT
    by_n_max: dict = ABSENT
    best_n_max: int = ABSENT
    speedup: float = ABSENT
    interval: list = ABSENT
    helps: bool = ABSENT
    verdict: str = ABSENT
    tuning: dict = ABSENT
    best_flags: list = ABSENT
    sampled: dict = ABSENT
    concurrent: dict = ABSENT
    command: str = ABSENT
    baseline: str = ABSENT
    seconds: float = ABSENT


@record
class AgreementRecord(StageRecord):
    KIND: ClassVar[str] = "agreement"
    eval_set: str
    skipped: str = ABSENT
    text_sha256: str = ABSENT
    scored_tokens: int = ABSENT
    top1_agreement: float = ABSENT
    kld_mean: float = ABSENT
    ppl_ratio: float = ABSENT


# --------------------------------------------------------------------------- measured mixes


@record
class SensitivityRecord(StageRecord):
    """sensitivity: what measuring one flavour cost, and the SHA256 of the measurement file it wrote."""
    KIND: ClassVar[str] = "sensitivity"
    flavour: str
    search: str  # exhaustive | screened | fisher
    groups: int
    candidates: int
    n_layers: int
    measurements: int  # 1 + groups x candidates
    exhaustive_runs: int  # the evaluations the exhaustive search runs (every written form once)
    runs: int  # evaluations run (whole-model quantize + llama-perplexity), cache hits apart
    reused: int
    skipped: int  # candidates written as the floor writes the group
    duplicates: int  # candidates written as an earlier candidate
    screens: int  # whole-model quantizes for the screened error, no evaluation
    imatrix_passes: int  # llama-imatrix passes over the sensitivity text for the screen
    quantize_seconds: float
    eval_seconds: float
    screen_seconds: float  # the screened errors, dequantized with gguf-py
    fisher_passes: int = ABSENT  # search: fisher: torch passes over the sensitivity text (0 when every error was cached)
    fisher_seconds: float = ABSENT
    cpu_seconds: float  # this stage's process and the tools it ran
    seconds: float
    sensitivity_sha256: str


@record
class MixLayoutRecord(StageRecord):
    """solve: a mix's layout (goal: ``budget`` and ``bytes``, or ``target`` and ``aim``) beside its map."""
    KIND: ClassVar[str] = "mix layout"
    solver: str
    label: str
    type: str
    flavour: str
    budget: dict = ABSENT
    bytes: int = ABSENT
    target: dict = ABSENT
    aim: float = ABSENT
    candidates: list
    floor: str
    grouping: dict
    sensitivity: dict
    choice: dict
    predicted: dict
    histogram: dict
    map_sha256: str


KINDS = (FetchRecord, ConvertRecord, MtpConvertRecord, AwqRecord, ImatrixRecord, QuantRecord, EvalBaseRecord, EvalRecord,
         BenchRecord, DeviceSliceRecord, ConformanceRecord, VocabRecord, AcceptanceRecord, AgreementRecord,
         SensitivityRecord, MixLayoutRecord)
