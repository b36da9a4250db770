# publish: verdicts, passing files linked into artifacts/<name>/, metrics, report, card, manifest; then the
# gate, which fails the build when a check failed (publish itself succeeds then). Files named per recipe are written
# beside the outputs and vouched for by the manifest, not declared here: Modelfile.<KEY>, a measured mix's map
# <name>-<KEY>.tensor-types.txt (SHA256 in its mix.map) and the sensitivity heat maps sensitivity-<flavour>.svg.


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
        stage_log(L, "publish"),
    conda:
        ENV
    threads: 2  # the GGUFs' SHA256s by two helper threads (manifest.publish, fsutil.hashing_ahead)
    resources:
        **rule_resources("publish", W),
    params:
        **STAGE_PARAMS,
        trigger=lambda wc: W.publish_params(wc.name),
    shell:
        stage_shell("publish")


rule gate:
    input:
        # the publish inputs too, so that a checkout holding only the git-tracked manifest rebuilds
        unpack(lambda wc: W.publish_inputs(wc.name)),
        manifest=L.manifest("{name}"),
    output:
        L.gate_ok("{name}"),
    log:
        stage_log(L, "gate"),
    conda:
        ENV
    threads: 1
    resources:
        **rule_resources("gate", W),
    params:
        **STAGE_PARAMS,
    shell:
        stage_shell("gate")
