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
        mem_mb=lambda wc, input: mem_mb(input.size_mb, 1.2),
        disk_mb=lambda wc, input: mem_mb(input.size_mb, 1.0),
        runtime=lambda wc, input: int(20 + input.size_mb / 200),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.quant_params(wc.name, wc.quant),
    shell:
        stage_shell("quantize")
