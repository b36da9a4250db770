# fetch: the recipe's source weights (a pinned Hub revision or a local folder) into work/<name>/hf.


rule fetch:
    output:
        hf=directory(L.hf("{name}")),
        record=L.fetch_record("{name}"),
    log:
        stage_log(L, "fetch"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("fetch", W),
    params:
        **STAGE_PARAMS,
        hub_cache=W.hub_cache,
        trigger=lambda wc: W.fetch_params(wc.name),
    shell:
        stage_shell("fetch")
