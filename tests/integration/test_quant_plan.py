"""Issue #19 part 1 with the real llama-quantize: the dry-run plan, types read back, sizes to the byte, and
tensor-type maps (docs/quantization.md)."""

from __future__ import annotations

from collections import Counter

import pytest
from helpers import write_split_recipe

from pipeline.errors import PipelineError, RecipeError
from pipeline.gguf.reader import read_header
from pipeline.recipe import load_recipe
from pipeline.stages.quant_plan import differs_by_tensor

SPM = "ggml-vocab-llama-spm.gguf"


@pytest.fixture(scope="module")
def tiny256(tmp_path_factory, toolchain):
    """A 2-layer Llama whose every width is a multiple of 256 (no shape fallback for any K type)."""
    from helpers.gguf_factory import tiny_llama

    d = tmp_path_factory.mktemp("plan256")
    return tiny_llama(d / "tiny-F16.gguf", toolchain.root / "vocab" / SPM, n_layer=2, n_embd=256, n_head=4,
                      n_head_kv=2, n_ff=512, dtype="F16")


@pytest.fixture(scope="module")
def tiny576(tmp_path_factory, toolchain):
    """A 2-layer Llama of the demo's widths (SmolLM2-135M: n_embd 576, n_ff 1536, 9 heads, 3 KV heads)."""
    from helpers.gguf_factory import tiny_llama

    d = tmp_path_factory.mktemp("plan576")
    return tiny_llama(d / "tiny-F16.gguf", toolchain.root / "vocab" / SPM, n_layer=2, n_embd=576, n_head=9,
                      n_head_kv=3, n_ff=1536, dtype="F16")


def _quantize(tmp_path, toolchain, quantize_exe, base, body: str, key: str):
    from pipeline.stages.quantize import quantize

    recipe = load_recipe(write_split_recipe(tmp_path, tmp_path, body), quantize_exe)
    out = tmp_path / f"out-{key}.gguf"
    rec = quantize(recipe, key, base, out, tmp_path / f"quant-{key}.json", tmp_path / "quantize.log", threads=2,
                   tc=toolchain)
    return rec, out


def _types(path) -> dict[str, str]:
    return {t.name: t.type_name for t in read_header(path).tensors}


def test_map_round_trip(tmp_path, toolchain, quantize_exe, tiny256):
    (tmp_path / "map.txt").write_text(
        "^blk\\.0\\.attn_v\\.weight$=q8_0\n"
        "^blk\\.1\\.ffn_down\\.weight$=q4_0 ^blk\\.\\d+\\.attn_q\\.weight$=q5_K\n"
        "^output\\.weight$=q5_1\n")
    rec, out = _quantize(tmp_path, toolchain, quantize_exe, tiny256,
                         "quants: [{type: Q4_K_M, tensor_types_file: map.txt}]\n", "Q4_K_M")
    got = _types(out)
    want = {"blk.0.attn_v.weight": "Q8_0", "blk.1.ffn_down.weight": "Q4_0", "blk.0.attn_q.weight": "Q5_K",
            "blk.1.attn_q.weight": "Q5_K", "output.weight": "Q5_1"}
    assert {n: got[n] for n in want} == want
    assert got["blk.0.attn_k.weight"] == "Q4_K"  # the mix's own choice where no pattern matched
    tt = rec["tensor_types"]
    assert tt["differs"] == []  # 256-divisible widths: every pattern applied as written
    assert tt["histogram"] == dict(sorted(Counter(got.values()).items()))
    assert tt["bytes"]["predicted"] == tt["bytes"]["written"] == out.stat().st_size
    assert rec["tensor_types_file"]["file"] == "map.txt"
    assert rec["quant"]["llama_quantize_args"] == ["--tensor-type-file", "map.txt"]


