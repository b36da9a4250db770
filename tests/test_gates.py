"""Quality gates: parser on real llama-perplexity output of the pinned build, its silent failures,
gate config errors, and a real gated build where one quant fails and the others are published."""

from __future__ import annotations

import json
import re
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from conftest import DEMO_RECIPE, snakemake

from pipeline.errors import PipelineError
from pipeline.evaluate import eval_base, parse_kld_statistics, tool_errors, verdict
from pipeline.recipe import EvalSet, default_thresholds, load_recipe

DATA = Path(__file__).parent / "data" / "perplexity"
ROOT = Path(__file__).resolve().parent.parent
BOTCHAN = ROOT / "data" / "botchan.txt"


# ------------------------------------------------------------------ parser (captured real output)


def test_parse_real_kld_output():
    stats = parse_kld_statistics((DATA / "kld-q4_k_m.txt").read_text())
    assert stats["ppl_q"] == 28.533482 and stats["ppl_base"] == 27.07919
    assert stats["ppl_ratio"] == 1.053705 and stats["ln_ppl_ratio"] == 0.052313
    assert stats["kld_mean"] == 0.045521 and stats["kld_median"] == 0.033871
    assert stats["kld_p99"] == 0.22659 and stats["kld_max"] == 0.594254 and stats["kld_p99_9"] == 0.540007
    assert stats["rms_dp"] == pytest.approx(0.04526) and stats["same_top_p"] == pytest.approx(0.86863)
    assert tool_errors((DATA / "kld-q4_k_m.txt").read_text()) == []


@pytest.mark.parametrize("drop", ["Mean    KLD", "99.0%   KLD", "Same top p", "Mean PPL(Q)/PPL(base)"])
def test_parser_fails_on_missing_statistic(drop):
    text = "\n".join(ln for ln in (DATA / "kld-q4_k_m.txt").read_text().splitlines() if not ln.startswith(drop))
    with pytest.raises(PipelineError, match="lacks .*format changed"):
        parse_kld_statistics(text)


def test_parser_fails_on_truncated_output():
    text = (DATA / "kld-q4_k_m.txt").read_text().split("====== KL divergence")[0]
    with pytest.raises(PipelineError, match="no KL divergence statistics"):
        parse_kld_statistics(text)


@pytest.mark.parametrize("capture,expected", [
    ("fail-missing-base.txt", "kl_divergence: failed to open /tmp/kld/missing.kld"),
    ("fail-truncated-base.txt", "kl_divergence: failed reading log-probs for chunk 0"),
    ("fail-inconsistent-vocab.txt", "kl_divergence: inconsistent vocabulary (49153 vs 49152)"),
    ("fail-too-few-tokens.txt", "perplexity: you need at least 1024 tokens"),
])
def test_silent_failures_detected(capture, expected):
    """llama-perplexity exited 0 in all of these (captured from the pinned build)."""
    errors = tool_errors((DATA / capture).read_text())
    assert errors and errors[0].startswith(expected), errors


def test_verdict_and_defaults():
    d = default_thresholds("Q4_K_M")
    assert set(d) == {"max_ppl_ratio", "max_kld_mean", "max_kld_p99", "min_same_top_p"}
    assert default_thresholds("Q8_0")["max_kld_mean"] < d["max_kld_mean"] < default_thresholds("Q2_K")["max_kld_mean"]
    stats = parse_kld_statistics((DATA / "kld-q4_k_m.txt").read_text())
    assert verdict(stats, d) == []
    fails = verdict(stats, {"max_kld_mean": 0.01, "min_same_top_p": 0.9})
    assert [(f["metric"], f["limit"]) for f in fails] == [("kld_mean", 0.01), ("same_top_p", 0.9)]


# ------------------------------------------------------------------ runner on real files


