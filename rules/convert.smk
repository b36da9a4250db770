# convert: the HF weights to the base GGUF (F16/BF16) with llama.cpp's converter; with `mtp: separate` also
# the MTP heads alone as a speculative draft. The AWQ-scaled weights' conversion: rules/calibrate.smk.


rule convert:
    input:
        hf=rules.fetch.output.hf,
    output:
        gguf=L.gguf("{name}", "{outtype}"),
        record=L.convert_record_at("{name}", "{outtype}"),
    log:
        stage_log(L, "convert"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("convert", W),
    params:
        **STAGE_PARAMS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        stage_shell("convert")


# mtp: separate only: the MTP heads exported alone (converter --mtp) as a speculative draft
rule convert_mtp:
    input:
        hf=rules.fetch.output.hf,
    output:
        gguf=L.mtp_gguf_at("{name}", "{outtype}"),
        record=L.mtp_record_at("{name}", "{outtype}"),
    log:
        stage_log(L, "convert_mtp"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("convert_mtp", W),
    params:
        **STAGE_PARAMS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        stage_shell("convert_mtp")
