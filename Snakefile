# ggufpipe workflow: HF weights -> F16 GGUF -> llama-quantize per quant -> KLD gates -> publish.
# Thin wiring only: every rule runs one stage entry function through `python -m pipeline.cli stage`.
# File locations come from pipeline/layout.py; config keys are documented in pipeline/workflow.py.

import os
import sys

from pipeline.errors import PipelineError
from pipeline.workflow import Workflow, mem_mb, release_scheduler_timers, show_stage_errors, size_mb

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


RECIPE = lambda wc: str(W.recipe(wc.name).path)
ROOTS = f"--artifacts {L.artifacts} --work {L.work}"
ENV = "envs/ggufpipe.yaml"  # documents the rules' software; used only with --use-conda


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


onsuccess:
    release_scheduler_timers()  # else the interpreter waits up to 1 s for Snakemake's rate-limiter timer


onerror:
    show_stage_errors(log)  # the error line of a stage whose output goes to its log only (fetch, publish...)
    release_scheduler_timers()


rule all:
    default_target: True
    input:
        W.targets(),


rule fetch:
    output:
        hf=directory(L.hf("{name}")),
        record=L.fetch_record("{name}"),
    log:
        L.log("{name}", "fetch"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1024,
        disk_mb=lambda wc: W.fetch_disk_mb(wc.name),
        runtime=lambda wc: W.fetch_runtime(wc.name),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        hub_cache=W.hub_cache,
        trigger=lambda wc: W.fetch_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage fetch --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --hub-cache {params.hub_cache:q} > {log:q} 2>&1"


rule convert:
    input:
        hf=rules.fetch.output.hf,
    output:
        gguf=L.wrk("{name}", "quants", "{name}-{outtype}.gguf"),
        record=L.wrk("{name}", "records", "convert-{outtype}.json"),
    log:
        L.log("{name}", "convert-{outtype}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.5),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 2.5),
        runtime=lambda wc, input: int(30 + input.size_mb / 100),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage convert --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quantized-by {params.quantized_by:q}"


rule awq:
    input:
        hf=rules.fetch.output.hf,
        text=lambda wc: W.calibration_text(wc.name, "awq"),
    output:
        hf=directory(L.hf_awq("{name}")),
        record=L.awq_record("{name}"),
    log:
        L.log("{name}", "awq"),
    conda:
        ENV
    threads: W.calib_threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 8, 2048),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 2),
        runtime=lambda wc, input: int(30 + input.size_mb / 5),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.calib_threads,  # fixed, not scaled by --cores: the folded weights stay identical
        trigger=lambda wc: W.awq_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage awq --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --threads {params.threads} > {log:q} 2>&1"


rule convert_awq:
    input:
        hf=rules.awq.output.hf,
    output:
        gguf=L.wrk("{name}", "awq", "{name}-{outtype}-awq.gguf"),
        record=L.wrk("{name}", "records", "convert-{outtype}-awq.json"),
    log:
        L.log("{name}", "convert-{outtype}-awq"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.5),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 2.5),
        runtime=lambda wc, input: int(30 + input.size_mb / 100),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage convert --awq --recipe {params.recipe:q} --name {wildcards.name}'
        " {params.roots} --quantized-by {params.quantized_by:q}"


rule imatrix:
    input:
        base=lambda wc: W.source_gguf(wc.name, wc.base),
        text=lambda wc: W.calibration_text(wc.name, "imatrix"),
    output:
        imatrix=L.wrk("{name}", "imatrix", "imatrix-{base}.gguf"),
        record=L.wrk("{name}", "records", "imatrix-{base}.json"),
    log:
        L.log("{name}", "imatrix-{base}"),
    conda:
        ENV
    threads: W.calib_threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.3, 1024),
        disk_mb=1024,
        runtime=lambda wc, input: int(30 + input.size_mb / 10),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.calib_threads,  # fixed, not scaled by --cores: the matrix stays identical
        trigger=lambda wc: W.imatrix_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage imatrix --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --base {wildcards.base} --threads {params.threads}"


