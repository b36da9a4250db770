# mix: measured per-tensor mixes (docs/mixes.md). sensitivity measures each tensor group at each candidate type on
# the recipe's own text, once per flavour (base, importance matrix); solve turns it into one mix's map, so a changed
# budget or target re-solves and re-quantizes without measuring again.


rule sensitivity:
    input:
        unpack(lambda wc: W.sensitivity_inputs(wc.name, wc.flavour)),
    output:
        json=L.sensitivity("{name}", "{flavour}"),
        record=L.sensitivity_record("{name}", "{flavour}"),
    log:
        stage_log(L, "sensitivity"),
    conda:
        ENV
    threads: W.eval_threads
    resources:
        **rule_resources("sensitivity", W),
    params:
        **STAGE_PARAMS,
        threads=W.eval_threads,  # fixed, not scaled by --cores: the measured figures do not depend on --cores
        trigger=lambda wc: W.sensitivity_params(wc.name, wc.flavour),
    shell:
        stage_shell("sensitivity")


rule solve:
    input:
        unpack(lambda wc: W.solve_inputs(wc.name, wc.quant)),
    output:
        map=L.mix_map("{name}", "{quant}"),
        layout=L.mix_layout("{name}", "{quant}"),
    log:
        stage_log(L, "solve"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("solve", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.solve_params(wc.name, wc.quant),
    shell:
        stage_shell("solve")
