"""A generated mixture-of-experts model through the pinned tools (issue #31 item 2).

Expert coverage on a real importance matrix: a generated Qwen3-MoE checkpoint
(helpers.hf_factory.tiny_qwen3_moe: 2 layers of 16 experts, top-2) converted by the pinned converter, then the imatrix
stage. One chunk of 16 tokens routes 32 token-slots per layer over 16 experts and leaves some cold: the gate
(min_expert_coverage 1.0) fails naming the layer and the experts, and keeps no matrix; 8 chunks of 128 tokens reach
every expert and pass, with the coverage in the record. RANDOM WEIGHTS: which experts stay cold means nothing.

llama-quantize's MoE rules, read back from its own ``--dry-run`` on the 16-expert file and an 8-expert one; the
16-expert model's matrix refused for the 8-expert one (expert counts differ) in one line, before llama-quantize."""

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


@pytest.fixture(scope="module")
def moe8(tmp_path_factory, demo_snapshot, toolchain):
    """Another model: 8 experts, same layers and widths."""
    root = tmp_path_factory.mktemp("moe8")
    src8 = tiny_qwen3_moe(root / "hf8", demo_snapshot, n_expert=8, seed=1)
    r8 = load_recipe(_recipe(root, src8, ctx=16, chunks=1))
    gguf8 = root / r8.base_file
    convert(r8, src8, gguf8, root / "convert.json", log=root / "convert.log", tc=toolchain)
    return gguf8


def test_an_imatrix_of_another_model_is_refused_in_one_line(moe, moe8, toolchain, tmp_path):
    from pipeline.errors import RecipeError
    from pipeline.stages.quantize import quantize

    root, src, gguf16 = moe
    r = load_recipe(_recipe(tmp_path, src, ctx=16, chunks=1, min_expert_coverage=0.0))
    im = tmp_path / "imatrix-plain.gguf"
    imatrix(r, "plain", gguf16, im, tmp_path / "imatrix.json", log=tmp_path / "imatrix.log", tc=toolchain)
    path = tmp_path / "q.yaml"
    path.write_text(json.dumps({"name": "moe", "source": {"path": str(src)}, "bench": False, "conformance": False,
                                "quants": [{"type": "Q4_K_M", "imatrix": True}],
                                "imatrix": {"calibration": str(BOTCHAN)}}))
    rq = load_recipe(path)
    out = tmp_path / "moe-Q4_K_M.gguf"
    with pytest.raises(RecipeError) as exc:
        quantize(rq, "Q4_K_M", moe8, out, tmp_path / "q.json", log=tmp_path / "q.log", tc=toolchain, imatrix=im)
    assert exc.value.field == "quants[0].imatrix" and "\n" not in str(exc.value)
    assert exc.value.message == (f"imatrix-plain.gguf is not an importance matrix of {moe8.name}: "
                                 "blk.0.ffn_down_exps.weight has 256 columns x 8 expert(s) in "
                                 f"{moe8.name}, 256 x 16 in the matrix (experts differ)"), exc.value.message
    assert not out.exists() and not (tmp_path / "q.json").exists()
    quantize(rq, "Q4_K_M", gguf16, out, tmp_path / "q.json", log=tmp_path / "q.log", tc=toolchain, imatrix=im)
    assert read_header(out).get("quantize.imatrix.entries_count") > 0  # its own model takes it


def test_quantize_moe_rules_read_back(moe, moe8, toolchain, tmp_path):
    """Q4_K_M's choices on MoE tensors (src/llama-quant.cpp of b11312): the router (``ffn_gate_inp``) is never
    quantized (306); 1-D tensors never are (292); with exactly 8 experts attn_k and attn_v are raised to Q8_0
    (599-610), with 16 they are not; the expert tensors follow the type like any FFN matrix, with no rule of their
    own (and none for ``_shexp``: the file has no shared expert)."""
    _, _, gguf16 = moe
    gguf8 = moe8
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


def test_a_candidate_the_experts_cannot_take_is_refused_before_measuring(demo_snapshot, toolchain, tmp_path):
    """Experts of width 128: Q4_K's 256-element blocks do not divide ffn_down_exps' rows, which llama-quantize
    writes as Q5_0 (src/llama-quant.cpp:400-440): the mix is refused in one line naming the candidate, before the
    first measurement."""
    from helpers import CALIB

    from pipeline.errors import RecipeError
    from pipeline.stages.mix.sensitivity import sensitivity

    src = tiny_qwen3_moe(tmp_path / "hf", demo_snapshot, n_expert=8, n_layer=1, expert_width=128)
    path = tmp_path / "mix.yaml"
    path.write_text(json.dumps({
        "name": "moe", "source": {"path": str(src)}, "bench": False, "conformance": False,
        "sensitivity": {"text": str(CALIB), "ctx": 128, "chunks": 1, "bands": 1},
        "quants": ["Q4_K_M", {"type": "mix", "label": "Q4_K_M_MIX", "budget": {"size_of": "Q4_K_M"},
                              "candidates": ["Q4_K", "Q6_K"]}],
        "gates": [{"name": "botchan", "text": str(BOTCHAN), "ctx": 512, "chunks": 9}]}))
    r = load_recipe(path)
    gguf = tmp_path / r.base_file
    convert(r, src, gguf, tmp_path / "convert.json", log=tmp_path / "convert.log", tc=toolchain)
    with pytest.raises(RecipeError) as exc:
        sensitivity(r, "plain", gguf, gguf, tmp_path / "sens.json", tmp_path / "sens-rec.json", tmp_path / "scratch",
                    log=tmp_path / "sens.log", tc=toolchain)
    assert exc.value.field == "quants[1].candidates", exc.value
    assert exc.value.message == ("Q4_K cannot be written for the expert tensors: llama-quantize writes "
                                 "blk.0.ffn_down_exps.weight (rows of 128) as Q5_0 (shape fallback, "
                                 "src/llama-quant.cpp:400-440); leave Q4_K out of the candidates"), exc.value.message
    assert not (tmp_path / "sens.json").exists() and not list((tmp_path / "scratch" / "runs").iterdir())
