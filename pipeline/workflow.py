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
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.layout import Layout
from pipeline.recipe import Recipe, load_recipe, load_recipes
from pipeline.tools import find_toolchain

PROBES = Path(__file__).resolve().parent.parent / "data" / "conformance" / "probes.txt"  # the tokenizer probes


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
                        raise PipelineError(f"{rr.path}: name: {rr.name!r} is already used by "
                                            f"{self.recipes[rr.name].path}")
                    self.recipes[rr.name] = rr
        self.layout = Layout(Path(config.get("artifacts", "artifacts")), Path(config.get("work", "work")))
        for name in self.recipes:  # before Snakemake removes any output: never through a link out of artifacts/
            self.layout.check_art_dir(name)
        self.threads = int(config.get("threads", 4))
        self.eval_threads = int(config.get("eval_threads", 2))
        self.calib_threads = int(config.get("calib_threads", 2))
        self.quantized_by = str(config.get("quantized_by", "ggufpipe"))
        self.hub_cache = config.get("hf_hub_cache") or os.environ.get("HF_HUB_CACHE") or ""

    # wildcard constraints: only declared names, quant keys and eval sets match
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

    def main_gguf(self, name: str, key: str) -> str:
        return str(self.layout.main_gguf(self.recipes[name], key))

    def draft_gguf(self, name: str, key: str, mkey: str | None = None) -> str:
        return str(self.layout.draft_gguf(self.recipes[name], key, mkey))

    def agreement_inputs(self, name: str, dkey: str) -> dict[str, str]:
        r = self.recipes[name]
        es = r.eval_sets[0].name
        return {"draft": self.draft_gguf(name, dkey), "logits": str(self.layout.base_logits(name, es)),
                "base_record": str(self.layout.base_record(name, es))}

    # GPU offload (GGUFPIPE_BACKEND, docs/gpu.md): part of the trigger of every stage whose numbers llama.cpp computes on
    # it, so a switch of backend re-runs them (the base logits included); nothing on the CPU, whose triggers stay as
    # they were before backends existed
    def _offload(self) -> tuple:
        tc = self.toolchain
        return () if tc.backend == "cpu" else ((tc.backend, tc.ngl),)

    @property
    def offload_params(self) -> dict[str, str]:
        """``**W.offload_params`` in the params of rules without a trigger (bench, agreement)."""
        return {"offload": repr(self._offload())} if self._offload() else {}

    def draft_params(self, name: str) -> str:
        d = self.recipes[name].draft
        mtp = (d.spec_type,) if d.mtp else ()  # draft models leave the trigger of existing builds unchanged
        return repr((str(d.eval_text), d.n_max, d.prompts, d.n_predict, self.eval_threads, self.toolchain.build_number,
                     *mtp, *self._offload()))

    def calibration_text(self, name: str, section: str) -> str:
        return str(getattr(self.recipes[name], section).calibration)

    def quant_inputs(self, name: str, key: str) -> dict[str, str]:
        return self.layout.quant_inputs(self.recipes[name], key)

    def sensitivity_inputs(self, name: str, flavour: str) -> dict[str, str]:
        return self.layout.sensitivity_inputs(self.recipes[name], flavour)

    def solve_inputs(self, name: str, key: str) -> dict[str, str]:
        return self.layout.solve_inputs(self.recipes[name], key)

    def flavour_regex(self) -> str:
        found = sorted({f for r in self.recipes.values() for f in r.mix_flavours})
        return "|".join(re.escape(f) for f in found) or "(?!)"

    def source_gguf(self, name: str, base: str) -> str:
        return str(self.layout.source_gguf(self.recipes[name], base))

    def recipe(self, name: str) -> Recipe:
        return self.recipes[name]

    def targets(self) -> list[str]:
        return [str(self.layout.gate_ok(n)) for n in self.recipes]

    def base_file(self, name: str) -> str:
        return str(self.layout.base_gguf(self.recipes[name]))

    def publish_inputs(self, name: str) -> dict[str, list[str]]:
        return self.layout.publish_inputs(self.recipes[name])

    # params that decide whether a stage's output is stale (Snakemake's params rerun trigger)
    def fetch_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.source.describe(), r.source.allow_pickle, r.source.trust_remote_code))

    def convert_params(self, name: str) -> str:
        r = self.recipes[name]
        mtp = () if r.mtp == "keep" else (r.mtp,)  # keep (the default) leaves existing builds' trigger as it was
        fix = (r.vocab_overrides,) if r.vocab_overrides else ()  # likewise: only recipes with fix-path keys
        return repr((r.outtype, r.license, *mtp, self.quantized_by, self.toolchain.build_number, self.toolchain.commit,
                     *fix))

    def quant_params(self, name: str, key: str) -> str:
        q = self.recipes[name].quant(key)
        extra = (q.base, q.imatrix) if (q.awq or q.imatrix) else ()  # unchanged for plain quants
        if q.tensor_types_file:  # the map's content, not only its path (recipes without one: unchanged)
            extra += (sha256_file(q.tensor_types_file),)
        return repr((q.type, q.quantize_args(), self.toolchain.build_number, self.toolchain.commit, *extra))

    def sensitivity_params(self, name: str, flavour: str) -> str:
        r = self.recipes[name]  # not the budgets or targets: changing those re-solves, never re-measures
        return repr((r.sensitivity.describe(), r.mix_candidates(flavour), self.eval_threads,
                     self.toolchain.build_number, self.toolchain.commit, *self._offload()))

    def solve_params(self, name: str, key: str) -> str:
        q = self.recipes[name].quant(key)
        from pipeline.stages.mix.solve import SOLVER

        return repr((q.type, q.mix.describe(), SOLVER, self.toolchain.build_number, self.toolchain.commit))

    def awq_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.awq.describe(), self.calib_threads))

    def imatrix_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.imatrix.describe(), self.calib_threads, self.toolchain.build_number, *self._offload()))

    def eval_base_params(self, name: str, es: str) -> str:
        e = self.recipes[name].eval_set(es)
        return repr((str(e.text), e.ctx, e.chunks, self.eval_threads, self.toolchain.build_number, *self._offload()))

    def eval_params(self, name: str, es: str) -> str:
        # the eval record's chunk rows (the device slice's values) came with schema 7's device check: older records re-run
        return repr((self.eval_base_params(name, es), "chunk_rows"))

    def split_params(self, name: str, key: str) -> str:
        s = self.recipes[name].split_for(key)
        return repr((s.args() if s else None, self.toolchain.build_number, self.toolchain.commit))

    # the source's size where it is known (the fetch rule's resources, pipeline/devices/plan_jobs.py)
    def source_mb(self, name: str) -> float | None:
        """Size of a recipe's source weights where they are on this machine already: a local folder, or the
        pinned revision's snapshot in the hub cache; None when unknown (not downloaded yet)."""
        src = self.recipes[name].source
        if src.path:
            return size_mb(Path(src.path).expanduser()) or None
        cache = Path(self.hub_cache) if self.hub_cache else None
        if cache is None:
            from huggingface_hub.constants import HF_HUB_CACHE

            cache = Path(HF_HUB_CACHE)
        from pipeline.stages.fetch import hub_snapshot_dir

        return size_mb(hub_snapshot_dir(cache, src.repo, src.revision)) or None

    def conformance_inputs(self, name: str) -> dict[str, list[str]]:
        return self.layout.conformance_inputs(self.recipes[name])

    def device_slice_inputs(self, name: str) -> dict[str, str]:
        r = self.recipes[name]
        es = r.eval_sets[0].name
        return {"base": self.base_file(name), "logits": str(self.layout.base_logits(name, es)),
                "base_record": str(self.layout.base_record(name, es))}

    def device_slice_params(self, name: str) -> str:
        r = self.recipes[name]
        return repr((r.device_slice, self.eval_base_params(name, r.eval_sets[0].name), self.toolchain.commit))

    def conformance_params(self, name: str) -> str:
        c = self.recipes[name].conformance
        return repr((c.describe(), str(c.text) if c.text else None, self.toolchain.build_number, self.toolchain.commit,
                     *self._offload(), sha256_file(PROBES)))

    def publish_params(self, name: str) -> str:
        return self.recipes[name].sha256  # thresholds, eval sets, bench...: any recipe change re-publishes


