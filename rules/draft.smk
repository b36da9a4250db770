# draft (recipe `draft:`): each main/draft pair's vocabulary check and speculative acceptance
# (llama-speculative-simple), and each draft's agreement with the base logits. At eval_threads, fixed.


rule vocab_check:
    input:
        main=lambda wc: W.main_gguf(wc.name, wc.mkey),
        draft=lambda wc: W.draft_gguf(wc.name, wc.dkey, wc.mkey),
    output:
        L.vocab_record("{name}", "{mkey}", "{dkey}"),
    log:
        stage_log(L, "vocab_check"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("vocab_check", W),
    params:
        **STAGE_PARAMS,
    shell:
        stage_shell("vocab_check")


rule acceptance:
    input:
        main=lambda wc: W.main_gguf(wc.name, wc.mkey),
        draft=lambda wc: W.draft_gguf(wc.name, wc.dkey, wc.mkey),
        vocab=rules.vocab_check.output,
    output:
        L.spec_record("{name}", "{mkey}", "{dkey}"),
    log:
        stage_log(L, "acceptance"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("acceptance", W),
    params:
        **STAGE_PARAMS,
        threads=W.eval_threads,
        trigger=lambda wc: W.draft_params(wc.name),
    shell:
        stage_shell("acceptance")


rule agreement:
    input:
        unpack(lambda wc: W.agreement_inputs(wc.name, wc.dkey)),
    output:
        L.agreement_record("{name}", "{dkey}"),
    log:
        stage_log(L, "agreement"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("agreement", W),
    params:
        **STAGE_PARAMS,
        **W.offload_params,
        threads=W.eval_threads,
    shell:
        stage_shell("agreement")
