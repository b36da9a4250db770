"""One memory model (pipeline/memory.py ``components``) for a GGUF and for the checkpoint it is built from:
a ModelShape read from a GGUF header and one predicted from config.json + safetensors headers
(pipeline/devices/plan.py ``model_shape``) give the same components for the same model. No llama.cpp, no torch."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import pytest

from pipeline.devices import plan as P
from pipeline.devices import plan_source as S
from pipeline.devices.plan_tensors import config_tensors
from pipeline.memory import ModelShape, components

from .test_memory_model import write_gguf

LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 320,
         "torch_dtype": "float16"}
TOKENS = [f"t{i}" for i in range(320)]
MERGES = [f"t{i} t{i + 1}" for i in range(40)]
COMPONENTS = ("weights", "repack", "kv", "compute", "output")
# HF name part -> GGUF name part (the converter's names for a Llama-style decoder)
GGUF_NAMES = {"model.embed_tokens": "token_embd", "lm_head": "output", "model.norm": "output_norm",
              "model.layers.": "blk.", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
              "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
              "post_attention_layernorm": "ffn_norm"}


def checkpoint(folder: Path, cfg: dict) -> Path:
    """config.json, tokenizer.json and a safetensors file whose header lists the tensors (data left sparse)."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    (folder / "tokenizer.json").write_text(json.dumps(
        {"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(TOKENS)}, "merges": MERGES}}))
    header, off = {}, 0
    for name, shape, b in config_tensors(cfg, 2):
        n = b * math.prod(shape)
        header[name] = {"dtype": "F16", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    with open(folder / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        f.truncate(8 + len(raw) + off)
    return folder


def _gguf_name(hf: str) -> str:
    for a, b in GGUF_NAMES.items():
        hf = hf.replace(a, b)
    return hf


def _same(hf: ModelShape, gg: ModelShape, **kw) -> None:
    a, b = components(hf, **kw), components(gg, **kw)
    assert {k: a[k] for k in COMPONENTS} == {k: b[k] for k in COMPONENTS}, kw
    assert a["reserved"] == b["reserved"]
    # the metadata bytes are estimated before the GGUF exists (vocabulary strings, tensor infos): all the overhead
    # differs by
    assert a["overhead"] - hf.metadata_bytes == b["overhead"] - gg.metadata_bytes
    assert abs(hf.metadata_bytes - gg.metadata_bytes) < 16 * 1024


@pytest.mark.parametrize("tied", [True, False])
def test_gguf_writer_file_and_checkpoint_give_the_same_components(tmp_path, tied):
    """The GGUF written by gguf-py (the converter's writer: its alignment, its tensor order) of the same Llama."""
    from helpers.gguf_factory import Tokenizer, tiny_llama

    cfg = {**LLAMA, "tie_word_embeddings": tied}
    facts = S.source_facts(checkpoint(tmp_path / "hf", cfg))
    assert facts.n_merges == len(MERGES) and facts.tied is tied
    hf = P.model_shape(facts, "F16")
    tok = Tokenizer()
    tok.set("model", "gpt2")
    tok.set("tokens", TOKENS)
    tok.set("token_type", [1] * len(TOKENS))
    tok.set("merges", MERGES)
    gg = ModelShape.from_gguf(tiny_llama(tmp_path / "m.gguf", tok, n_layer=2, n_embd=64, n_head=4, n_head_kv=2,
                                         n_ff=128, dtype="F16", tie_embeddings=tied))
    assert (hf.n_layer, hf.n_embd, hf.n_ff, hf.n_head_kv, hf.head_k, hf.n_vocab, hf.n_merges, hf.weights) == (
        gg.n_layer, gg.n_embd, gg.n_ff, gg.n_head_kv, gg.head_k, gg.n_vocab, gg.n_merges, gg.weights)
    assert P.gguf_bytes(facts, "F16") == hf.metadata_bytes + hf.weights
    for ctx, kv_type, arch in ((1, "f16", "x86_64"), (4096, "q8_0", "arm64"), (700, "f32", "generic")):
        _same(hf, gg, ctx=ctx, kv_type=kv_type, arch=arch)
    _same(hf, gg, ctx=512, n_outputs=512)  # llama-perplexity's all-logits run, as ggufpipe plan predicts it


@pytest.mark.parametrize("ftype,arch", [("Q4_0", "x86_64"), ("Q8_0", "arm64"), ("Q4_K_M", "arm64-dotprod")])
def test_quant_with_sliding_window_from_config_and_header(tmp_path, ftype, arch):
    """A Gemma-3-style checkpoint (sliding window on 5 of 6 layers, from config.json's layer_types) and the GGUF
    of its quant (header only, each tensor at the type llama-quantize gives it): same KV cells, same repacked
    tensors (repack needs rows a multiple of 8: 256-wide matrices), same components."""
    cfg = {**LLAMA, "architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text", "hidden_size": 256,
           "intermediate_size": 512, "num_hidden_layers": 6, "head_dim": 64, "sliding_window": 512,
           "layer_types": ["sliding_attention"] * 5 + ["full_attention"], "tie_word_embeddings": True}
    facts = S.source_facts(checkpoint(tmp_path / "hf", cfg))
    hf = P.model_shape(facts, ftype)
    assert hf.swa == [True] * 5 + [False] and hf.n_swa == 512
    meta = {".block_count": 6, ".embedding_length": 256, ".attention.head_count": 4, ".attention.head_count_kv": 2,
            ".attention.key_length": 64, ".attention.value_length": 64, ".feed_forward_length": 512,
            ".attention.sliding_window": 512, "tokenizer.ggml.tokens": TOKENS, "tokenizer.ggml.merges": MERGES}
    tensors = [(_gguf_name(t.name), t.ne, t.type_name) for t in hf.tensors]
    gg = ModelShape.from_gguf(write_gguf(tmp_path / "m.gguf", "gemma3", meta, tensors))
    assert gg.swa == hf.swa and gg.weights == hf.weights
    for ctx in (256, 2048, 8192):
        _same(hf, gg, ctx=ctx, arch=arch)
    p = components(hf, 8192, arch=arch)
    assert p["details"]["swa_cells"] == 1024 and p["repack"] > 0  # pad(512 + 512, 256); something repacked


def test_plan_and_fit_use_the_same_model(tmp_path):
    """ggufpipe plan's llama-perplexity row is components() of the shape plus the tool's KL buffer, nothing else."""
    facts = S.source_facts(checkpoint(tmp_path / "hf", {**LLAMA, "tie_word_embeddings": True}))
    run = P.llama_run_bytes(facts, "Q8_0", 512, 512)
    assert run == components(P.model_shape(facts, "Q8_0"), 512, n_outputs=512)
    kl = P.llama_run_bytes(facts, "Q8_0", 512, 512, kl="base")
    assert kl["total"] - run["total"] == kl["compute"] - run["compute"] == 512 * (320 + 4) * 2


def test_roles_of_hf_names():
    assert P.tensor_role("model.layers.3.self_attn.qkv_proj.weight") == ("attn_qkv", 3)  # not attn_v
    assert P.tensor_role("model.layers.0.mlp.gate_up_proj.weight") == ("ffn_up", 0)
    assert P.tensor_role("transformer.h.1.attn.c_proj.weight") == ("attn_output", 1)
    assert P.tensor_role("transformer.h.1.mlp.c_proj.weight") == ("ffn_down", 1)
    assert P.tensor_role("lm_head.weight") == ("output", -1)
    assert P.tensor_role("model.embed_tokens.weight") == ("token_embd", -1)
    assert P.tensor_role("model.layers.2.input_layernorm.weight") == ("other", 2)