# Where a rule's shell sends the stage's own output (``Stage.output`` in pipeline/cli/stage.py's registry).
OUTPUT_SHELL = {"console": "", "log": " > {log:q} 2>&1", "tee": " 2>&1 | tee {log:q}"}


def stage_shell(rule: str) -> str:
    """The shell command of a rule (rules/*.smk): ``ggufpipe stage`` with the recipe, name and roots, the
    stage's own arguments and output (:data:`pipeline.cli.STAGES`). The text is Snakemake's code rerun
    trigger: it must stay byte-identical for an unchanged stage (tests/unit/test_workflow_rules.py)."""
    from pipeline.cli import STAGES

    st = STAGES[rule]
    cmd = (f'"$GGUFPIPE_PYTHON" -m pipeline.cli stage {st.cli} --recipe {{params.recipe:q}} --name {{wildcards.name}}'
           " {params.roots}")
    return cmd + (f" {st.args}" if st.args else "") + OUTPUT_SHELL[st.output]


def stage_log(layout: Layout, rule: str) -> str:
    """The log pattern of a rule, ``work/{name}/logs/<stem>.log``: the path its stage writes (pipeline/cli/stage.py cmd_stage)."""
    from pipeline.cli import STAGES

    return str(layout.log("{name}", STAGES[rule].log))