# mtp: separate only: the MTP heads exported alone (converter --mtp) as a speculative draft
rule convert_mtp:
    input:
        hf=rules.fetch.output.hf,
    output:
        gguf=L.wrk("{name}", "quants", "{name}-mtp-{outtype}_MTP.gguf"),
        record=L.wrk("{name}", "records", "convert-mtp-{outtype}.json"),
    log:
        L.log("{name}", "convert-mtp-{outtype}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.5),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.5),
        runtime=lambda wc, input: int(30 + input.size_mb / 100),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage convert-mtp --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quantized-by {params.quantized_by:q}"


rule quantize:
    input:
        unpack(lambda wc: W.quant_inputs(wc.name, wc.quant)),
    output:
        gguf=L.wrk("{name}", "quants", "{name}-{quant}.gguf"),
        record=L.quant_record("{name}", "{quant}"),
    log:
        L.log("{name}", "quantize-{quant}"),
    conda:
        ENV
    threads: W.threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.2),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.0),
        runtime=lambda wc, input: int(20 + input.size_mb / 200),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        trigger=lambda wc: W.quant_params(wc.name, wc.quant),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage quantize --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quant {wildcards.quant:q} --threads {threads}"


rule eval_base:
    input:
        base=lambda wc: W.base_file(wc.name),
    output:
        logits=L.base_logits("{name}", "{es}"),
        record=L.base_record("{name}", "{es}"),
    log:
        L.log("{name}", "eval-{es}-base"),
    conda:
        ENV
    threads: W.eval_threads  # capped by --cores; llama-perplexity's logits and statistics do not depend on it
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.3, 1024),
        disk_mb=lambda wc, input: W.logits_disk_mb(wc.name, wc.es, input.base),
        runtime=lambda wc, input: int(30 + input.size_mb / 20),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        trigger=lambda wc: W.eval_base_params(wc.name, wc.es),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage eval-base --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --eval-set {wildcards.es:q} --threads {threads}"


# The base GGUF against the HF model (tokenizer, chat template, end of generation, logits): pipeline/conformance.py.
rule conformance:
    input:
        unpack(lambda wc: W.conformance_inputs(wc.name)),
    output:
        L.conformance_record("{name}"),
    log:
        L.log("{name}", "conformance"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        # the HF model in float32 (2 x the F16 file) beside the base logits being read
        mem_mb=lambda wc, input: mem_mb(size_mb(input.base[0]), 2.5, 2048),
        disk_mb=lambda wc, input: W.conformance_disk_mb(wc.name, input.base[0]),
        runtime=lambda wc, input: int(30 + size_mb(input.base[0]) / 20),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.eval_threads,  # fixed, not scaled by --cores: torch's float32 sums, so the numbers, stay identical
        trigger=lambda wc: W.conformance_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage conformance --recipe {params.recipe:q} --name {wildcards.name}'
        " {params.roots} --threads {params.threads}"


rule eval:
    input:
        gguf=L.wrk("{name}", "quants", "{name}-{quant}.gguf"),
        logits=rules.eval_base.output.logits,
        base_record=rules.eval_base.output.record,
    output:
        L.eval_record("{name}", "{es}", "{quant}"),
    log:
        L.log("{name}", "eval-{es}-{quant}"),
    conda:
        ENV
    threads: W.eval_threads  # capped by --cores; llama-perplexity's logits and statistics do not depend on it
    resources:
        mem_mb=lambda wc, input: mem_mb(size_mb(input.gguf), 1.3, 1024),
        disk_mb=1024,
        runtime=lambda wc, input: int(30 + size_mb(input.gguf) / 20),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        trigger=lambda wc: W.eval_base_params(wc.name, wc.es),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage eval --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --eval-set {wildcards.es:q} --quant {wildcards.quant:q} --threads {threads}"


rule bench:
    input:
        gguf=lambda wc: W.main_gguf(wc.name, wc.bkey),
    output:
        L.bench_record("{name}", "{bkey}"),
    log:
        L.log("{name}", "bench-{bkey}"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.3, 1024),
        disk_mb=1024,
        runtime=lambda wc, input: int(30 + input.size_mb / 100),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.eval_threads,  # fixed, not scaled by --cores: metrics stay bit-identical
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage bench --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quant {wildcards.bkey:q} --threads {params.threads}"


# recipe `split:` only: the whole file (which eval and bench read) cut into llama-gguf-split shards
rule split:
    input:
        gguf=L.wrk("{name}", "quants", "{name}-{skey}.gguf"),
    output:
        shards=directory(L.wrk("{name}", "split", "{name}-{skey}")),
    log:
        L.log("{name}", "split-{skey}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1024,
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.0),
        runtime=lambda wc, input: int(10 + input.size_mb / 200),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        trigger=lambda wc: W.split_params(wc.name, wc.skey),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage split --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quant {wildcards.skey:q}"


rule vocab_check:
    input:
        main=lambda wc: W.main_gguf(wc.name, wc.mkey),
        draft=lambda wc: W.draft_gguf(wc.name, wc.dkey),
    output:
        L.vocab_record("{name}", "{mkey}", "{dkey}"),
    log:
        L.log("{name}", "vocab-{mkey}--{dkey}"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1024,
        disk_mb=1024,
        runtime=10,
    params:
        recipe=RECIPE,
        roots=ROOTS,
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage vocab --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q} > {log:q} 2>&1"


rule acceptance:
    input:
        main=lambda wc: W.main_gguf(wc.name, wc.mkey),
        draft=lambda wc: W.draft_gguf(wc.name, wc.dkey),
        vocab=rules.vocab_check.output,
    output:
        L.spec_record("{name}", "{mkey}", "{dkey}"),
    log:
        L.log("{name}", "acceptance-{mkey}--{dkey}"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.5, 1024),
        disk_mb=1024,
        runtime=lambda wc, input: int(60 + input.size_mb / 20),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.eval_threads,
        trigger=lambda wc: W.draft_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage acceptance --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q} --threads {params.threads}"


