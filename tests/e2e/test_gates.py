"""Quality gates end to end: the gates of the demo build in its manifest, and a real gated build where one
quant fails and the others are published, then is re-judged without re-evaluating."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET

import pytest
import yaml
from helpers import BOTCHAN, GATES_NAME, snakemake

from pipeline.errors import PipelineError
from pipeline.recipe import EvalSet
from pipeline.stages.evaluate import eval_base


def test_eval_base_refuses_wrong_text_sha(demo_build, toolchain, tmp_path):
    es = EvalSet(name="s", text=BOTCHAN, ctx=512, chunks=16, text_sha256="0" * 64)
    with pytest.raises(PipelineError, match="has SHA256 2680fa93.*the recipe pins 0000"):
        eval_base("t", es, demo_build / "artifacts" / "smollm2-135m" / "smollm2-135m-F16.gguf",
                  tmp_path / "b.logits", tmp_path / "b.json", tc=toolchain)


def test_demo_gates_in_manifest(demo_build):
    m = json.loads((demo_build / "artifacts" / "smollm2-135m" / "manifest.json").read_text())
    assert m["rejected"] == []
    q8 = next(e for e in m["artifacts"] if e["quant_type"] == "Q8_0")
    assert q8["gate"]["passed"] is True
    assert q8["gate"]["thresholds"]["botchan"]["max_kld_mean"] == 0.01
    assert q8["metrics"]["botchan"]["kld_mean"] < 0.01 and q8["metrics"]["botchan"]["same_top_p"] > 0.9
    assert m["eval_sets"][0]["text_sha256"] == "2680fa93dfc313ac6270fbf44128f4ba4c4f409ab5498f612b0e106965fdea99"
    assert 26.5 < m["eval_base"]["botchan"]["ppl"] < 27.7
    for e in m["artifacts"][1:]:
        assert 1.0 <= e["metrics"]["botchan"]["ppl_ratio"] < 1.1
    folder = demo_build / "artifacts" / "smollm2-135m"
    metrics = json.loads((folder / "metrics.json").read_text())
    assert metrics["Q4_K_M"]["botchan"]["kld_mean"] == m["artifacts"][3]["metrics"]["botchan"]["kld_mean"]
    report = (folder / "report.md").read_text()
    assert "| Q4_K_M |" in report and "pp t/s" in report and "pass" in report
    svg = ET.fromstring((folder / "report.svg").read_text())  # well-formed SVG
    assert svg.tag == "{http://www.w3.org/2000/svg}svg" and "![size vs mean KLD](report.svg)" in report
    card = (folder / "README.md").read_text()
    assert card.startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\nlicense: apache-2.0\ntags:\n  - gguf")
    assert "llama-cli -m smollm2-135m-Q4_K_M.gguf" in card
    bench = m["build"]["bench"]["smollm2-135m-Q4_K_M.gguf"]
    assert bench["pp_tokens_per_s"] > 0 and bench["tg_tokens_per_s"] > 0


def test_impossible_gate_fails_build_keeps_others(failing_build):
    res, m = failing_build.res, failing_build.manifest
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert re.search(r"gate failed: recipe tiny-gates, quant Q2_K, eval set botchan: kld_mean = [0-9.]+ > "
                     r"max_kld_mean 0\.0001", out), out[-3000:]
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0"]
    assert [e["quant_type"] for e in m["rejected"]] == ["Q2_K"] and m["rejected"][0]["gate"]["passed"] is False
    assert failing_build.published == [f"{GATES_NAME}-F16.gguf", f"{GATES_NAME}-Q8_0.gguf"]
    assert not failing_build.gate_ok


def test_base_logits_computed_once_per_eval_set(failing_build):
    work = failing_build.work
    # a set: the same command again in one log is the stage re-running llama-perplexity whose output lost its
    # final lines (unjoined logger thread of b11312, likelier on the tiny model's sub-second runs), not a new job
    runs = {ln for log in (work / "work" / GATES_NAME / "logs").glob("*.log") for ln in log.read_text().splitlines()
            if ln.startswith("$ ") and "llama-perplexity" in ln}
    base_runs = [ln for ln in runs if "--kl-divergence-base" in ln and not ln.endswith("--kl-divergence")]
    quant_runs = [ln for ln in runs if ln.endswith("--kl-divergence") and "device-slice.logits" not in ln]
    kv_runs = [ln for ln in quant_runs if " -ctk " in ln]  # the tiny recipe's kv_types: q8_0 and q4_0 caches
    assert len(base_runs) == 1 and len(quant_runs) - len(kv_runs) == 2  # Q8_0, Q2_K (the BPE draft's vocab differs)
    assert len(kv_runs) == 4 and all("--kl-divergence-base" in ln for ln in kv_runs)  # against the same base logits
    # the device slice is cut from the base logits, not computed again; the base file is measured on it once
    assert len([ln for ln in runs if "device-slice.logits --kl-divergence" in ln]) == 1
    assert all(re.search(r" -t 2 .*-b 256|-b 256 -t 2", ln) for ln in runs)  # the tiny recipe's ctx 256


def test_loosened_gate_republishes_without_reevaluating(failing_build, tiny_hub):
    work, recipe = failing_build.work, failing_build.recipe
    data = yaml.safe_load(recipe.read_text())
    data["quants"][1]["gates"] = {"max_kld_mean": 5.0, "max_kld_p99": 50.0, "max_ppl_ratio": 10.0, "min_same_top_p": 0.1}
    del data["draft"]  # and drop the incompatible draft (see test_draft.py)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    res = snakemake(work, recipe, cores=2, hub=tiny_hub[0])
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    ran = re.findall(r"^(?:local)?rule (\w+):", res.stdout + res.stderr, re.M)
    assert sorted(set(ran)) == ["all", "gate", "publish"], ran
    m = json.loads((work / "artifacts" / GATES_NAME / "manifest.json").read_text())
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0", "Q2_K"] and m["rejected"] == []
    shutil.rmtree(work / "work" / GATES_NAME / "eval")  # base logits are large: reclaim them