def test_shape_fallback_on_demo_widths(tmp_path, toolchain, quantize_exe, tiny576):
    rec, out = _quantize(tmp_path, toolchain, quantize_exe, tiny576,
                         "quants: [{type: Q4_K_M, tensor_types: ['^blk\\.0\\.ffn_up\\.weight$=q6_K']}]\n", "Q4_K_M")
    got = _types(out)
    differs = differs_by_tensor(rec["tensor_types"]["differs"])
    # ne0 576: Q4_K -> Q5_0 and Q6_K -> Q8_0 (src/llama-quant.cpp:413-416); ffn_down (ne0 1536) keeps its K type
    assert differs["blk.1.attn_q.weight"] == {
        "tensor": "blk.1.attn_q.weight", "asked": "Q4_K", "asked_by": "Q4_K_M", "written": "Q5_0",
        "reason": "shape fallback: row length 576 is not a multiple of 256 (the block of Q4_K)"}
    assert differs["blk.0.ffn_up.weight"]["asked"] == "Q6_K" and differs["blk.0.ffn_up.weight"]["written"] == "Q8_0"
    assert differs["blk.0.ffn_up.weight"]["asked_by"] == "tensor_types[0]"
    assert got["blk.0.ffn_down.weight"] in ("Q4_K", "Q6_K") and "blk.0.ffn_down.weight" not in differs
    assert all(got[n] == d["written"] for n, d in differs.items())
    assert all(d["reason"].startswith("shape fallback") for d in differs.values())
    assert rec["tensor_types"]["bytes"]["written"] == rec["tensor_types"]["bytes"]["predicted"] == out.stat().st_size


def test_flag_precedence_is_listed(tmp_path, toolchain, quantize_exe, tiny256):
    rec, out = _quantize(tmp_path, toolchain, quantize_exe, tiny256,
                         "quants: [{type: Q8_0, token_embedding_type: q4_0, tensor_types: ['^token_embd\\.=q6_K']}]\n",
                         "Q8_0")
    assert _types(out)["token_embd.weight"] == "Q4_0"
    (d,) = differs_by_tensor(rec["tensor_types"]["differs"]).values()
    assert (d["tensor"], d["asked"], d["asked_by"], d["written"]) == ("token_embd.weight", "Q6_K", "tensor_types[0]",
                                                                       "Q4_0")
    assert d["reason"].startswith("flag precedence: token_embedding_type")


@pytest.mark.parametrize("map_text, message", [
    ("^blk\\.0\\.attn_v\\.weight$=q8_0\n^blk\\.0\\.attn_x\\.weight$=q8_0\n",
     "tensor_types_file map.txt line 2: pattern '^blk\\\\.0\\\\.attn_x\\\\.weight$' matches no tensor of the base file"),
    ("attn_v=q8_0\n^blk\\.1\\.attn_v\\.weight$=q4_0\n",
     "tensor_types_file map.txt line 2: pattern '^blk\\\\.1\\\\.attn_v\\\\.weight$' is shadowed by tensor_types_file "
     "map.txt line 1"),
])
def test_map_pattern_refused(tmp_path, toolchain, quantize_exe, tiny256, map_text, message):
    (tmp_path / "map.txt").write_text(map_text)
    with pytest.raises(PipelineError) as exc:
        _quantize(tmp_path, toolchain, quantize_exe, tiny256, "quants: [{type: Q8_0, tensor_types_file: map.txt}]\n",
                  "Q8_0")
    text = str(exc.value)
    assert "\n" not in text and "tiny-split.yaml: quantize Q8_0: " in text and message in text
    assert not (tmp_path / "out-Q8_0.gguf").exists()


def test_map_with_token_embedding_type_refused(tmp_path, quantize_exe):
    (tmp_path / "map.txt").write_text("^blk\\.0\\.attn_v\\.weight$=q8_0\n")
    with pytest.raises(RecipeError) as exc:
        load_recipe(write_split_recipe(tmp_path, tmp_path, "quants: [{type: Q8_0, tensor_types_file: map.txt, "
                                                           "token_embedding_type: q8_0}]\n"), quantize_exe)
    assert exc.value.field == "quants[0].tensor_types_file" and exc.value.message.startswith(
        "not with `token_embedding_type`"), exc.value
