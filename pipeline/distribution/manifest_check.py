"""What the readers of a manifest (``artifacts/<name>/manifest.json``) expect of it, written and checked in one place.

A manifest reaches ``ggufpipe verify``, ``dvc-link``, ``rebuild-check``, ``hub-publish`` and ``ci`` from outside as
often as from the publish stage: pulled with a folder, edited by hand or in a pull request. :func:`read_manifest` reads
it (a regular file, bounded, any JSON nesting) and :func:`check_manifest` checks every part those readers use before
any of them looks inside: its type, a number's range (pipeline/bounds.py), a digest's form, and that every file name
is one plain path segment -- the write side's rule (``plain_name``, pipeline/layout.py), so that no reader joins a
``../`` or an absolute path under the folder. A reader then indexes what the check vouched for and meets no KeyError,
no wrong type and no path out of the folder; parts no reader uses are not looked at. One line names the file and
the field (``manifest.json: artifacts[2].size_bytes: must be an integer 0..9223372036854775807, got 'x'``).

Standard library only: ``ggufpipe verify`` runs it on a device.
"""

from __future__ import annotations

import os
import re

from pipeline.bounds import BYTES, CHUNKS, COUNT, CTX, FRACTION, INT32_MAX, THREADS, UINT32_MAX, Range, integer, shown
from pipeline.errors import ArtifactError, PipelineError
from pipeline.fsutil import read_json


class Kind:
    """A JSON scalar of one kind: ``what`` names it in the error line, ``ok`` tests a value."""

    __slots__ = ("what", "ok")

    def __init__(self, what: str, ok):
        self.what, self.ok = what, ok

    def problem(self, value) -> str | None:
        return None if self.ok(value) else f"must be {self.what}, got {shown(value)}"


class Name(Kind):
    """A file name in the manifest's folder: one plain path segment (``plain_name``'s rule)."""

    def __init__(self):
        super().__init__("a plain file name", plain)

    def problem(self, value) -> str | None:
        if not isinstance(value, str):
            return f"must be a plain file name (a string), got {shown(value)}"
        if not plain(value):
            return f"{shown(value)} is not a plain file name: a manifest's files never leave its folder"
        return None


def plain(name: str) -> bool:
    """One plain path segment: no separator, not ``.``/``..`` or hidden, no NUL (pipeline/layout.py ``plain_name``)."""
    return bool(name) and not any(c in name for c in "/\\\0") and not name.startswith(".")


class Obj:
    """A JSON object: ``fields`` (key -> spec) are checked where present, ``need`` must be present; other keys are
    not looked at. ``rule(value)`` adds a requirement that depends on the value: ``(key, problem)`` or None."""

    __slots__ = ("fields", "need", "rule")

    def __init__(self, fields: dict, need: tuple[str, ...] = (), rule=None):
        self.fields, self.need, self.rule = fields, need, rule


class Arr:
    """A JSON array of ``item``; ``nonempty``: at least one."""

    __slots__ = ("item", "nonempty")

    def __init__(self, item, nonempty: bool = False):
        self.item, self.nonempty = item, nonempty


class Map:
    """A JSON object whose every value is ``value`` and every key is ``key`` (a Kind, default any string)."""

    __slots__ = ("value", "key")

    def __init__(self, value, key: Kind | None = None):
        self.value, self.key = value, key


class Opt:
    """``spec`` or null (the readers treat a null section as an absent one)."""

    __slots__ = ("spec",)

    def __init__(self, spec):
        self.spec = spec


STR = Kind("a string", lambda v: isinstance(v, str))
BOOL = Kind("true or false", lambda v: isinstance(v, bool))
NAME = Name()


def _matches(pattern: str):
    rx = re.compile(pattern)
    return lambda v: isinstance(v, str) and rx.fullmatch(v) is not None


SHA256 = Kind("a SHA256 (64 lowercase hex digits)", _matches(r"[0-9a-f]{64}"))
# the fetch stage records the resolved commit; rebuild-check joins it under the hub cache's snapshots/
COMMIT = Kind("a commit id (40 lowercase hex digits)", _matches(r"[0-9a-f]{40}(?:[0-9a-f]{24})?"))
# joined into the hub cache's models--<org>--<name> folder: pipeline/recipe/model.py REPO_RE, without ".."
REPO = Kind("a Hub repo id <org>/<name>", _matches(r"(?!.*\.\.)[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*"))

