# ggufpipe workflow: HF weights -> F16 GGUF -> llama-quantize per recipe -> manifest.
# Thin wiring only: every rule calls one stage entry function through `python -m pipeline.cli stage`.
# Config keys are documented in pipeline/workflow.py.

import sys

from pipeline.errors import PipelineError
from pipeline.workflow import Workflow, mem_mb

try:
    W = Workflow(config)
except PipelineError as exc:
    sys.exit(f"error: {exc}")

RECIPE = lambda wc: str(W.recipe(wc.name).path)
ENV = "envs/ggufpipe.yaml"  # documents the rules' software; used only with --use-conda


wildcard_constraints:
    name=W.name_regex(),
    quant=W.quant_regex(),
    outtype="F16|BF16",


rule all:
    input:
        W.targets(),
    default_target: True


rule fetch:
    output:
        hf=directory(W.layout.wrk("{name}", "hf")),
        record=W.layout.wrk("{name}", "records/fetch.json"),
    log:
        W.layout.wrk("{name}", "logs/fetch.log"),
    params:
        recipe=RECIPE,
        py=W.python,
        hub_cache=W.hub_cache,
        trigger=lambda wc: W.fetch_params(wc.name),
    threads: 1
    resources:
        mem_mb=1024,
        runtime=120,
    conda:
        ENV
    shell:
        "{params.py} -m pipeline.cli stage fetch --recipe {params.recipe:q} --out {output.hf:q}"
        " --record {output.record:q} --hub-cache {params.hub_cache:q} > {log:q} 2>&1"


rule convert:
    input:
        hf=rules.fetch.output.hf,
    output:
        gguf=W.layout.art("{name}", "{name}-{outtype}.gguf"),
        record=W.layout.wrk("{name}", "records/convert-{outtype}.json"),
    log:
        W.layout.wrk("{name}", "logs/convert-{outtype}.log"),
    params:
        recipe=RECIPE,
        py=W.python,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    threads: 1
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.5),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 2.5),
        runtime=lambda wc, input: int(30 + input.size_mb / 100),
    conda:
        ENV
    shell:
        "{params.py} -m pipeline.cli stage convert --recipe {params.recipe:q} --hf {input.hf:q} --out {output.gguf:q}"
        " --record {output.record:q} --log {log:q} --quantized-by {params.quantized_by:q}"


rule quantize:
    input:
        base=lambda wc: W.base_file(wc.name),
    output:
        gguf=W.layout.art("{name}", "{name}-{quant}.gguf"),
        record=W.layout.wrk("{name}", "records/quant-{quant}.json"),
    log:
        W.layout.wrk("{name}", "logs/quantize-{quant}.log"),
    params:
        recipe=RECIPE,
        py=W.python,
        trigger=lambda wc: W.quant_params(wc.name, wc.quant),
    threads: W.threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.2),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.0),
        runtime=lambda wc, input: int(20 + input.size_mb / 200),
    conda:
        ENV
    shell:
        "{params.py} -m pipeline.cli stage quantize --recipe {params.recipe:q} --quant {wildcards.quant:q}"
        " --base {input.base:q} --out {output.gguf:q} --record {output.record:q} --log {log:q}"
        " --threads {threads}"


rule manifest:
    input:
        base=lambda wc: W.base_file(wc.name),
        quants=lambda wc: W.quant_files(wc.name),
        quant_records=lambda wc: W.quant_records(wc.name),
        fetch_record=rules.fetch.output.record,
        convert_record=lambda wc: W.convert_record(wc.name),
    output:
        W.layout.art("{name}", "manifest.json"),
    log:
        W.layout.wrk("{name}", "logs/manifest.log"),
    params:
        recipe=RECIPE,
        py=W.python,
        artifacts=lambda wc: W.layout.art(wc.name),
        quant_records=lambda wc: W.quant_record_args(wc.name),
    threads: 1
    resources:
        mem_mb=1024,
        runtime=30,
    conda:
        ENV
    shell:
        "{params.py} -m pipeline.cli stage manifest --recipe {params.recipe:q} --artifacts {params.artifacts:q}"
        " --fetch-record {input.fetch_record:q} --convert-record {input.convert_record:q}"
        " {params.quant_records} --out {output:q} > {log:q} 2>&1"
