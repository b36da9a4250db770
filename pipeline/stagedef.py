"""A stage's one declaration (:class:`Stage`), made beside its entry function in pipeline/stages/, and the job it runs
(:class:`Job`). The Snakefile's rules, ``ggufpipe stage``, the rerun triggers, the Slurm resources and ``plan``'s rule
order are all derived from these declarations (pipeline/stages/__init__.py collects them; docs/architecture.md).

Standard library only: every stage module imports this at load time."""

from __future__ import annotations

import json
import os
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.envs import lock_digest

# The ``ggufpipe stage`` flag that carries each wildcard (the names ci_summary and the docs already use).
WILDCARD_FLAGS = {"outtype": "outtype", "base": "base", "flavour": "flavour", "quant": "quant", "bkey": "quant",
                  "skey": "quant", "mkey": "quant", "dkey": "draft-quant", "es": "eval-set"}
OUTPUTS = ("console", "log", "tee")  # where a stage's own output goes (Stage.output)
THREADS = ("threads", "eval_threads", "calib_threads", "speedup_threads")  # config keys a stage's threads may name


@dataclass(frozen=True)
class Settings:
    """What a stage's trigger may depend on beyond its recipe: the workflow's config and the pinned tools."""

    eval_threads: int = 2
    calib_threads: int = 2
    quantized_by: str = "ggufpipe"
    build_number: int | None = None
    commit: str | None = None
    offload: tuple = ()  # (backend, ngl) off the CPU, else empty (docs/gpu.md)


@dataclass
class Job:
    """One run of a stage: the recipe, its wildcards, the paths Snakemake resolved (or the declaration's, run by hand)
    and the stage options the command line carries."""

    recipe: Any
    layout: Any
    wc: dict[str, str]
    input: dict[str, Any]
    output: dict[str, str]
    log: Path
    threads: int = 2
    options: dict[str, Any] = field(default_factory=dict)

    def __getitem__(self, key: str) -> str:  # job["quant"]: a wildcard
        return self.wc[key]


@dataclass(frozen=True)
class Stage:
    """One stage, declared once beside its entry function.

    ``rule``: the Snakemake rule; ``cli``: ``ggufpipe stage <cli>``; ``run(job)`` calls the entry function;
    ``outputs(layout)``: name -> path pattern in the rule's wildcards (``{name}`` and ``wildcards``);
    ``inputs(recipe, wc, layout)``: name -> path or list of paths; ``log``: the log's stem pattern
    (``work/<name>/logs/<stem>.log``); ``threads``: a workflow config key (:data:`THREADS`) or a number;
    ``capped``: the threads are capped by ``--cores`` (else fixed: the figures must not depend on it);
    ``trigger(recipe, wc, settings)``: the fields whose change makes the output stale (its sorted JSON is the rule's
    ``trigger`` param); ``resources``: mem_mb, disk_mb and runtime, constants or functions of the job's sizes
    (pipeline/devices/plan_jobs.py ``JobSizes``); ``order``: place in build order; ``output``: where the stage's own
    output goes (``console``, ``log``: the log only, ``tee``: both); ``directories``: outputs that are folders;
    ``options``: settings passed on the command line (``quantized_by``, ``hub_cache``); ``envs``: the environments
    besides the build's that its run needs (pipeline/envs.py; checked before a build starts)."""

    rule: str
    cli: str
    run: Callable[[Job], None]
    outputs: Callable[[Any], dict[str, Any]]
    log: str
    order: float
    inputs: Callable[[Any, dict, Any], dict[str, Any]] | None = None
    wildcards: tuple[str, ...] = ()
    threads: str | int = 1
    capped: bool = False
    trigger: Callable[[Any, dict, Settings], dict] | None = None
    resources: dict[str, Any] = field(default_factory=dict)
    output: str = "console"
    directories: tuple[str, ...] = ()
    options: tuple[str, ...] = ()
    envs: tuple[str, ...] = ()

    def __post_init__(self):
        assert self.output in OUTPUTS, self.output
        assert isinstance(self.threads, int) or self.threads in THREADS, self.threads
        assert set(self.wildcards) <= set(WILDCARD_FLAGS), self.wildcards
        assert set(self.resources) <= {"mem_mb", "disk_mb", "runtime"}, self.resources

    def patterns(self, layout) -> dict[str, str]:
        return {k: str(v) for k, v in self.outputs(layout).items()}

    def input_paths(self, recipe, wc: dict, layout) -> dict[str, Any]:
        if self.inputs is None:
            return {}
        return {k: (v if isinstance(v, list) else str(v)) for k, v in self.inputs(recipe, wc, layout).items()}

    def trigger_text(self, recipe, wc: dict, settings: Settings) -> str:
        """The rule's ``trigger`` param: the sorted JSON of the declared fields, and the lock of each environment the
        stage runs (its packages can change the output)."""
        fields = self.trigger(recipe, wc, settings)
        if self.envs:
            fields = {**fields, "envs": {e: lock_digest(e) for e in self.envs}}
        return json.dumps(fields, sort_keys=True, default=str)


# ------------------------------------------------------------------ the paths on the command line
def io_args(input, output) -> str:
    """``--in k=path`` / ``--out k=path`` for every named input and output of a job (``k[]=`` for each path of a list),
    quoted for the shell: what the rule's ``{params.io}`` hands the stage."""
    args = []
    for flag, named in (("--in", input), ("--out", output)):
        for k, v in named.items():
            if isinstance(v, (str, os.PathLike)):
                args += [flag, f"{k}={v}"]
            else:
                args += [x for p in v for x in (flag, f"{k}[]={p}")]
    return shlex.join(args)


def parse_io(items: list[str] | None) -> dict[str, Any]:
    """The inverse of :func:`io_args` for one flag's values."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, _, path = item.partition("=")
        if key.endswith("[]"):
            out.setdefault(key[:-2], []).append(path)
        else:
            out[key] = path
    return out


# ------------------------------------------------------------------ sizes the resources are computed from
FETCH_UNKNOWN_MB = 20480  # a source not in any local cache yet: room for a ~10B-parameter BF16 checkpoint
LOGITS_VOCAB_BOUND = 262144  # n_vocab assumed before the base GGUF exists (Gemma 3's vocabulary)


def mem_mb(input_mb: float, factor: float, floor: int = 512) -> int:
    return int(max(floor, input_mb * factor + floor))


def size_mb(path: str | os.PathLike) -> float:
    """Size of a file, or of every file under a folder (symlinks followed), in MiB; 0 when absent."""
    p = Path(path)
    try:
        if p.is_dir():
            return sum(f.stat().st_size for f in p.rglob("*") if f.is_file()) / 2**20
        return p.stat().st_size / 2**20
    except OSError:
        return 0.0


def logits_bytes(ctx: int, chunks: int, n_vocab: int) -> int:
    """Size of the ``llama-perplexity --kl-divergence-base`` file: a 20-byte header, the ctx * chunks tokens (int32),
    then for each scored token (the last ctx - 1 - ctx/2 of each chunk) the vocabulary's log-probabilities as uint16
    (n_vocab rounded up to even) plus 4 uint16 (min and scale floats)."""
    per_token = 2 * (2 * ((n_vocab + 1) // 2) + 4)
    return 20 + 4 * ctx * chunks + chunks * (ctx - 1 - ctx // 2) * per_token
