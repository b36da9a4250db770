# split (recipe `split:` only): the whole file, which eval and bench read, cut into llama-gguf-split shards.


rule split:
    input:
        gguf=L.gguf("{name}", "{skey}"),
    output:
        shards=directory(L.split_dir("{name}", "{skey}")),
    log:
        stage_log(L, "split"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("split", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.split_params(wc.name, wc.skey),
    shell:
        stage_shell("split")
