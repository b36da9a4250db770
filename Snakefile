# ggufpipe workflow: HF weights -> F16 GGUF -> llama-quantize per quant -> KLD gates -> publish.
# This file is the DAG's overview: configuration, wildcards, the default target and one rule file per domain
# (rules/*.smk). Every rule runs one stage entry function through `python -m pipeline.cli stage`: its
# command line (stage_shell), log (stage_log) and arguments come from the stage registry (pipeline/cli/stage.py,
# STAGES), every path from pipeline/layout.py; config keys are documented in pipeline/workflow.py.
#
#   fetch -> convert (+ convert_mtp) ------------------------> quantize -> eval, bench -> publish -> gate
#         -> awq -> convert_awq -> imatrix (calibrate) ---------^    split, conformance, draft checks -^
#                         sensitivity -> solve (measured mixes) -^

import os
import sys

from pipeline.devices.plan_jobs import preflight, rule_resources
from pipeline.errors import PipelineError
from pipeline.workflow import (
    Workflow,
    logged_rules,
    mem_mb,
    release_scheduler_timers,
    show_stage_errors,
    size_mb,
    stage_log,
    stage_shell,
)

try:
    W = Workflow(config)
except PipelineError as exc:
    sys.exit(f"error: {exc}")

L = W.layout
# The interpreter of every stage, passed in the environment rather than as a param: a param is a rerun
# trigger, and the same venv reached by another path (make demo, dvc repro, tests) re-ran every job.
os.environ["GGUFPIPE_PYTHON"] = sys.executable


envvars:
    "GGUFPIPE_PYTHON",


# The params of every rule (a stage's own follow them, `trigger`: what decides whether its output is stale).
STAGE_PARAMS = {
    "recipe": lambda wc: str(W.recipe(wc.name).path),
    "roots": f"--artifacts {L.artifacts} --work {L.work}",
}
ENV = "../envs/ggufpipe.yaml"  # every rule's software (relative to rules/); used only with --use-conda


wildcard_constraints:
    name=W.name_regex(),
    quant=W.quant_regex(),
    es=W.evalset_regex(),
    outtype="F16|BF16",
    base="plain|awq",
    bkey=W.quant_regex() + "|F16|BF16",
    skey=W.split_key_regex(),
    mkey=W.pair_key_regex(),
    dkey=W.pair_key_regex(),
    flavour=W.flavour_regex(),


onstart:
    preflight(workflow, W)  # refuses, in one line, jobs this machine's disk or memory cannot hold (docs/planning.md)


onsuccess:
    release_scheduler_timers()  # else the interpreter waits up to 1 s for Snakemake's rate-limiter timer


onerror:
    show_stage_errors(log, logged_rules())  # the error line of a stage whose output goes to its log only
    release_scheduler_timers()


rule all:
    default_target: True
    input:
        W.targets(),


include: "rules/fetch.smk"
include: "rules/convert.smk"
include: "rules/calibrate.smk"
include: "rules/mix.smk"
include: "rules/quantize.smk"
include: "rules/evaluate.smk"
include: "rules/split.smk"
include: "rules/draft.smk"
include: "rules/publish.smk"
