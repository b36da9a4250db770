"""The workflow's rules come from the stage declarations (issue #28): one rule per declared stage, its command line,
log, threads, resources and trigger derived from the declaration, the paths Snakemake resolved handed to the stage
(``--in``/``--out``), and the rules whose output goes to their log only are exactly those whose error line
``onerror`` prints."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from helpers import ROOT

from pipeline.cli import main
from pipeline.stagedef import WILDCARD_FLAGS, Settings, Stage, io_args, parse_io
from pipeline.stages import registry
from pipeline.workflow import OUTPUT_SHELL, logged_rules, stage_shell

STAGES = ("fetch", "convert", "convert_mtp", "awq", "convert_awq", "imatrix", "sensitivity", "solve", "quantize",
          "split", "eval_base", "eval", "device_slice", "bench", "conformance", "vocab_check", "acceptance",
          "agreement", "speedup", "publish", "gate")


def test_every_stage_is_declared_once_in_build_order():
    reg = registry()
    assert tuple(reg) == STAGES
    assert len({st.cli for st in reg.values()}) == len(reg)
    assert len({st.order for st in reg.values()}) == len(reg)


def test_the_snakefile_has_one_rule_per_stage_and_no_rule_files():
    text = (ROOT / "Snakefile").read_text()
    assert re.findall(r"^rule (\w+):", text, re.M) == ["all"]
    assert "for st in registry().values():\n    stage_rule(st)" in text and "stage_shell(st)" in text
    assert not (ROOT / "rules").exists()


@pytest.mark.parametrize("rule", STAGES)
def test_shell_is_derived_from_the_declaration(rule):
    st = registry()[rule]
    cmd = stage_shell(st)
    assert cmd.startswith(f'"$GGUFPIPE_PYTHON" -m pipeline.cli stage {st.cli} --recipe {{params.recipe:q}} ')
    assert " {params.io} --log {log:q}" in cmd
    for w in st.wildcards:
        assert f" --{WILDCARD_FLAGS[w]} {{wildcards.{w}:q}}" in cmd
    assert (" --threads {threads}" in cmd) == st.capped and (" --threads {params.threads}" in cmd) != st.capped
    assert cmd.endswith(OUTPUT_SHELL[st.output] or cmd[-1])


def test_logged_rules_are_those_whose_output_goes_to_the_log():
    assert set(logged_rules()) == {"fetch", "awq", "vocab_check", "publish"}
    assert all(stage_shell(registry()[r]).endswith(OUTPUT_SHELL["log"]) for r in logged_rules())


def test_io_round_trip_with_lists_and_spaces():
    inputs = {"base": "work/a b/F16.gguf", "logits": ["x.logits", "x.json"]}
    outputs = {"record": "work/r.json"}
    words = shlex.split(io_args(inputs, outputs))
    ins = [w for f, w in zip(words, words[1:], strict=False) if f == "--in"]
    outs = [w for f, w in zip(words, words[1:], strict=False) if f == "--out"]
    assert parse_io(ins) == inputs and parse_io(outs) == outputs


def test_trigger_is_the_sorted_json_of_the_declared_fields():
    st = Stage("t", "t", run=print, outputs=lambda L: {}, log="t", order=0,
               trigger=lambda r, wc, s: {"b": 1, "a": [s.build_number, wc["quant"]]})
    text = st.trigger_text(None, {"quant": "Q4_0"}, Settings(build_number=11312))
    assert text == '{"a": [11312, "Q4_0"], "b": 1}' and json.loads(text)["b"] == 1


def test_a_declaration_with_an_unknown_wildcard_or_threads_key_is_refused():
    with pytest.raises(AssertionError):
        Stage("t", "t", run=print, outputs=lambda L: {}, log="t", order=0, wildcards=("nope",))
    with pytest.raises(AssertionError):
        Stage("t", "t", run=print, outputs=lambda L: {}, log="t", order=0, threads="cores")


def test_cli_stage_choices_come_from_the_registry(capsys):
    with pytest.raises(SystemExit):
        main(["stage", "no-such-stage", "--recipe", "x.yaml"])
    err = capsys.readouterr().err
    for st in registry().values():
        assert repr(st.cli) in err, st.cli
