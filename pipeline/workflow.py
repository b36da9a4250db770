"""Helpers for the Snakefile: configuration, recipe lookup and file layout in one place.

Config keys (``--config key=value``, all optional):

* ``recipes``: comma-separated recipe files or folders (default ``recipes``)
* ``artifacts``: artifact root (default ``artifacts``); ``work``: intermediates (default ``work``)
* ``llama_cpp_dir``: a user's own llama.cpp build (same as the ``LLAMA_CPP_DIR`` variable)
* ``hf_hub_cache``: Hugging Face hub cache folder (default: huggingface_hub's own)
* ``quantized_by``: written into the GGUFs' ``general.quantized_by`` (default ``ggufpipe``)
* ``threads``: threads per quantize job (default 4, capped by ``--cores``)
* ``eval_threads``: threads of every llama-perplexity and llama-bench run (default 2). The eval-base and
  eval jobs cap it by ``--cores`` (so ``--cores 1`` uses one core): their base logits and statistics are
  bit-identical at 1 and 2 threads (measured, b11312 CPU; ``bench/pipeline_bench.py`` compares the
  SHA256s of a ``--cores 1`` and a ``--cores 2`` build). llama-bench, acceptance and agreement keep it fixed.
* ``calib_threads``: threads of the AWQ (CPU) and llama-imatrix runs (default 2); fixed for the same
  reason: the folded weights and the importance matrix then do not depend on ``--cores``.
* ``speedup_threads``: threads of the speed-up stage's servers (default: every CPU of the machine), capped by
  ``--cores``: the stage takes every core it is given, so that nothing runs beside its clock.
"""

from __future__ import annotations

import os
import re
import sys
import threading
from pathlib import Path

from pipeline.distribution.ci_summary import snakemake_failed_jobs
from pipeline.errors import RecipeError
from pipeline.layout import Layout
from pipeline.recipe import Recipe, load_recipe, load_recipes
from pipeline.stagedef import WILDCARD_FLAGS, Settings, Stage, io_args, size_mb
from pipeline.stages import registry
from pipeline.stages.convert import check_convert_as
from pipeline.stages.fetch import hub_snapshot_dir
from pipeline.tools import find_toolchain


class Workflow:
    def __init__(self, config: dict):
        self.config = config
        llama_dir = config.get("llama_cpp_dir")
        if llama_dir:
            os.environ["LLAMA_CPP_DIR"] = str(llama_dir)
        self.toolchain = find_toolchain()
        exe = str(self.toolchain.tool("llama-quantize"))
        self.recipes: dict[str, Recipe] = {}
        for item in str(config.get("recipes", "recipes")).split(","):
            p = Path(item.strip())
            if not item.strip():
                continue
            found = load_recipes(p, exe) if p.is_dir() else [load_recipe(p, exe)]
            for r in found:
                for rr in (r, r.draft_recipe()):  # a built draft is a recipe of its own: <name>-draft
                    if rr is None:
                        continue
                    if rr.name in self.recipes:
                        raise RecipeError(rr.path, "name", f"{rr.name!r} is already used by {self.recipes[rr.name].path}")
                    self.recipes[rr.name] = rr
        self._check_convert_as()
        self.layout = Layout(Path(config.get("artifacts", "artifacts")), Path(config.get("work", "work")))
        for name in self.recipes:  # before Snakemake removes any output: never through a link out of artifacts/
            self.layout.check_art_dir(name)
        self.threads = int(config.get("threads", 4))
        self.eval_threads = int(config.get("eval_threads", 2))
        self.speedup_threads = int(config.get("speedup_threads", os.cpu_count() or 1))
        self.calib_threads = int(config.get("calib_threads", 2))
        self.quantized_by = str(config.get("quantized_by", "ggufpipe"))
        self.hub_cache = config.get("hf_hub_cache") or os.environ.get("HF_HUB_CACHE") or ""

    # wildcard constraints: only declared names, quant keys and eval sets match
    def _check_convert_as(self) -> None:
        """Refuse, before any job, a ``source.convert_as`` the pinned converter does not register."""
        for r in self.recipes.values():
            check_convert_as(r, self.toolchain)

    def name_regex(self) -> str:
        return "|".join(re.escape(n) for n in sorted(self.recipes)) or "(?!)"

    def quant_regex(self) -> str:
        keys = sorted({q.key for r in self.recipes.values() for q in r.quants})
        return "|".join(re.escape(k) for k in keys) or "(?!)"

    def evalset_regex(self) -> str:
        sets = sorted({es.name for r in self.recipes.values() for es in r.eval_sets})
        return "|".join(re.escape(s) for s in sets) or "(?!)"

    def split_key_regex(self) -> str:
        """Keys of the model files some recipe splits (base, quants, MTP draft)."""
        keys = sorted({k for r in self.recipes.values() for k in r.model_keys if r.split_for(k)})
        return "|".join(re.escape(k) for k in keys) or "(?!)"

    def pair_key_regex(self) -> str:
        return self.quant_regex() + "|F16|BF16|gguf|mtp"

    def recipe(self, name: str) -> Recipe:
        return self.recipes[name]

    def targets(self) -> list[str]:
        return [str(self.layout.gate_ok(n)) for n in self.recipes]

    def flavour_regex(self) -> str:
        found = sorted({f for r in self.recipes.values() for f in r.mix_flavours})
        return "|".join(re.escape(f) for f in found) or "(?!)"

    @property
    def settings(self) -> Settings:
        """What stage triggers depend on beyond the recipe. Off the CPU the offload (GGUFPIPE_BACKEND, docs/gpu.md) is a
        field of every stage whose numbers llama.cpp computes, so a switch of backend re-runs them."""
        tc = self.toolchain
        return Settings(eval_threads=self.eval_threads, calib_threads=self.calib_threads,
                        quantized_by=self.quantized_by, build_number=tc.build_number, commit=tc.commit,
                        offload=() if tc.backend == "cpu" else (tc.backend, tc.ngl))

    def trigger(self, rule: str, name: str, **wc: str) -> str:
        """The ``trigger`` param of one job of ``rule``: the sorted JSON of its stage's declared fields."""
        return registry()[rule].trigger_text(self.recipes[name], {"name": name, **wc}, self.settings)

    # ---------------------------------------------------------------- a rule, derived from its stage's declaration
    def rule_inputs(self, st: Stage):
        return lambda wc: st.input_paths(self.recipes[wc.name], dict(wc.items()), self.layout)

    def rule_outputs(self, st: Stage) -> dict:
        # snakemake.io: only inside the Snakefile (the unit tier imports this module without Snakemake)
        from snakemake.io import directory

        return {k: directory(v) if k in st.directories else v for k, v in st.patterns(self.layout).items()}

    def rule_log(self, st: Stage) -> str:
        """``work/{name}/logs/<stem>.log``: the path the stage writes its tools' output to (``--log``)."""
        return str(self.layout.log("{name}", st.log))

    def rule_threads(self, st: Stage) -> int:
        return st.threads if isinstance(st.threads, int) else getattr(self, st.threads)

    def rule_params(self, st: Stage) -> dict:
        """The stage's own params (after the ones every rule shares): the paths Snakemake resolved, fixed threads,
        command-line options and the trigger."""
        out = {"io": lambda wc, input, output: io_args(input, output)}
        if not st.capped:
            out["threads"] = self.rule_threads(st)  # fixed, not scaled by --cores: the figures do not depend on it
        for opt in st.options:
            out[opt] = getattr(self, opt)
        if st.trigger is not None:
            out["trigger"] = lambda wc: self.trigger(st.rule, **dict(wc.items()))
        return out

    # the source's size where it is known (the fetch rule's resources, pipeline/devices/plan_jobs.py)
    def source_mb(self, name: str) -> float | None:
        """Size of a recipe's source weights where they are on this machine already: a local folder, or the
        pinned revision's snapshot in the hub cache; None when unknown (not downloaded yet)."""
        src = self.recipes[name].source
        if src.path:
            return size_mb(Path(src.path).expanduser()) or None
        cache = Path(self.hub_cache) if self.hub_cache else None
        if cache is None:
            # huggingface_hub (slow): only when no hub cache is configured
            from huggingface_hub.constants import HF_HUB_CACHE

            cache = Path(HF_HUB_CACHE)

        return size_mb(hub_snapshot_dir(cache, src.repo, src.revision)) or None


