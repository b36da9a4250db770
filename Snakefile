# ggufpipe workflow: HF weights -> F16 GGUF -> llama-quantize per quant -> KLD gates -> publish.
# This file is the DAG's wiring: configuration, wildcards, the default target and one rule per stage, each derived
# from the stage's one declaration beside its entry function (pipeline/stagedef.py, pipeline/stages/): its inputs and
# outputs (pipeline/layout.py), log, threads, resources and rerun trigger. Every rule runs its stage through
# `python -m pipeline.cli stage` with the paths resolved here; config keys are documented in pipeline/workflow.py.
#
#   fetch -> convert (+ convert_mtp) ------------------------> quantize -> eval, bench -> publish -> gate
#         -> awq -> convert_awq -> imatrix (calibrate) ---------^    split, conformance, draft checks -^
#                         sensitivity -> solve (measured mixes) -^

import os
import sys

from pipeline.devices.plan_jobs import preflight, rule_resources
from pipeline.errors import PipelineError
from pipeline.stages import registry
from pipeline.workflow import (
    Workflow,
    release_scheduler_timers,
    show_stage_errors,
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


# The params of every rule (a stage's own follow them: `io`, `threads`, options and `trigger`, the sorted JSON of
# the fields that decide whether its output is stale).
STAGE_PARAMS = {
    "recipe": lambda wc: str(W.recipe(wc.name).path),
    "roots": f"--artifacts {L.artifacts} --work {L.work}",
}
ENV = "envs/ggufpipe.yaml"  # every rule's software; used only with --use-conda


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
    show_stage_errors(log)  # the error line of a stage whose output goes to its log only
    release_scheduler_timers()


rule all:
    default_target: True
    input:
        W.targets(),


def stage_rule(st):
    """The rule of one declared stage (a function: Snakemake evaluates a shell again when the job runs, and a loop
    variable would by then name the last stage)."""

    rule:
        name:
            st.rule
        input:
            unpack(W.rule_inputs(st)),
        output:
            **W.rule_outputs(st),
        log:
            W.rule_log(st),
        conda:
            ENV
        threads: W.rule_threads(st)
        resources:
            **rule_resources(st.rule, W),
        params:
            **STAGE_PARAMS,
            **W.rule_params(st),
        shell:
            stage_shell(st)


for st in registry().values():
    stage_rule(st)
