# quantize: llama-quantize per recipe quant, from the plain or AWQ-scaled base, with or without an imatrix.


rule quantize:
    input:
        unpack(lambda wc: W.quant_inputs(wc.name, wc.quant)),
    output:
        gguf=L.gguf("{name}", "{quant}"),
        record=L.quant_record("{name}", "{quant}"),
    log:
        stage_log(L, "quantize"),
    conda:
        ENV
    threads: W.threads  # capped by --cores and passed as {threads}: the quantized file does not depend on it
    resources:
        **rule_resources("quantize", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.quant_params(wc.name, wc.quant),
    shell:
        stage_shell("quantize")
