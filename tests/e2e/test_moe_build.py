"""A generated Qwen3-MoE checkpoint through the real Snakefile (issue #31): convert, conformance against transformers'
``qwen3_moe`` (the reference environment), llama-imatrix with the expert-coverage gate, Q4_K_M with the matrix, the
gates, publish. The report's "Expert coverage" table and the quant's ``calibration.imatrix.experts`` come from the
matrix's own counts. RANDOM WEIGHTS (helpers.hf_factory.tiny_qwen3_moe): the quality numbers mean nothing; the build
proves that every stage takes the architecture."""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN, CALIB, snakemake, write_yaml
from helpers.hf_factory import tiny_qwen3_moe

N_EXPERT = 16


@pytest.fixture(scope="module")
def moe_build(tmp_path_factory, demo_snapshot):
    root = tmp_path_factory.mktemp("moe")
    src = tiny_qwen3_moe(root / "hf", demo_snapshot, n_expert=N_EXPERT)
    recipe = write_yaml(root / "recipes" / "moe.yaml", {
        "name": "moe", "source": {"path": str(src)}, "quants": [{"type": "Q4_K_M", "imatrix": True}], "bench": False,
        "imatrix": {"calibration": str(CALIB), "ctx": 128, "chunks": 8, "min_expert_coverage": 1.0},
        "gates": [{"name": "botchan", "text": str(BOTCHAN), "ctx": 512, "chunks": 9, "max_kld_mean": 10.0,
                   "max_ppl_ratio": 100.0, "max_kld_p99": 100.0, "min_same_top_p": 0.0}],
        "conformance": {"chunks": 1}})
    res = snakemake(root, recipe)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return root, json.loads((root / "artifacts" / "moe" / "manifest.json").read_text())


def test_every_stage_takes_the_moe_and_conformance_passes(moe_build):
    root, m = moe_build
    c = m["conformance"]
    assert c["passed"] and c["checks"]["logits"]["passed"], c
    (q,) = [a for a in m["artifacts"] if a["quant_type"] == "Q4_K_M"]
    experts = q["calibration"]["imatrix"]["experts"]
    assert [(r["layer"], r["covered"], r["experts"]) for r in experts] == [(0, N_EXPERT, N_EXPERT), (1, N_EXPERT, N_EXPERT)]
    report = (root / "artifacts" / "moe" / "report.md").read_text()
    assert "## Expert coverage" in report and f"| 0 | {N_EXPERT}/{N_EXPERT} | 1.000 | – |" in report