GGUF_VERSION = integer(1, UINT32_MAX, "GGUF's version is a uint32")
BITS_PER_WEIGHT = Range(0, 64, note="ggml's widest type, F64, has 64")
BUILD_NUMBER = integer(0, INT32_MAX)
N_MAX = integer(0, INT32_MAX)
# A measurement the readers only show (a perplexity, a KLD, a ratio, a speed-up): any number. The gates judged it at
# build time; a NaN that failed its gate stays in the manifest with its rejected quant, and refusing it here would
# make every published file of that build unverifiable. Shown as it is ("nan"), it decides nothing.
SHOWN = Kind("a number", lambda v: isinstance(v, (int, float)) and not isinstance(v, bool))

# --------------------------------------------------------------------------- the schema: what the readers use


def _entry_rule(e: dict):
    """A split file's entry needs the model's tensor count (its shards' split keys are checked against it); any other
    entry needs its file's SHA256."""
    need = "tensor_count" if e.get("split") else "sha256"
    return None if need in e else (need, "missing")


def _source_rule(s: dict):
    """A Hub source needs its resolved commit (rebuild-check looks it up in the hub cache)."""
    return ("commit", "missing") if s.get("repo") and "commit" not in s else None


_SHARD = Obj({"file": NAME, "size_bytes": BYTES, "sha256": SHA256, "tensor_count": COUNT},
             need=("file", "size_bytes", "sha256", "tensor_count"))
_SPLIT = Obj({"shards": Arr(_SHARD, nonempty=True), "count": COUNT,
              "unsplit": Obj({"file": NAME, "sha256": SHA256, "size_bytes": BYTES}, need=("file", "sha256"))},
             need=("shards", "unsplit"))
_MIX = Obj({"map": Obj({"file": NAME, "sha256": SHA256}, need=("file", "sha256")), "flavour": NAME},
           need=("map", "flavour"))
_CALIBRATION = Obj({"threads": THREADS, "device": STR, "calibration_sha256": SHA256}, need=("calibration_sha256",))
_FAILURE = Obj({"message": STR, "check": STR, "metric": STR, "eval_set": STR}, need=("message",))
_METRICS = Map(Obj({k: Opt(SHOWN) for k in ("ppl_ratio", "kld_mean", "kld_p99", "same_top_p")}))
_ENTRY = {
    "file": NAME, "size_bytes": BYTES, "sha256": SHA256, "quant_type": STR, "role": STR,
    # the header facts verify compares with the file's
    "gguf_version": GGUF_VERSION, "tensor_count": COUNT, "parameter_count": COUNT, "architecture": STR,
    "bits_per_weight": BITS_PER_WEIGHT,
    "split": Opt(_SPLIT), "mix": Opt(_MIX), "calibration": Obj({"awq": _CALIBRATION, "imatrix": _CALIBRATION}),
    "requested": Obj({"type": STR, "variant": Opt(STR)}), "tensor_types_file": Opt(Obj({"sha256": SHA256}, ("sha256",))),
    "metrics": Opt(_METRICS), "failures": Arr(_FAILURE),
}
_ACCEPTANCE = Obj({"best_n_max": Opt(N_MAX), "acceptance_rate": Opt(SHOWN), "threads": THREADS,
                   "by_n_max": Map(Opt(Obj({"est_speedup": Opt(SHOWN)})))})
_DRAFT = Obj({
    "recipe": Opt(STR), "min_acceptance": Opt(FRACTION),
    "files": Arr(Obj({"file": NAME, "quant_type": STR, "size_bytes": BYTES}, need=("file", "quant_type", "size_bytes"))),
    "gguf": Opt(Obj({"file": STR}, need=("file",))),
    "pairs": Arr(Obj({"main": STR, "draft": STR, "compatible": BOOL, "reason": Opt(STR), "rule": Opt(STR),
                      "acceptance": Opt(_ACCEPTANCE)}, need=("main", "draft"))),
    "top1_agreement": Opt(Map(Obj({"top1_agreement": SHOWN}))),
})
_VOUCHED = Obj({"file": NAME, "sha256": SHA256}, need=("file", "sha256"))

