"""A generated mixture-of-experts model through the pinned tools (issue #31 item 2).

Expert coverage on a real importance matrix: a generated Qwen3-MoE checkpoint
(helpers.hf_factory.tiny_qwen3_moe: 2 layers of 16 experts, top-2) converted by the pinned converter, then the imatrix
stage. One chunk of 16 tokens routes 32 token-slots per layer over 16 experts and leaves some cold: the gate
(min_expert_coverage 1.0) fails naming the layer and the experts, and keeps no matrix; 8 chunks of 128 tokens reach
every expert and pass, with the coverage in the record. RANDOM WEIGHTS: which experts stay cold means nothing.

llama-quantize's MoE rules, read back from its own ``--dry-run`` on the 16-expert file and an 8-expert one."""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN
from helpers.hf_factory import tiny_qwen3_moe

from pipeline.errors import PipelineError
from pipeline.gguf import read_header
from pipeline.recipe import load_recipe
from pipeline.stages.convert import convert
from pipeline.stages.imatrix import imatrix
from pipeline.stages.quant_plan import parse_dry_run
from pipeline.tools import run_tool

N_EXPERT = 16


@pytest.fixture(scope="module")
def moe(tmp_path_factory, demo_snapshot, toolchain):
    root = tmp_path_factory.mktemp("moe")
    src = tiny_qwen3_moe(root / "hf", demo_snapshot, n_expert=N_EXPERT)
    r = load_recipe(_recipe(root, src, ctx=16, chunks=1))
    gguf = root / r.base_file
    convert(r, src, gguf, root / "convert.json", log=root / "convert.log", tc=toolchain)
    return root, src, gguf


def _recipe(root, src, **imatrix_keys):
    path = root / f"moe-{imatrix_keys['ctx']}x{imatrix_keys['chunks']}.yaml"
    path.write_text(json.dumps({"name": "moe", "source": {"path": str(src)}, "quants": ["Q4_K_M"], "bench": False,
                                "conformance": False, "imatrix": {"calibration": str(BOTCHAN),
                                                                  "min_expert_coverage": 1.0, **imatrix_keys}}))
    return path


def test_the_converted_file_is_moe(moe):
    _, _, gguf = moe
    h = read_header(gguf)
    assert h.get("general.architecture") == "qwen3moe" and h.get("qwen3moe.expert_count") == N_EXPERT
    assert {t.name for t in h.tensors} >= {"blk.0.ffn_gate_exps.weight", "blk.1.ffn_down_exps.weight",
                                           "blk.0.ffn_gate_inp.weight"}


def test_a_short_text_leaves_experts_cold_and_fails_the_gate(moe, toolchain):
    root, src, gguf = moe
    r = load_recipe(_recipe(root, src, ctx=16, chunks=1))
    out = root / "short" / "imatrix-plain.gguf"
    with pytest.raises(PipelineError) as exc:
        imatrix(r, "plain", gguf, out, root / "short" / "imatrix.json", log=root / "short.log", tc=toolchain)
    msg = str(exc.value)
    assert "\n" not in msg and ": imatrix (plain, botchan.txt): layer " in msg, msg
    assert "experts (" in msg and "< imatrix.min_expert_coverage 1); cold experts (fewer than 1 routed tokens): " in msg
    assert not out.exists() and not (root / "short" / "imatrix.json").exists()  # nothing kept


def test_a_longer_text_covers_every_expert(moe, toolchain):
    root, src, gguf = moe
    r = load_recipe(_recipe(root, src, ctx=128, chunks=8))
    rec = imatrix(r, "plain", gguf, root / "long" / "imatrix-plain.gguf", root / "long" / "imatrix.json",
                  log=root / "long.log", tc=toolchain)
    assert [row["layer"] for row in rec["experts"]] == [0, 1]
    for row in rec["experts"]:
        assert row["experts"] == N_EXPERT and row["covered"] == N_EXPERT and row["cold"] == [], row
        assert row["min_tokens"] >= 1 and row["max_tokens"] > row["min_tokens"], row


def test_quantize_moe_rules_read_back(moe, demo_snapshot, toolchain, tmp_path):
    """Q4_K_M's choices on MoE tensors (src/llama-quant.cpp of b11312): the router (``ffn_gate_inp``) is never
    quantized (306); 1-D tensors never are (292); with exactly 8 experts attn_k and attn_v are raised to Q8_0
    (599-610), with 16 they are not; the expert tensors follow the type like any FFN matrix, with no rule of their
    own (and none for ``_shexp``: the file has no shared expert)."""
    root, _, gguf16 = moe
    src8 = tiny_qwen3_moe(tmp_path / "hf8", demo_snapshot, n_expert=8, n_layer=1, seed=1)
    r8 = load_recipe(_recipe(tmp_path, src8, ctx=16, chunks=1))
    gguf8 = tmp_path / r8.base_file
    convert(r8, src8, gguf8, tmp_path / "convert.json", log=tmp_path / "convert.log", tc=toolchain)
    written = {}
    for n, path in ((16, gguf16), (8, gguf8)):
        res = run_tool(toolchain, "llama-quantize", ["--dry-run", path, tmp_path / f"q{n}.gguf", "Q4_K_M"],
                       tmp_path / f"dry{n}.log")
        written[n] = {name: t["type"] for name, t in parse_dry_run(res.output)[0].items()}
    for n in (16, 8):
        w = written[n]
        assert w["blk.0.ffn_gate_inp.weight"] == "F32" and w["blk.0.attn_norm.weight"] == "F32", w
        assert w["blk.0.ffn_gate_exps.weight"] == w["blk.0.ffn_up_exps.weight"] == "Q4_K", w
    assert written[8]["blk.0.attn_k.weight"] == written[8]["blk.0.attn_v.weight"] == "Q8_0", written[8]
    assert written[16]["blk.0.attn_k.weight"] == "Q4_K" and written[16]["blk.0.attn_v.weight"] != "Q8_0", written[16]
    assert not any("shexp" in name for name in written[8])
