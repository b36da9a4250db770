"""Two generated MoE checkpoints through the real Snakefile in one run (issue #31): Qwen3-MoE (``qwen3_moe``) and
the hybrid Qwen3.5-MoE (``qwen3_5_moe``: Gated DeltaNet and gated attention layers, routed experts plus a gated
shared expert). Each: convert, conformance against transformers' class (the reference environment), llama-imatrix
with the expert-coverage gate, Q4_K_M with the matrix, the gates, publish. The report's "Expert coverage" table and
the quant's ``calibration.imatrix.experts`` come from the matrix's own counts. RANDOM WEIGHTS
(helpers.hf_factory.tiny_qwen3_moe, helpers.hf_qwen35.tiny_qwen35_moe): the quality numbers mean nothing; the
builds prove that every stage takes the architectures."""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN, CALIB, snakemake, write_yaml
from helpers.hf_factory import tiny_qwen3_moe
from helpers.hf_qwen35 import tiny_qwen35_moe

from pipeline.gguf import read_header

N_EXPERT = 16


@pytest.fixture(scope="module")
def moe_build(tmp_path_factory, demo_snapshot):
    root = tmp_path_factory.mktemp("moe")
    recipes = []
    for name, src in (("moe", tiny_qwen3_moe(root / "hf", demo_snapshot, n_expert=N_EXPERT)),
                      ("moe35", tiny_qwen35_moe(root / "hf35", demo_snapshot, n_expert=N_EXPERT))):
        recipes.append(write_yaml(root / "recipes" / f"{name}.yaml", {
            "name": name, "source": {"path": str(src)}, "quants": [{"type": "Q4_K_M", "imatrix": True}],
            "bench": False, "imatrix": {"calibration": str(CALIB), "ctx": 128, "chunks": 8, "min_expert_coverage": 1.0},
            "gates": [{"name": "botchan", "text": str(BOTCHAN), "ctx": 512, "chunks": 9, "max_kld_mean": 10.0,
                       "max_ppl_ratio": 100.0, "max_kld_p99": 100.0, "min_same_top_p": 0.0}],
            "conformance": {"chunks": 1}}))
    res = snakemake(root, recipes)
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


def test_hybrid_moe_with_a_shared_expert_builds_and_conformance_passes(moe_build):
    """Qwen3.5-MoE: the logit check ran on transformers' ``qwen3_5_moe`` class; the GGUF is ``qwen35moe`` with its
    recurrent layers marked, routed experts as 3-D ``*_exps``, the shared expert's own ``*_shexp`` tensors, and
    neither router nor the 1-D shared-expert gate quantized (src/llama-quant.cpp:292, 306); the shared expert gets no
    rule of its own (Q4_K_M raises ffn_down per layer, routed and shared alike)."""
    root, _ = moe_build
    m = json.loads((root / "artifacts" / "moe35" / "manifest.json").read_text())
    c = m["conformance"]
    assert c["passed"] and c["checks"]["logits"]["passed"] and c["checks"]["logits"]["positions"] == 255, c
    assert c["checks"]["logits"]["hf_class"].endswith("qwen3_5_moe.modeling_qwen3_5_moe.Qwen3_5MoeForCausalLM"), c
    h = read_header(root / "artifacts" / "moe35" / "moe35-Q4_K_M.gguf")
    assert h.metadata["general.architecture"] == "qwen35moe"
    assert h.metadata["qwen35moe.expert_count"] == N_EXPERT and h.metadata["qwen35moe.expert_used_count"] == 2
    assert h.metadata["qwen35moe.expert_shared_feed_forward_length"] == 256
    types = {t.name: (t.type_name, t.shape) for t in h.tensors}
    assert types["blk.0.ffn_gate_inp.weight"] == ("F32", (256, N_EXPERT))
    assert types["blk.0.ffn_gate_inp_shexp.weight"] == ("F32", (256,))
    assert types["blk.0.ffn_up_exps.weight"][1] == (256, 256, N_EXPERT)
    assert {f"blk.{i}.ffn_{r}_shexp.weight" for i in range(4) for r in ("gate", "up", "down")} <= set(types)
    assert {"blk.0.ssm_a", "blk.3.attn_q.weight"} <= set(types) and "blk.3.ssm_a" not in types
    # no _shexp rule of its own: the shared expert takes its layer's routed-expert type, use_more_bits included
    for i in range(5):
        for r in ("gate", "up", "down"):
            assert types[f"blk.{i}.ffn_{r}_shexp.weight"][0] == types[f"blk.{i}.ffn_{r}_exps.weight"][0], (i, r)
    assert {types[f"blk.{i}.ffn_down_exps.weight"][0] for i in range(5)} == {"Q4_K", "Q6_K"}
    (q,) = [a for a in m["artifacts"] if a["quant_type"] == "Q4_K_M"]
    assert [(r["layer"], r["covered"]) for r in q["calibration"]["imatrix"]["experts"]] == [
        (i, N_EXPERT) for i in range(4)]


def test_init_and_fit_read_the_mixtures(moe_build, tmp_path, capsys, monkeypatch):
    """``ggufpipe init`` on both checkpoints names experts and active parameters (and the hybrid's recurrent layers);
    ``ggufpipe fit`` on the built hybrid counts its recurrent state: 3 linear-attention layers of one F32 state each,
    (4 - 1) x (128 + 2 x 2 x 32) + 32 x 128 floats (the helper's config as the converter writes it)."""
    from pipeline.cli import main

    root, _ = moe_build
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    texts = {}
    for folder in ("hf", "hf35"):
        out = tmp_path / f"{folder}.yaml"
        assert main(["init", str(root / folder), "--out", str(out), "--device", "pi:8G"]) == 0
        texts[folder] = out.read_text()
    assert "# mixture of experts: 2 of 16 experts per token, " in texts["hf"] and "# hybrid" not in texts["hf"]
    assert "# mixture of experts: 2 of 16 experts per token, " in texts["hf35"]
    assert "# hybrid: 3 of 4 layers are linear attention" in texts["hf35"]
    capsys.readouterr()
    assert main(["fit", str(root / "artifacts" / "moe35" / "moe35-Q4_K_M.gguf"), "--mem", "1G", "--ctx", "512"]) == 0
    state = 4 * (3 * (128 + 2 * 2 * 32) + 32 * 128)
    out = capsys.readouterr().out
    assert f"the recurrent state of 3 linear-attention layers, 1 sequence(s): {3 * state / 2**20:.1f} MiB" in out, out
    assert "experts   2 of 16 per token" in out
    # the plan reads the same state from config.json that fit reads from the GGUF
    from pipeline.devices.plan_source import source_facts
    from pipeline.memory import ModelShape

    f, shape = source_facts(root / "hf35"), ModelShape.from_gguf(root / "artifacts" / "moe35" / "moe35-Q4_K_M.gguf")
    assert (sum(f.recurrent), f.recurrent_bytes) == (sum(shape.recurrent), shape.recurrent_bytes) == (3, state)
