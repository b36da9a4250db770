# evaluate: the base logits of each eval set (llama-perplexity --kl-divergence-base), each quant's KLD against
# them, llama-bench speed figures, and the base GGUF's conformance with the HF model (pipeline/stages/conformance/).


rule eval_base:
    input:
        base=lambda wc: W.base_file(wc.name),
    output:
        logits=L.base_logits("{name}", "{es}"),
        record=L.base_record("{name}", "{es}"),
    log:
        stage_log(L, "eval_base"),
    conda:
        ENV
    threads: W.eval_threads  # capped by --cores; llama-perplexity's logits and statistics do not depend on it
    resources:
        **rule_resources("eval_base", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.eval_base_params(wc.name, wc.es),
    shell:
        stage_shell("eval_base")


rule eval:
    input:
        gguf=L.gguf("{name}", "{quant}"),
        logits=rules.eval_base.output.logits,
        base_record=rules.eval_base.output.record,
    output:
        L.eval_record("{name}", "{es}", "{quant}"),
    log:
        stage_log(L, "eval"),
    conda:
        ENV
    threads: W.eval_threads  # capped by --cores; llama-perplexity's logits and statistics do not depend on it
    resources:
        **rule_resources("eval", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.eval_params(wc.name, wc.es),
    shell:
        stage_shell("eval")


# The slice of the first eval set a device re-measures (`ggufpipe device-check`): pipeline/stages/device_slice.py.
rule device_slice:
    input:
        unpack(lambda wc: W.device_slice_inputs(wc.name)),
    output:
        logits=L.device_slice("{name}"),
        record=L.device_slice_record("{name}"),
    log:
        stage_log(L, "device_slice"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("device_slice", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.device_slice_params(wc.name),
    shell:
        stage_shell("device_slice")


rule bench:
    input:
        gguf=lambda wc: W.main_gguf(wc.name, wc.bkey),
    output:
        L.bench_record("{name}", "{bkey}"),
    log:
        stage_log(L, "bench"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("bench", W),
    params:
        **STAGE_PARAMS,
        **W.offload_params,
        threads=W.eval_threads,  # fixed, not scaled by --cores: every quant's figures at the same threads
    shell:
        stage_shell("bench")


# The base GGUF against the HF model (tokenizer, chat template, end of generation, logits): pipeline/stages/conformance/.
rule conformance:
    input:
        unpack(lambda wc: W.conformance_inputs(wc.name)),
    output:
        L.conformance_record("{name}"),
    log:
        stage_log(L, "conformance"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("conformance", W),
    params:
        **STAGE_PARAMS,
        threads=W.eval_threads,  # fixed, not scaled by --cores: torch's float32 sums, so the numbers, stay identical
        trigger=lambda wc: W.conformance_params(wc.name),
    shell:
        stage_shell("conformance")