# Where a rule's shell sends the stage's own output (``Stage.output``).
OUTPUT_SHELL = {"console": "", "log": " > {log:q} 2>&1", "tee": " 2>&1 | tee {log:q}"}


def stage_shell(st: Stage) -> str:
    """The shell command of a stage's rule: ``ggufpipe stage`` with the recipe, name, roots, wildcards, the paths
    Snakemake resolved, the job's log and threads, the stage's options, then where its own output goes."""
    cmd = (f'"$GGUFPIPE_PYTHON" -m pipeline.cli stage {st.cli} --recipe {{params.recipe:q}} --name {{wildcards.name}}'
           " {params.roots} {params.io} --log {log:q}")
    cmd += "".join(f" --{WILDCARD_FLAGS[w]} {{wildcards.{w}:q}}" for w in st.wildcards)
    cmd += " --threads {threads}" if st.capped else " --threads {params.threads}"
    cmd += "".join(f" --{o.replace('_', '-')} {{params.{o}:q}}" for o in st.options)
    return cmd + OUTPUT_SHELL[st.output]


def logged_rules() -> tuple[str, ...]:
    """Rules whose shell sends all of the stage's output, its error line included, into the job's log only."""
    return tuple(k for k, st in registry().items() if st.output == "log")


def show_stage_errors(snakemake_log, rules: tuple[str, ...] | None = None) -> None:
    """The Snakefile's ``onerror``: print the ``error:`` line of each failed job of ``rules`` (those whose
    output goes to their log only, :func:`logged_rules`; the other stages print theirs to Snakemake's output
    themselves), so that every failed stage says what is wrong in one line, not only "check log file(s) for
    error details". ``snakemake_log``: the path(s) of Snakemake's own log (Snakemake 9 passes a list)."""
    rules = logged_rules() if rules is None else rules
    text = ""
    for path in [snakemake_log] if isinstance(snakemake_log, (str, os.PathLike)) else list(snakemake_log or []):
        try:
            text += Path(path).read_text(errors="replace")
        except OSError:
            continue
    for job in snakemake_failed_jobs(text):
        if job["rule"] not in rules or not job["log"]:
            continue
        try:
            lines = Path(job["log"]).read_text(errors="replace").splitlines()
        except OSError:
            continue
        errors = [ln for ln in lines if ln.startswith("error: ")]
        if errors:
            print(errors[-1], file=sys.stderr, flush=True)


def release_scheduler_timers() -> None:
    """The Snakefile's ``onsuccess`` / ``onerror``, once the scheduler is done: cancel the timers of
    Snakemake's job-rate limiter (``--max-jobs-per-timespan``, default 100/1s). Each scheduling pass arms a
    non-daemon ``threading.Timer`` that wakes the scheduler a timespan later, and the interpreter waits for
    the last one before it exits: up to a second added to every build that ran a job (measured on Snakemake
    9.27: 1.3 s from "Elapsed time" to exit on a one-job workflow, 0.3 s with the timers cancelled, the
    interpreter's own teardown)."""
    for t in threading.enumerate():
        if isinstance(t, threading.Timer):
            t.cancel()
