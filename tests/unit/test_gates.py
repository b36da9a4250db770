"""Quality gates without running llama-perplexity: its parser on captured real output of the pinned build, its
silent failures, verdicts and default thresholds, gate config errors, and the report plot."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest
import yaml
from helpers import DEMO_RECIPE, TEST_DATA, demo_recipe_data, recipe_error

from pipeline.errors import PipelineError
from pipeline.recipe import default_thresholds, load_recipe
from pipeline.stages.evaluate import parse_kld_statistics, tool_errors, verdict

# ------------------------------------------------------------------ parser (captured real output)


def test_parse_real_kld_output():
    stats = parse_kld_statistics((TEST_DATA / "kld-q4_k_m.txt").read_text())
    assert stats["ppl_q"] == 28.533482 and stats["ppl_base"] == 27.07919
    assert stats["ppl_ratio"] == 1.053705 and stats["ln_ppl_ratio"] == 0.052313
    assert stats["kld_mean"] == 0.045521 and stats["kld_median"] == 0.033871
    assert stats["kld_p99"] == 0.22659 and stats["kld_max"] == 0.594254 and stats["kld_p99_9"] == 0.540007
    assert stats["rms_dp"] == pytest.approx(0.04526) and stats["same_top_p"] == pytest.approx(0.86863)
    assert tool_errors((TEST_DATA / "kld-q4_k_m.txt").read_text()) == []


@pytest.mark.parametrize("drop", ["Mean    KLD", "99.0%   KLD", "Same top p", "Mean PPL(Q)/PPL(base)"])
def test_parser_fails_on_missing_statistic(drop):
    text = "\n".join(ln for ln in (TEST_DATA / "kld-q4_k_m.txt").read_text().splitlines() if not ln.startswith(drop))
    with pytest.raises(PipelineError, match="lacks .*format changed"):
        parse_kld_statistics(text)


def test_parser_fails_on_truncated_output():
    text = (TEST_DATA / "kld-q4_k_m.txt").read_text().split("====== KL divergence")[0]
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
    errors = tool_errors((TEST_DATA / capture).read_text())
    assert errors and errors[0].startswith(expected), errors


def test_verdict_and_defaults():
    d = default_thresholds("Q4_K_M")
    assert set(d) == {"max_ppl_ratio", "max_kld_mean", "max_kld_p99", "min_same_top_p"}
    assert default_thresholds("Q8_0")["max_kld_mean"] < d["max_kld_mean"] < default_thresholds("Q2_K")["max_kld_mean"]
    stats = parse_kld_statistics((TEST_DATA / "kld-q4_k_m.txt").read_text())
    assert verdict(stats, d) == []
    fails = verdict(stats, {"max_kld_mean": 0.01, "min_same_top_p": 0.9})
    assert [(f["metric"], f["limit"]) for f in fails] == [("kld_mean", 0.01), ("same_top_p", 0.9)]


# ------------------------------------------------------------------ runner on real files


# ------------------------------------------------------------------ gate config errors


BAD_GATES = [
    ({"max_kld_mean": -0.1}, "gates[0].max_kld_mean", "must be a number 0..1000000, got -0.1"),
    ({"min_same_top_p": 1.5}, "gates[0].min_same_top_p", "must be a number 0..1, got 1.5"),
    ({"max_ppl_ratio": "low"}, "gates[0].max_ppl_ratio", "must be a number"),
    ({"max_perplexity": 3}, "gates[0].max_perplexity", "unknown key"),
    ({"text": "missing.txt"}, "gates[0].text", "eval text .*missing.txt does not exist"),
    ({"chunks": 4}, "gates[0].chunks", "ctx 512 x 4 chunks scores only 1020 tokens; at least 2048"),
    ({"ctx": "big"}, "gates[0].ctx", "must be an integer"),
    ({"text_sha256": "abc"}, "gates[0].text_sha256", "'abc' is not a SHA256"),
]


@pytest.mark.parametrize("change,field,what", BAD_GATES, ids=[b[1] + str(i) for i, b in enumerate(BAD_GATES)])
def test_bad_gate_config(tmp_path, change, field, what):
    data = demo_recipe_data()
    data["gates"][0].update(change)  # a relative text path resolves against the recipe's folder
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    exc = recipe_error(p)
    assert exc.field == field and re.match(what, exc.message), exc


def test_per_quant_gate_override_needs_known_set(tmp_path):
    data = demo_recipe_data()
    data["quants"][1] = {"type": "Q5_K_M", "gates": {"wikitext": {"max_kld_mean": 0.1}}}
    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump(data))
    exc = recipe_error(p)
    assert exc.field == "quants[1].gates.wikitext" and exc.message.startswith("unknown key"), exc


def test_thresholds_layering():
    r = load_recipe(DEMO_RECIPE)
    q8 = r.thresholds("Q8_0", "botchan")
    assert q8["max_kld_mean"] == 0.01 and q8["min_same_top_p"] == 0.9  # quant override
    assert q8["max_kld_p99"] == 0.5  # eval set
    q4 = r.thresholds("Q4_K_M", "botchan")
    assert q4 == {"max_ppl_ratio": 1.1, "max_kld_mean": 0.1, "max_kld_p99": 0.5, "min_same_top_p": 0.8}


def test_report_plot_svg():
    """One circle per published quant and eval set (its set's colour), a red x per failed one, every label;
    log y axis labelled in decades; text output, identical for identical input."""
    from pipeline.stages.report import COLORS, render_plot

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


