"""The workflow's rules and the stage registry (issue #17): one rule per registry entry, every rule's command line
built by ``stage_shell`` from the registry, byte-identical to the commands the rules ran before the Snakefile was
split (the text is Snakemake's code rerun trigger: a change re-runs every built job of that rule), and the rules
whose output goes to their log only are exactly those whose error line ``onerror`` prints."""

from __future__ import annotations

import re

import pytest
from helpers import ROOT

from pipeline.cli import STAGES, main
from pipeline.workflow import LOGGED_RULES, OUTPUT_SHELL, logged_rules, stage_shell

P = '"$GGUFPIPE_PYTHON" -m pipeline.cli stage '
C = " --recipe {params.recipe:q} --name {wildcards.name} {params.roots}"
# rule -> its shell command as the one-file Snakefile wrote it (git show 927aff2:Snakefile)
SHELL = {
    "fetch": P + "fetch" + C + " --hub-cache {params.hub_cache:q} > {log:q} 2>&1",
    "convert": P + "convert" + C + " --quantized-by {params.quantized_by:q}",
    "awq": P + "awq" + C + " --threads {params.threads} > {log:q} 2>&1",
    "convert_awq": P + "convert --awq" + C + " --quantized-by {params.quantized_by:q}",
    "imatrix": P + "imatrix" + C + " --base {wildcards.base} --threads {params.threads}",
    "convert_mtp": P + "convert-mtp" + C + " --quantized-by {params.quantized_by:q}",
    "quantize": P + "quantize" + C + " --quant {wildcards.quant:q} --threads {threads}",
    "eval_base": P + "eval-base" + C + " --eval-set {wildcards.es:q} --threads {threads}",
    "conformance": P + "conformance" + C + " --threads {params.threads}",
    "eval": P + "eval" + C + " --eval-set {wildcards.es:q} --quant {wildcards.quant:q} --threads {threads}",
    "device_slice": P + "device-slice" + C + " --threads {threads}",
    "bench": P + "bench" + C + " --quant {wildcards.bkey:q} --threads {params.threads}",
    "split": P + "split" + C + " --quant {wildcards.skey:q}",
    "vocab_check": P + "vocab" + C + " --quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q} > {log:q} 2>&1",
    "acceptance": P + "acceptance" + C + " --quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q} --threads {params.threads}",
    "agreement": P + "agreement" + C + " --draft-quant {wildcards.dkey:q} --threads {params.threads}",
    "publish": P + "publish" + C + " > {log:q} 2>&1",
    "gate": P + "gate" + C + " 2>&1 | tee {log:q}",
    # added by #19 part 2 (measured mixes)
    "sensitivity": P + "sensitivity" + C + " --flavour {wildcards.flavour} --threads {params.threads}",
    "solve": P + "solve" + C + " --quant {wildcards.quant:q}",
}


def rule_files() -> dict[str, str]:
    """rule name -> its block, from the Snakefile and rules/*.smk."""
    out = {}
    for path in [ROOT / "Snakefile", *sorted((ROOT / "rules").glob("*.smk"))]:
        text = path.read_text()
        for m in re.finditer(r"^rule (\w+):\n(.*?)(?=^\S|\Z)", text, re.M | re.S):
            out[m.group(1)] = m.group(2)
    return out


def test_every_rule_is_a_registry_stage_with_its_shell_log_and_threads():
    rules = rule_files()
    assert set(rules) - {"all"} == set(STAGES) == set(SHELL)
    for name, block in rules.items():
        if name == "all":
            continue
        assert f'stage_shell("{name}")' in block and f'stage_log(L, "{name}")' in block, name
        assert "    threads:" in block and "        **STAGE_PARAMS," in block, name


@pytest.mark.parametrize("rule", sorted(SHELL))
def test_shell_unchanged(rule):
    assert stage_shell(rule) == SHELL[rule]


def test_logged_rules_are_those_whose_output_goes_to_the_log():
    assert LOGGED_RULES == logged_rules()
    assert set(LOGGED_RULES) == {r for r, cmd in SHELL.items() if cmd.endswith(OUTPUT_SHELL["log"])}
    assert "awq" in LOGGED_RULES


def test_cli_stage_choices_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["stage", "no-such-stage", "--recipe", "x.yaml"])
    err = capsys.readouterr().err
    for st in STAGES.values():
        assert repr(st.cli.split()[0]) in err, st.cli