def test_eval_base_refuses_wrong_text_sha(demo_build, toolchain, tmp_path):
    es = EvalSet(name="s", text=BOTCHAN, ctx=512, chunks=16, text_sha256="0" * 64)
    with pytest.raises(PipelineError, match="has SHA256 2680fa93.*the recipe pins 0000"):
        eval_base("t", es, demo_build / "artifacts" / "smollm2-135m" / "smollm2-135m-F16.gguf",
                  tmp_path / "b.logits", tmp_path / "b.json", tc=toolchain)


# ------------------------------------------------------------------ gate config errors


BAD_GATES = [
    ({"max_kld_mean": -0.1}, "gates[0].max_kld_mean: -0.1 is out of range"),
    ({"min_same_top_p": 1.5}, "gates[0].min_same_top_p: 1.5 is out of range"),
    ({"max_ppl_ratio": "low"}, "gates[0].max_ppl_ratio: must be a number"),
    ({"max_perplexity": 3}, "gates[0].max_perplexity: unknown key"),
    ({"text": "missing.txt"}, "gates[0].text: eval text .*missing.txt does not exist"),
    ({"chunks": 4}, "gates[0].chunks: ctx 512 x 4 chunks scores only 1020 tokens; at least 2048"),
    ({"ctx": "big"}, "gates[0].ctx: must be an integer"),
    ({"text_sha256": "abc"}, "gates[0].text_sha256: 'abc' is not a SHA256"),
]


@pytest.mark.parametrize("change,expected", BAD_GATES, ids=[b[1].split(":")[0] + str(i) for i, b in enumerate(BAD_GATES)])
def test_bad_gate_config(tmp_path, quantize_exe, change, expected):
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    data["gates"][0]["text"] = str(BOTCHAN)
    data["gates"][0].update(change)  # a relative text path resolves against the recipe's folder
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(PipelineError) as exc:
        load_recipe(p, quantize_exe)
    assert re.search(expected.replace("[0]", r"\[0\]"), str(exc.value)) and str(exc.value).startswith(f"{p}: "), str(exc.value)


def test_per_quant_gate_override_needs_known_set(tmp_path, quantize_exe):
    data = yaml.safe_load(DEMO_RECIPE.read_text())
    data["gates"][0]["text"] = str(BOTCHAN)
    data["quants"][1] = {"type": "Q5_K_M", "gates": {"wikitext": {"max_kld_mean": 0.1}}}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    with pytest.raises(PipelineError, match=r"quants\[1\].gates.wikitext: unknown key"):
        load_recipe(p, quantize_exe)


def test_thresholds_layering(quantize_exe):
    r = load_recipe(DEMO_RECIPE, quantize_exe)
    q8 = r.thresholds("Q8_0", "botchan")
    assert q8["max_kld_mean"] == 0.01 and q8["min_same_top_p"] == 0.9  # quant override
    assert q8["max_kld_p99"] == 0.5  # eval set
    q4 = r.thresholds("Q4_K_M", "botchan")
    assert q4 == {"max_ppl_ratio": 1.1, "max_kld_mean": 0.1, "max_kld_p99": 0.5, "min_same_top_p": 0.8}