rule agreement:
    input:
        unpack(lambda wc: W.agreement_inputs(wc.name, wc.dkey)),
    output:
        L.agreement_record("{name}", "{dkey}"),
    log:
        L.log("{name}", "agreement-{dkey}"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        mem_mb=lambda wc, input: mem_mb(size_mb(input.draft), 1.3, 1024),
        disk_mb=1024,
        runtime=lambda wc, input: int(30 + size_mb(input.draft) / 20),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        threads=W.eval_threads,
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage agreement --recipe {params.recipe:q} --name {wildcards.name} {params.roots}'
        " --draft-quant {wildcards.dkey:q} --threads {params.threads}"


rule publish:
    input:
        unpack(lambda wc: W.publish_inputs(wc.name)),
    output:
        manifest=L.manifest("{name}"),
        metrics=L.metrics("{name}"),
        report=L.report("{name}"),
        plot=L.plot("{name}"),
        card=L.card("{name}"),
    log:
        L.log("{name}", "publish"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=1024,
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.0),
        runtime=lambda wc, input: int(30 + input.size_mb / 5000),
    params:
        recipe=RECIPE,
        roots=ROOTS,
        trigger=lambda wc: W.publish_params(wc.name),
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage publish --recipe {params.recipe:q} --name {wildcards.name} {params.roots} > {log:q} 2>&1'


rule gate:
    input:
        # the publish inputs too, so that a checkout holding only the git-tracked manifest rebuilds
        unpack(lambda wc: W.publish_inputs(wc.name)),
        manifest=L.manifest("{name}"),
    output:
        L.gate_ok("{name}"),
    log:
        L.log("{name}", "gate"),
    conda:
        ENV
    threads: 1
    resources:
        mem_mb=512,
        disk_mb=512,
        runtime=10,
    params:
        recipe=RECIPE,
        roots=ROOTS,
    shell:
        '"$GGUFPIPE_PYTHON" -m pipeline.cli stage gate --recipe {params.recipe:q} --name {wildcards.name} {params.roots} 2>&1 | tee {log:q}'
