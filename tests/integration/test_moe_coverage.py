"""Expert coverage on a real importance matrix (issue #31 item 2): a generated Qwen3-MoE checkpoint
(helpers.hf_factory.tiny_qwen3_moe: 2 layers of 16 experts, top-2) converted by the pinned converter, then the imatrix
stage. One chunk of 16 tokens routes 32 token-slots per layer over 16 experts and leaves some cold: the gate
(min_expert_coverage 1.0) fails naming the layer and the experts, and keeps no matrix; 8 chunks of 128 tokens reach
every expert and pass, with the coverage in the record. RANDOM WEIGHTS: which experts stay cold means nothing."""

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