def test_report_plot_svg():
    """One circle per published quant and eval set (its set's colour), a red x per failed one, every label;
    log y axis labelled in decades; text output, identical for identical input."""
    from pipeline.report import COLORS, render_plot

    def q(name, size_mib, klds):
        return {"file": f"m-{name}.gguf", "quant_type": name, "size_bytes": int(size_mib * 2**20), "role": "quant",
                "metrics": {s: {"kld_mean": v} for s, v in klds.items()}}
    manifest = {"name": "m", "base_quant_type": "F16", "eval_sets": [{"name": "wiki"}, {"name": "code & <math>"}],
                "artifacts": [{"file": "m-F16.gguf", "quant_type": "F16", "size_bytes": 2**28, "role": "base"},
                              q("Q8_0", 140, {"wiki": 0.002, "code & <math>": 0.003}),
                              q("Q4_K_M", 100, {"wiki": 0.05, "code & <math>": 0.07})],
                "rejected": [q("Q2_K", 60, {"wiki": 0.9, "code & <math>": 1.2})]}
    text = render_plot(manifest)
    assert text == render_plot(manifest)
    svg = ET.fromstring(text)
    ns = "{http://www.w3.org/2000/svg}"
    fills = [c.get("fill") for c in svg.iter(ns + "circle")]
    assert sorted(fills[:4]) == sorted([COLORS[0], COLORS[0], COLORS[1], COLORS[1]])  # 4 points, then the legend
    assert fills[4:] == [COLORS[0], COLORS[1]]
    assert len([p for p in svg.iter(ns + "path") if p.get("stroke") == "red"]) == 2  # Q2_K in both sets
    texts = ["".join(t.itertext()) for t in svg.iter(ns + "text")]
    for label in ("Q8_0", "Q4_K_M", "Q2_K", "wiki", "code & <math>", "file size (MiB)", "mean KL divergence vs F16 (log)"):
        assert label in texts, label
    assert {"10-2", "10-1", "100"} <= set(texts) and "10-3" not in texts  # decades in 0.002 .. 1.2 ("10", raised exponent)
    assert ET.fromstring(render_plot({"name": "e", "eval_sets": [], "artifacts": [], "rejected": []})).tag == ns + "svg"


# ------------------------------------------------------------------ end to end


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
    assert re.search(r"gate failed: recipe smollm2-gates, quant Q2_K, eval set botchan: kld_mean = [0-9.]+ > "
                     r"max_kld_mean 0\.0001", out), out[-3000:]
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0"]
    assert [e["quant_type"] for e in m["rejected"]] == ["Q2_K"] and m["rejected"][0]["gate"]["passed"] is False
    assert failing_build.published == ["smollm2-gates-F16.gguf", "smollm2-gates-Q8_0.gguf"]
    assert not failing_build.gate_ok


def test_base_logits_computed_once_per_eval_set(failing_build):
    work = failing_build.work
    runs = [ln for log in (work / "work" / "smollm2-gates" / "logs").glob("*.log") for ln in log.read_text().splitlines()
            if ln.startswith("$ ") and "llama-perplexity" in ln]
    base_runs = [ln for ln in runs if "--kl-divergence-base" in ln and not ln.endswith("--kl-divergence")]
    quant_runs = [ln for ln in runs if ln.endswith("--kl-divergence")]
    assert len(base_runs) == 1 and len(quant_runs) == 2  # Q8_0, Q2_K (the spm draft's vocab size differs)
    assert all(re.search(r" -t 2 .*-b 512|-b 512 -t 2", ln) for ln in runs)


def test_loosened_gate_republishes_without_reevaluating(failing_build, demo_hub):
    work, recipe = failing_build.work, failing_build.recipe
    data = yaml.safe_load(recipe.read_text())
    data["quants"][1]["gates"] = {"max_kld_mean": 5.0, "max_kld_p99": 50.0, "max_ppl_ratio": 10.0, "min_same_top_p": 0.1}
    del data["draft"]  # and drop the incompatible draft (see test_draft.py)
    recipe.write_text(yaml.safe_dump(data, sort_keys=False))
    res = snakemake(work, recipe, cores=2, hub=demo_hub)
    assert res.returncode == 0, (res.stdout + res.stderr)[-3000:]
    ran = re.findall(r"^(?:local)?rule (\w+):", res.stdout + res.stderr, re.M)
    assert sorted(set(ran)) == ["all", "gate", "publish"], ran
    m = json.loads((work / "artifacts" / "smollm2-gates" / "manifest.json").read_text())
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0", "Q2_K"] and m["rejected"] == []
    shutil.rmtree(work / "work" / "smollm2-gates" / "eval")  # base logits are large: reclaim them
