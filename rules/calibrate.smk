# calibrate: AWQ-scaled weights (AutoAWQ) and their base GGUF; importance matrices (llama-imatrix) of the plain
# or AWQ-scaled base. Both run at calib_threads, fixed, not scaled by --cores: the folded weights and the
# matrix then do not depend on it.


rule awq:
    input:
        hf=rules.fetch.output.hf,
        text=lambda wc: W.calibration_text(wc.name, "awq"),
    output:
        hf=directory(L.hf_awq("{name}")),
        record=L.awq_record("{name}"),
    log:
        stage_log(L, "awq"),
    conda:
        ENV
    threads: W.calib_threads
    resources:
        **rule_resources("awq", W),
    params:
        **STAGE_PARAMS,
        threads=W.calib_threads,
        trigger=lambda wc: W.awq_params(wc.name),
    shell:
        stage_shell("awq")


rule convert_awq:
    input:
        hf=rules.awq.output.hf,
    output:
        gguf=L.awq_gguf_at("{name}", "{outtype}"),
        record=L.awq_convert_record_at("{name}", "{outtype}"),
    log:
        stage_log(L, "convert_awq"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("convert_awq", W),
    params:
        **STAGE_PARAMS,
        quantized_by=W.quantized_by,
        trigger=lambda wc: W.convert_params(wc.name),
    shell:
        stage_shell("convert_awq")


rule imatrix:
    input:
        base=lambda wc: W.source_gguf(wc.name, wc.base),
        text=lambda wc: W.calibration_text(wc.name, "imatrix"),
    output:
        imatrix=L.imatrix("{name}", "{base}"),
        record=L.imatrix_record("{name}", "{base}"),
    log:
        stage_log(L, "imatrix"),
    conda:
        ENV
    threads: W.calib_threads
    resources:
        **rule_resources("imatrix", W),
    params:
        **STAGE_PARAMS,
        threads=W.calib_threads,
        trigger=lambda wc: W.imatrix_params(wc.name),
    shell:
        stage_shell("imatrix")
