"""The jobs of a build, planned (pipeline/devices/plan.py predicts the sizes): the Slurm resources of every rule
(each stage declares its own: the Snakefile wraps them, ``ggufpipe plan`` evaluates them on predicted sizes), each job's disk,
RAM and hours on a stated box (:func:`plan_jobs`, :func:`hours`), and the Snakefile's pre-flight (:func:`preflight`,
:func:`check_jobs`). docs/planning.md."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pipeline.devices.plan import (
    GIB,
    MIB,
    disk_plan,
    fmt,
    free_disk,
    free_memory,
    model_shape,
    ram_plan,
)
from pipeline.devices.plan_source import Facts, source_facts
from pipeline.devices.plan_tensors import is_expert, tensor_role
from pipeline.envs import EnvError, env_python
from pipeline.gguf import ArrayValue, read_header
from pipeline.stagedef import LOGITS_VOCAB_BOUND, size_mb
from pipeline.stages import registry
from pipeline.stages.fetch import hub_snapshot_dir
from pipeline.stages.mix.screen import planned_runs


# ------------------------------------------------------------------ Slurm resources (each stage declares its own)
def resources(rule: str) -> dict:
    """A rule's declared resources (:attr:`pipeline.stagedef.Stage.resources`): MiB and minutes, constants or functions
    of the job's sizes (:class:`JobSizes` or :class:`PlannedSizes`: ``s.total``, every input, folders counted file by
    file; ``s.mb(key)``: one named input)."""
    return registry()[rule].resources


class JobSizes:
    """A Snakemake job's inputs as the resource functions see them: the files' sizes on disk now (a file not built
    yet counts as empty, as Snakemake's own ``input.size_mb``; a folder counts file by file)."""

    def __init__(self, W, wc, input):
        self.W, self.wc, self.input = W, wc, input
        self.recipe = W.recipe(wc["name"])

    @property
    def total(self) -> float:
        return sum(size_mb(f) for f in self.input)

    def _path(self, key: str) -> str:
        v = self.input[key]
        return str(v if isinstance(v, (str, os.PathLike)) else v[0])

    def mb(self, key: str) -> float:
        return size_mb(self._path(key))

    def source_mb(self) -> float | None:
        return self.W.source_mb(self.wc["name"])

    def n_vocab(self, key: str) -> int:
        """The input GGUF's vocabulary size once it exists; before that, the bound for logits estimates."""
        path = self._path(key)
        if Path(path).is_file():
            tokens = read_header(path).metadata.get("tokenizer.ggml.tokens")
            if isinstance(tokens, ArrayValue):
                return tokens.count
        return LOGITS_VOCAB_BOUND


class PlannedSizes:
    """The same view of a job planned before anything exists: input sizes (MiB) and the vocabulary predicted."""

    def __init__(self, recipe, wc: dict, inputs: dict[str, float], facts: Facts):
        self.recipe, self.wc, self.inputs, self.facts = recipe, wc, inputs, facts

    @property
    def total(self) -> float:
        return sum(self.inputs.values())

    def mb(self, key: str) -> float:
        return self.inputs.get(key, 0.0)

    def source_mb(self) -> float | None:
        return self.facts.snapshot_bytes / MIB

    def n_vocab(self, key: str) -> int:
        return self.facts.n_vocab


def rule_resources(rule: str, W) -> dict:
    """The ``resources:`` of a stage's rule: constants as they are, functions wrapped for Snakemake (called with the
    job's wildcards and input)."""
    out = {}
    for key, f in resources(rule).items():
        out[key] = f if isinstance(f, int) else _wrap(W, f)
    return out


def _wrap(W, f):
    return lambda wc, input: f(JobSizes(W, wc, input))


def evaluate_resources(rule: str, sizes) -> dict[str, int]:
    return {k: (f if isinstance(f, int) else int(f(sizes))) for k, f in resources(rule).items()}


# ------------------------------------------------------------------ the build's jobs, planned
def plan_jobs(recipe, facts: Facts) -> list[dict]:
    """Every job of a recipe's build that the plan covers, in build order: ``{"rule", "key", "wc", "inputs" (MiB),
    "disk" (bytes it writes), "ram" (peak RSS bytes or None), "slurm" ({mem_mb, disk_mb, runtime})}``. Not planned:
    draft checks and the solve of measured mixes (their jobs count 0 here); the sensitivity for its hours only."""
    disk = {(d["stage"], d["key"]): d["bytes"] for d in disk_plan(recipe, facts)}
    ram = {(r["stage"], r["key"]): r["bytes"] for r in ram_plan(recipe, facts)}
    mb = lambda stage, key="": disk.get((stage, key), 0) / MIB  # noqa: E731
    ot = recipe.base_key
    snap = facts.snapshot_bytes / MIB
    text = lambda p: (Path(p).stat().st_size / MIB) if p and Path(p).is_file() else 0.0  # noqa: E731
    jobs = []

    def add(rule, key, wc, inputs, disk_key=None, ram_key=None):
        jobs.append({"rule": rule, "key": key, "wc": {"name": recipe.name, **wc}, "inputs": inputs,
                     "disk": disk.get(disk_key or (rule, key), 0), "ram": ram.get(ram_key or (rule, key))})

    add("fetch", "", {}, {})
    if len(disk_plan(recipe, facts)) and disk.get(("fetch", "")) is not None:
        jobs[-1]["disk"] = facts.snapshot_bytes
    add("convert", ot, {"outtype": ot}, {"hf": snap})
    if ("awq", "") in disk:
        add("awq", "", {}, {"hf": snap, "text": text(recipe.awq.calibration)})
        add("convert_awq", ot, {"outtype": ot}, {"hf": mb("awq")})
    for b in recipe.imatrix_bases if recipe.imatrix is not None else []:
        src = mb("convert_awq", ot) if b == "awq" else mb("convert", ot)
        add("imatrix", b, {"base": b}, {"base": src, "text": text(recipe.imatrix.calibration)}, ram_key=("imatrix", "plain"))
    for q in recipe.quants:
        src = mb("convert_awq", ot) if q.awq else mb("convert", ot)
        inputs = {"base": src}
        if q.imatrix:
            inputs["imatrix"] = mb("imatrix", q.base)
        add("quantize", q.key, {"quant": q.key}, inputs)
    for key in recipe.model_keys:
        if recipe.split_for(key):
            add("split", key, {"skey": key}, {"gguf": mb("quantize", key) if key != ot else mb("convert", ot)})
    for es in recipe.eval_sets:
        add("eval_base", es.name, {"es": es.name}, {"base": mb("convert", ot)})
        for q in recipe.quants:
            add("eval", f"{es.name}/{q.key}", {"es": es.name, "quant": q.key},
                {"gguf": mb("quantize", q.key), "logits": mb("eval_base", es.name)})
    if recipe.device_slice:
        es = recipe.first_eval_set
        add("device_slice", "", {}, {"base": mb("convert", ot), "logits": mb("eval_base", es.name)})
    if recipe.bench:
        for key in [ot, *(q.key for q in recipe.quants)]:
            add("bench", key, {"bkey": key}, {"gguf": mb("quantize", key) if key != ot else mb("convert", ot)})
    if recipe.conformance.enabled:
        add("conformance", "", {}, {"base": mb("convert", ot), "hf": snap})
    for f in recipe.mix_flavours:  # hours only: its disk and RAM are an eval's and a quantize's, not planned apart
        add("sensitivity", f, {"flavour": f},
            {"base": mb("convert", ot), **({"hf": snap} if recipe.sensitivity.search == "fisher" else {})})
        s = recipe.sensitivity
        jobs[-1]["search"] = {"search": s.search, **planned_runs(quantized_names(facts), s.bands,
                                                                 len(recipe.mix_candidates(f)), s.search)}
    published = mb("convert", ot) + sum(mb("quantize", q.key) for q in recipe.quants)
    add("publish", "", {}, {"files": published})
    add("gate", "", {}, {"files": published})
    for j in jobs:
        j["slurm"] = evaluate_resources(j["rule"], PlannedSizes(recipe, j["wc"], j["inputs"], facts))
    return jobs


def job_key(rule: str, wc: dict) -> str:
    """The plan's key of a Snakemake job (its wildcards as :func:`plan_jobs` names them)."""
    if rule == "eval":
        return f"{wc.get('es')}/{wc.get('quant')}"
    for k in ("outtype", "base", "quant", "skey", "es", "bkey", "flavour"):
        if k in wc:
            return str(wc[k])
    return ""


# ------------------------------------------------------------------ hours on a stated box
# The box of the paper table (docs/planning.md): 32 x86-64 cores (AVX2), 256 GiB RAM, 100 MB/s download. Rates per
# core measured on this machine (2 cores, loaded; bench/plan_check.py on the demo): llama-perplexity 8192 tokens of
# the 135M model in 33.6 s (2 x params FLOPs per token: 33 GFLOP/s per core), llama-quantize 258 MiB in 2.6 s at 2
# threads (52 MB/s per core), the converter 257 MiB in 7.1 s (one core, 38 MB/s: it does not scale with cores),
# AutoAWQ's scale search (no clipping) 16 x 128 tokens in 762.8 s at 2 threads, counted as 6 x 2 x params FLOPs per
# calibration token (2.2 GFLOP/s per core), the mix screen's gguf-py dequantization 163 M weights per type in 8.1 s
# on one core (20 M weights/s per core; it runs a tensor per thread).
BOX = {"cores": 32, "ram": 256 * GIB, "net_bps": 100e6, "pp_flops_per_core": 33e9, "convert_bps": 38e6,
       "quantize_bps_per_core": 52e6, "awq_flops_per_core": 2.2e9, "screen_wps_per_core": 20e6}


def hours(job: dict, facts: Facts, recipe, box: dict = BOX) -> float:
    """A job's hours on ``box``: downloads and conversions by bytes, llama.cpp runs by 2 x params FLOPs per token
    (a mixture of experts' active parameters: each token is routed through its few experts)."""
    rule, n = job["rule"], facts.n_active
    tokens = 0
    if rule == "fetch":
        return facts.snapshot_bytes / box["net_bps"] / 3600
    if rule in ("convert", "convert_awq", "split", "publish"):
        return (sum(job["inputs"].values()) * MIB) / box["convert_bps"] / 3600
    if rule == "quantize":
        return job["inputs"].get("base", 0) * MIB / (box["quantize_bps_per_core"] * box["cores"]) / 3600
    if rule in ("eval_base", "eval"):
        es = recipe.eval_set(job["wc"]["es"])
        tokens = es.ctx * es.chunks
    elif rule == "device_slice":
        tokens = recipe.first_eval_set.ctx * recipe.device_slice
    elif rule == "imatrix":
        tokens = recipe.imatrix.ctx * recipe.imatrix.chunks
    elif rule == "conformance":
        tokens = (recipe.first_eval_set.ctx if recipe.eval_sets else 512) * recipe.conformance.chunks
    elif rule == "bench":
        tokens = 512 + 128 * 20  # llama-bench pp512 + tg128 (token generation is bandwidth-bound: ~20x a pp token)
    elif rule == "awq":
        a = recipe.awq
        return 2 * n * a.n_samples * a.seq_len * 6 / (box["awq_flops_per_core"] * box["cores"]) / 3600
    elif rule == "sensitivity":
        s, runs = recipe.sensitivity, job["search"]
        tokens = s.ctx * s.chunks * (1 + runs["evaluations"] + runs["imatrix_passes"])  # reference logits first
        quantize = runs["quantizes"] * job["inputs"]["base"] * MIB / (box["quantize_bps_per_core"] * box["cores"])
        screen = runs["screened_types"] * facts.n_params / (box["screen_wps_per_core"] * box["cores"])
        # the Fisher pass: torch forward, backward and the Fisher products, about three forwards' work
        fisher = runs["fisher_passes"] * 3 * 2 * n * s.ctx * s.chunks / (box["awq_flops_per_core"] * box["cores"])
        return (2 * n * tokens / (box["pp_flops_per_core"] * box["cores"]) + quantize + screen + fisher) / 3600
    return 2 * n * tokens / (box["pp_flops_per_core"] * box["cores"]) / 3600


def quantized_names(facts: Facts) -> list[str]:
    """The GGUF names of the tensors llama-quantize quantizes, as the mix groups see them: those :func:`model_shape`
    plans at a quantized type (experts merged per layer and weight, as the GGUF stores them), named by role."""
    names = {}
    for t in model_shape(facts, "Q8_0").tensors:
        if t.type_name == "F32":
            continue
        role, layer = tensor_role(t.name)
        role += "_exps" if is_expert(t.name) else ""
        names[f"blk.{layer}.{role}.weight" if layer >= 0 else f"{role}.weight"] = None
    return list(names)


# ------------------------------------------------------------------ pre-flight (the Snakefile's onstart)


def source_dir(W, name: str) -> Path | None:
    """Where a recipe's checkpoint is on this machine already: the fetched folder, a local source, or the pinned
    revision's snapshot in the hub cache; None before the download."""
    fetched = W.layout.hf(name)
    if (fetched / "config.json").is_file():
        return fetched
    src = W.recipes[name].source
    if src.path:
        p = Path(src.path).expanduser()
        return p if (p / "config.json").is_file() else None
    if not src.repo:
        return None
    cache = W.hub_cache
    if not cache:
        # huggingface_hub (slow): only when no hub cache is configured
        from huggingface_hub.constants import HF_HUB_CACHE

        cache = HF_HUB_CACHE
    snap = hub_snapshot_dir(Path(cache), src.repo, src.revision or "main")
    return snap if (snap / "config.json").is_file() else None


def check_jobs(W, jobs: list[tuple[str, dict]], local: bool = True, node_mem_mb: float | None = None) -> str | None:
    """The pre-flight of a build about to run ``jobs`` ((rule, wildcards) of every job Snakemake will run): None when
    they fit, else the one-line reason naming the stage, the need and the free amount.

    Disk: the outputs of the jobs to run, summed in build order per filesystem (work/, artifacts/ and the hub cache
    may differ) against its free space; the first job that would not fit is named. RAM: each job's predicted peak
    RSS against MemAvailable (:func:`free_memory`) when jobs run here (``local``); on a cluster against
    ``node_mem_mb`` when given (else the scheduler's own allocation judges, the rules' ``mem_mb``). Recipes whose
    checkpoint is not on this machine yet are not judged (nothing to predict from)."""
    plans: dict[str, dict] = {}
    for _rule, wc in jobs:
        name = wc.get("name")
        if name in plans or name not in W.recipes:
            continue
        folder = source_dir(W, name)
        plans[name] = {}
        if folder is None:
            continue
        try:
            facts = source_facts(folder)
            rows = plan_jobs(W.recipes[name], facts)
        except Exception as exc:  # noqa: BLE001  a plan that fails never stops a build: it is not judged
            print(f"pre-flight: {name}: not judged ({type(exc).__name__}: {exc})", flush=True)
            continue
        plans[name] = {(j["rule"], j["key"]): j for j in rows}
        plans[name]["_facts"] = facts
    work_dev, _ = free_disk(W.layout.work)
    free: dict[int, list] = {}
    ram_free = free_memory() if local else None

    def fs(path) -> int:
        dev, avail = free_disk(path)
        free.setdefault(dev, [avail, 0, os.path.abspath(path)])
        return dev

    order = {r: i for i, r in enumerate(registry())}  # build order, as the stages declare it
    for rule, wc in sorted(jobs, key=lambda j: order.get(j[0], len(order))):
        name = wc.get("name", "")
        plan = plans.get(name) or {}
        row = plan.get((rule, job_key(rule, wc)))
        if row is None:
            continue
        what = f"{rule}{' ' + row['key'] if row['key'] else ''} of {name}"
        need = row["disk"]
        if rule == "fetch":
            need = 0 if W.layout.hf(name).exists() or fs(source_dir(W, name) or W.layout.work) == work_dev else need
        dev = fs(W.layout.art_dir(name) if rule == "publish" else W.layout.work)
        if rule == "publish" and dev != work_dev:  # a copy where hard links cannot reach
            need = int(sum(row["inputs"].values()) * MIB)
        entry = free[dev]
        entry[1] += need
        if entry[1] > entry[0]:
            return (f"not enough disk for {what}: the jobs to run need {fmt(entry[1])} on the filesystem of "
                    f"{entry[2]} by then, {fmt(entry[0])} free (nothing started; `ggufpipe plan` has the details)")
        ram = row.get("ram")
        if ram is None:
            continue
        if local and ram > ram_free:
            return (f"not enough memory for {what}: predicted peak {fmt(ram)}, {fmt(ram_free)} available "
                    f"(MemAvailable; nothing started; `ggufpipe plan` has the details)")
        if not local and node_mem_mb and ram > float(node_mem_mb) * MIB:
            return (f"not enough memory on a node for {what}: predicted peak {fmt(ram)}, node_mem_mb "
                    f"{float(node_mem_mb):.0f} MiB (nothing submitted)")
    return None


def missing_envs(rules) -> str | None:
    """The line refusing a build whose jobs need an environment (pipeline/envs.py) that is not installed, else None."""
    stages, needs = registry(), {}
    for rule in rules:
        for env in stages[rule].envs if rule in stages else ():
            needs.setdefault(env, set()).add(rule)
    for env, rules_ in sorted(needs.items()):
        try:
            env_python(env)
        except EnvError as exc:
            return f"{exc} (needed by {', '.join(sorted(rules_))})"
    return None


def preflight(smk_workflow, W) -> None:
    """The Snakefile's ``onstart`` (after the DAG is built, before any job; Snakemake calls it only when some job
    will run, never on a dry or no-op run): refuse in one line a build whose jobs this machine's disk or memory
    cannot hold (:func:`check_jobs`: the stage, the need, the free amount). Under a cluster executor the submitting
    host's memory is not judged; ``--config node_mem_mb=N`` judges each job against a node's.
    ``--config preflight=false`` (or ``GGUFPIPE_PREFLIGHT=0``) turns that off; a missing environment is refused
    all the same."""
    jobs = [(job.rule.name, dict(job.wildcards.items())) for job in smk_workflow.dag.needrun_jobs()]
    missing = missing_envs(rule for rule, _ in jobs)
    if missing:
        print(f"error: {missing}", file=sys.stderr, flush=True)
        sys.exit(1)
    off = ("0", "false", "no", "off")
    if str(W.config.get("preflight", "true")).lower() in off or os.environ.get("GGUFPIPE_PREFLIGHT", "1").lower() in off:
        return
    local = bool(getattr(smk_workflow, "local_exec", True))
    problem = check_jobs(W, jobs, local=local, node_mem_mb=W.config.get("node_mem_mb"))
    if problem:
        print(f"error: {problem}", file=sys.stderr, flush=True)
        sys.exit(1)