def logged_rules() -> tuple[str, ...]:
    """Rules whose shell sends all of the stage's output, its error line included, into the job's log only."""
    from pipeline.cli import STAGES

    return tuple(k for k, st in STAGES.items() if st.output == "log")


LOGGED_RULES = logged_rules()


def show_stage_errors(snakemake_log, rules: tuple[str, ...] = LOGGED_RULES) -> None:
    """The Snakefile's ``onerror``: print the ``error:`` line of each failed job of ``rules`` (those whose
    output goes to their log only, :func:`logged_rules`; the other stages print theirs to Snakemake's output
    themselves), so that every failed stage says what is wrong in one line, not only "check log file(s) for
    error details". ``snakemake_log``: the path(s) of Snakemake's own log (Snakemake 9 passes a list)."""
    from pipeline.distribution.ci_summary import snakemake_failed_jobs

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
    import threading

    for t in threading.enumerate():
        if isinstance(t, threading.Timer):
            t.cancel()


def _n_vocab(base_gguf: str) -> int:
    """The base GGUF's vocabulary size once it exists; before that, the bound for logits estimates."""
    from pipeline.gguf import ArrayValue, read_header

    if Path(base_gguf).is_file():
        tokens = read_header(base_gguf).metadata.get("tokenizer.ggml.tokens")
        if isinstance(tokens, ArrayValue):
            return tokens.count
    return LOGITS_VOCAB_BOUND


def mem_mb(input_mb: float, factor: float, floor: int = 512) -> int:
    return int(max(floor, input_mb * factor + floor))


# Resources (README, "Running on a cluster"): every rule declares threads, mem_mb, disk_mb and runtime
# (minutes), derived from the sizes of its inputs. Snakemake evaluates them again when a job is ready
# to run, with its inputs present; before that (DAG construction, dry runs) a file not built yet counts
# as empty.
FETCH_UNKNOWN_MB = 20480  # a source not in any local cache yet: room for a ~10B-parameter BF16 checkpoint
LOGITS_VOCAB_BOUND = 262144  # n_vocab assumed before the base GGUF exists (Gemma 3's vocabulary)


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
    """Size of the ``llama-perplexity --kl-divergence-base`` file: a 20-byte header, the ctx * chunks
    tokens (int32), then for each scored token (the last ctx - 1 - ctx/2 of each chunk) the vocabulary's
    log-probabilities as uint16 (n_vocab rounded up to even) plus 4 uint16 (min and scale floats)."""
    per_token = 2 * (2 * ((n_vocab + 1) // 2) + 4)
    return 20 + 4 * ctx * chunks + chunks * (ctx - 1 - ctx // 2) * per_token