MANIFEST = Obj({
    "name": NAME, "build_id": STR,
    "artifacts": Arr(Obj(_ENTRY, need=("file", "size_bytes", "quant_type"), rule=_entry_rule)),
    "rejected": Arr(Obj(_ENTRY, need=("file",))),
    "failures": Arr(_FAILURE),
    "device_check": Opt(Obj({"file": NAME, "size_bytes": BYTES, "sha256": SHA256, "chunks": CHUNKS, "eval_set": STR,
                             "ctx": CTX, "scored_tokens": COUNT},
                            need=("file", "size_bytes", "sha256", "chunks", "eval_set"))),
    "recipe": Obj({"file": NAME, "sha256": SHA256}, need=("file", "sha256")),
    "source": Obj({"repo": Opt(REPO), "commit": COMMIT, "revision": Opt(STR), "path": Opt(STR)}, rule=_source_rule),
    "tools": Obj({"llama_cpp_build": BUILD_NUMBER, "llama_cpp_commit": STR, "backend": STR, "python": Map(Map(STR))},
                 need=("llama_cpp_build", "llama_cpp_commit")),
    "build": Opt(Obj({"eval_threads": Map(THREADS)})),
    "eval_sets": Arr(Obj({"name": STR, "threads": THREADS, "text_sha256": SHA256}, need=("name", "text_sha256"))),
    "eval_base": Map(Obj({"ppl": SHOWN}, need=("ppl",))),
    "gguf_metadata": Obj({"general.quantized_by": STR}),
    "sensitivity": Opt(Map(Obj({"sha256": SHA256, "text_sha256": SHA256}, need=("sha256", "text_sha256")), key=NAME)),
    "ollama": Opt(Arr(_VOUCHED)),
    "hub": Opt(Obj({"files": Arr(_VOUCHED)})),
    "draft": Opt(_DRAFT),
}, need=("artifacts",))

# --------------------------------------------------------------------------- the check


_TYPE = {dict: "an object", list: "an array", str: "a string", bool: "true or false", int: "a number",
         float: "a number", type(None): "null"}


def _key_path(where: str, key: str) -> str:
    return f"{where}.{key}" if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key) else f"{where}[{key!r}]"


def problem(spec, value, where: str) -> tuple[str, str] | None:
    """``(field path, what is wrong)`` for the first part of ``value`` that ``spec`` refuses; None when all hold."""
    if isinstance(spec, Opt):
        return None if value is None else problem(spec.spec, value, where)
    if isinstance(spec, (Obj, Map)):
        if not isinstance(value, dict):
            return where, f"must be an object, got {_TYPE.get(type(value), type(value).__name__)}"
        if isinstance(spec, Map):
            for k, v in value.items():
                at = f"{where}[{k!r}]"
                if spec.key is not None and (p := spec.key.problem(k)) is not None:
                    return at, f"the key {p}"
                if (p := problem(spec.value, v, at)) is not None:
                    return p
            return None
        for k in spec.need:
            if k not in value:
                return _key_path(where, k), "missing"
        for k, sub in spec.fields.items():
            if k in value and (p := problem(sub, value[k], _key_path(where, k))) is not None:
                return p
        if spec.rule is not None and (p := spec.rule(value)) is not None:
            return _key_path(where, p[0]), p[1]
        return None
    if isinstance(spec, Arr):
        if not isinstance(value, list):
            return where, f"must be an array, got {_TYPE.get(type(value), type(value).__name__)}"
        if spec.nonempty and not value:
            return where, "must not be empty"
        for i, v in enumerate(value):
            if (p := problem(spec.item, v, f"{where}[{i}]")) is not None:
                return p
        return None
    msg = spec.problem(value)  # a Kind or a Range
    return None if msg is None else (where, msg)


def check_manifest(data, path: str | os.PathLike, require: tuple[str, ...] = (),
                   use: tuple[str, ...] | None = None) -> dict:
    """``data`` (a manifest read from ``path``) when every part the readers use holds and the top-level sections in
    ``require`` are there; else an :class:`~pipeline.errors.ArtifactError`: ``<path>: <field>: <what is wrong>``.
    ``use``: the only top-level sections the reader looks at (None: all), so that a device verifying a file of an
    older build is not refused for a part of it that only a rebuild reads."""
    if not isinstance(data, dict):
        raise ArtifactError(path, f"{path}: must be a JSON object (a ggufpipe manifest), got "
                                  f"{_TYPE.get(type(data), type(data).__name__)}")
    for key in require:
        if key not in data:
            raise ArtifactError(path, f"{path}: {key}: missing (not a ggufpipe manifest)")
    schema = MANIFEST if use is None else Obj({k: v for k, v in MANIFEST.fields.items() if k in use},
                                              tuple(k for k in MANIFEST.need if k in use))
    p = problem(schema, data, "")
    if p is not None:
        where, msg = p
        raise ArtifactError(path, f"{path}: {where.lstrip('.')}: {msg}")
    return data


def read_manifest(path: str | os.PathLike, require: tuple[str, ...] = (), use: tuple[str, ...] | None = None) -> dict:
    """The manifest at ``path``, read (:func:`~pipeline.fsutil.read_json`: a regular file, bounded) and checked
    (:func:`check_manifest`); one error line otherwise."""
    try:
        data = read_json(path, "the manifest")
    except PipelineError as exc:
        raise ArtifactError(path, str(exc)) from None
    return check_manifest(data, path, require, use)
