"""The dry-run plan and tensor-type maps without llama.cpp (pipeline/stages/quant_plan.py,
pipeline/recipe/tensor_map.py): lines as llama-quantize b11312 prints them (src/llama-quant.cpp:397-440, 1227-1256)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import PipelineError
from pipeline.gguf.reader import GGUFHeader, TensorInfo
from pipeline.recipe.model import Quant
from pipeline.recipe.tensor_map import read_map
from pipeline.stages.quant_plan import check_patterns, check_written, differs_by_tensor, parse_dry_run, plan

# a Q4_K_M dry run of the demo (n_embd 576), abridged: copied from the pinned llama-quantize's output
DRY = """\
llama_quantize: calculating quantization size for 'F16.gguf' as Q4_K_M using 1 threads
warning: blk.0.attn_k.weight                  - ncols    576 not divisible by 256 (required for type    q4_K) -> falling back to    q5_0
warning: blk.0.attn_v.weight                  - ncols    576 not divisible by 256 (required for type    q6_K) -> falling back to    q8_0
[   1/ 272] output_norm.weight                   - [   576,      1,      1,      1], type =    f32, size =    0.002 MiB
[   2/ 272] token_embd.weight                    - [   576,  49152,      1,      1], type =    f16, size =    54.00 MiB ->    28.69 MiB (q8_0)
[   3/ 272] blk.0.attn_k.weight                  - [   576,    192,      1,      1], type =    f16, size =     0.21 MiB ->     0.07 MiB (q5_0)
[   7/ 272] blk.0.attn_v.weight                  - [   576,    192,      1,      1], type =    f16, size =     0.21 MiB ->     0.11 MiB (q8_0)
[   8/ 272] blk.0.ffn_down.weight                - [  1536,    576,      1,      1], type =    f16, size =     1.69 MiB ->     0.69 MiB (q6_K)
llama_model_quantize_impl: model size  =   256.6 MiB (16.00 BPW)
"""
NAMES = ["output_norm.weight", "token_embd.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
         "blk.0.ffn_down.weight"]


def test_parse_dry_run():
    tensors, fallbacks = parse_dry_run(DRY)
    assert list(tensors) == NAMES
    assert tensors["output_norm.weight"] == {"shape": (576,), "source": "F32", "type": "F32",
                                              "quantized": False}
    assert tensors["blk.0.ffn_down.weight"] == {"shape": (1536, 576), "source": "F16", "type": "Q6_K",
                                                 "quantized": True}
    assert fallbacks == {"blk.0.attn_k.weight": {"ncols": 576, "block": 256, "required": "Q4_K", "fallback": "Q5_0"},
                         "blk.0.attn_v.weight": {"ncols": 576, "block": 256, "required": "Q6_K", "fallback": "Q8_0"}}


def test_plan_lists_shape_fallback_and_histogram():
    p = plan(Quant(type="Q4_K_M"), DRY, "r.yaml: quantize Q4_K_M")
    assert p["histogram"] == {"F32": 1, "Q5_0": 1, "Q6_K": 1, "Q8_0": 2}
    assert [(d["tensor"], d["asked"], d["written"]) for d in differs_by_tensor(p["differs"]).values()] == [
        ("blk.0.attn_k.weight", "Q4_K", "Q5_0"), ("blk.0.attn_v.weight", "Q6_K", "Q8_0")]
    assert p["differs"][0]["reason"] == "shape fallback: row length 576 is not a multiple of 256 (the block of Q4_K)"


def test_plan_pattern_and_precedence():
    q = Quant(type="Q4_K_M", token_embedding_type="q8_0",
              tensor_types=("^token_embd\\.=q4_0", "attn_k=q4_k", "norm=q8_0"))
    p = plan(q, DRY, "w")
    by = differs_by_tensor(p["differs"])
    assert by["token_embd.weight"]["reason"].startswith("flag precedence: token_embedding_type q8_0")
    assert by["blk.0.attn_k.weight"]["asked_by"] == "tensor_types[1]"
    assert by["output_norm.weight"]["reason"].startswith("not quantized")


def test_plan_refuses_an_unexplained_type():
    q = Quant(type="Q4_K_M", tensor_types=("ffn_down=q4_0",))  # the dry run says Q6_K: a pattern that did not apply
    with pytest.raises(PipelineError, match=r"^w: llama-quantize will write blk\.0\.ffn_down\.weight as Q6_K, the "
                                            r"recipe asks Q4_0 \(tensor_types\[0\]\)"):
        plan(q, DRY, "w")


def test_check_patterns():
    check_patterns([("^blk\\.0\\.attn_k\\.", "Q8_0", "a"), ("attn", "Q8_0", "b")], NAMES, "w")
    with pytest.raises(PipelineError, match=r"^w: b: pattern 'attn_q' matches no tensor of the base file$"):
        check_patterns([("attn_k", "Q8_0", "a"), ("attn_q", "Q8_0", "b")], NAMES, "w")
    with pytest.raises(PipelineError, match=r"^w: b: pattern '\^blk\\\\.0\\\\.attn_v' is shadowed by a "):
        check_patterns([("attn", "Q8_0", "a"), ("^blk\\.0\\.attn_v", "Q4_0", "b")], NAMES, "w")


def _header(types: dict[str, int], size: int, data_offset: int = 64) -> GGUFHeader:
    shape = {"output_norm.weight": (576,), "token_embd.weight": (576, 49152), "blk.0.attn_k.weight": (576, 192),
             "blk.0.attn_v.weight": (576, 192), "blk.0.ffn_down.weight": (1536, 576)}
    tensors = tuple(TensorInfo(n, shape[n], t, 0, 0, 0) for n, t in types.items())
    return GGUFHeader(Path("x.gguf"), 3, {}, 32, data_offset, tensors, size)


def test_check_written():
    p = plan(Quant(type="Q4_K_M"), DRY, "w")
    types = {"output_norm.weight": 0, "token_embd.weight": 8, "blk.0.attn_k.weight": 6, "blk.0.attn_v.weight": 8,
             "blk.0.ffn_down.weight": 14}
    data = 576 * 4 + 49152 * 18 * 34 + 192 * 18 * 22 + 192 * 18 * 34 + 576 * 6 * 210
    assert check_written(p, 64, _header(types, 64 + data), "w") == {
        "header": 64, "tensor_data": data, "predicted": 64 + data, "written": 64 + data}
    with pytest.raises(PipelineError, match=r"is 100 bytes \(header 64\), the plan predicts"):
        check_written(p, 64, _header(types, 100), "w")
    with pytest.raises(PipelineError, match=r"1 tensor\(s\) written as another type .* blk\.0\.attn_k\.weight: Q4_0"):
        check_written(p, 64, _header({**types, "blk.0.attn_k.weight": 2}, 64 + data), "w")


@pytest.mark.parametrize("text, message", [
    ("^blk\\.0\\.attn_v\\.weight$=q8_0 # comment\n", "line 1: '#': llama-quantize has no comments"),
    ("attn_v\n", "line 1: 'attn_v': not 'pattern=type'"),
    ("^blk\\.\\D=q8_0\n", "upper-case in the pattern"),
    ("attn_v=q9_9\n", "unknown ggml type 'q9_9'"),
    ("attn_v(=q8_0\n", "not a regular expression"),
    ("\n", "holds no 'pattern=type' entry"),
])
def test_read_map_refusals(tmp_path, text, message):
    (tmp_path / "m.map").write_text(text)
    with pytest.raises(ValueError, match=None) as exc:
        read_map(tmp_path / "m.map")
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_read_map_entries(tmp_path):
    (tmp_path / "m.map").write_text("^blk\\.0\\.attn_v\\.weight$=q8_0  ^output\\.weight$=Q6_K\n\nffn_down=iq4_nl\n")
    assert read_map(tmp_path / "m.map") == (("^blk\\.0\\.attn_v\\.weight$", "Q8_0", 1),
                                            ("^output\\.weight$", "Q6_K", 1), ("ffn_down", "IQ4_NL", 3))
