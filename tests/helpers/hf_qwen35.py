"""A generated tiny Qwen3.5 checkpoint (``Qwen3_5ForConditionalGeneration``, llama.cpp architecture ``qwen35``) with
its multi-token-prediction (MTP) layer, for the integration tier.

The config carries the keys of the published Qwen3.5 text config (transformers 5.2 ``Qwen3_5TextConfig``, the
converter's ``Qwen3_5TextModel``: conversion/qwen.py:652-657 of the pinned tree), scaled down: hybrid layers
(``layer_types``: three ``linear_attention`` Gated DeltaNet layers, then one ``full_attention`` layer, the
``full_attention_interval`` 4 pattern), gated full attention (``q_proj`` holds query and gate, ``head_dim``
above ``hidden_size / num_attention_heads``, q/k norms), grouped linear-attention heads (twice as many value
heads as key heads, so the converter's V-head reorder runs: conversion/qwen.py:453-633), interleaved M-RoPE on a
quarter of the head (``partial_rotary_factor`` 0.25, ``mrope_section``), ``mtp_num_hidden_layers: 1`` with the
MTP tensors under ``mtp.*`` as Qwen ships them (``mtp.fc``, ``mtp.pre_fc_norm_embedding``,
``mtp.pre_fc_norm_hidden``, ``mtp.norm``, ``mtp.layers.0.*``: remapped by ``_QwenMtpMixin.filter_tensors``,
conversion/qwen.py:306-337), tied embeddings (no ``lm_head.weight``), the text weights under
``model.language_model.*`` and one vision tensor under ``model.visual.*`` that the text converter skips.

Tokenizer: Qwen3.5's own 248k vocabulary is not available offline. llama.cpp's vendored
``models/ggml-vocab-qwen35.gguf`` is the Qwen2 byte-level BPE vocabulary (151,643 tokens + 293 added, 151,387
merges) tagged ``tokenizer.ggml.pre = qwen35``; :func:`qwen_tokenizer` rebuilds a ``tokenizer.json`` from it with
Qwen3.5's pre-tokenizer (NFC, the ``PRETOKENIZE_REGEX`` split of transformers 5.2 ``tokenization_qwen3_5.py``,
byte-level). On this vocabulary the converter's check text encodes as with Qwen2's regex, so its hash is Qwen2's
(e636dc30..., conversion/base.py:1759-1761) and the GGUF says ``pre = qwen2``; the real Qwen3.5 tokenizer hashes to
d30d75d9... and ``qwen35`` (conversion/base.py:1903-1905). The chat template is the vocab file's ChatML one.

torch and tokenizers are imported inside the functions: the unit tier imports the helpers package, never these.
Random weights: whatever acceptance a draft reaches on this model says nothing about the real one.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Qwen3.5's pre-tokenizer regex (transformers 5.2 models/qwen3_5/tokenization_qwen3_5.py; llama.cpp's
# LLAMA_VOCAB_PRE_TYPE_QWEN35 quotes it: src/llama-vocab.cpp:392-397).
QWEN35_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+"""
                r"""[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")

# The scaled-down text config: the published model's keys, small values (see the module docstring).
N_LAYER = 4               # main decoder layers: linear, linear, linear, full
N_MTP = 1                 # mtp_num_hidden_layers; llama.cpp's qwen35 MTP graph needs exactly 1 (src/models/qwen35.cpp:489)
HIDDEN, FF = 64, 128
N_HEAD, N_KV, HEAD_DIM = 4, 1, 32
LIN_K_HEADS, LIN_V_HEADS, LIN_K_DIM, LIN_V_DIM, CONV_K = 2, 4, 16, 16, 4
MROPE_SECTION = [2, 1, 1]  # sums to the rotary dims / 2 (HEAD_DIM * 0.25 / 2)


def qwen_tokenizer(vocab_gguf: Path, dest: Path) -> int:
    """Write ``tokenizer.json``, ``tokenizer_config.json`` and ``special_tokens_map.json`` for the vocabulary of
    ``vocab_gguf`` (llama.cpp's ggml-vocab-qwen35.gguf) into ``dest``; returns the token count."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

    from pipeline.gguf import read_header

    get = read_header(vocab_gguf).get
    tokens, types, merges = get("tokenizer.ggml.tokens"), get("tokenizer.ggml.token_type"), get("tokenizer.ggml.merges")
    vocab = {t: i for i, t in enumerate(tokens) if types[i] == 1}  # NORMAL tokens: the BPE model's
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False,
                               byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN35_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    # the CONTROL tokens (<|endoftext|>, <|im_start|>, <|im_end|>); the vocab file's 290 "[PAD<id>]" fillers up to
    # the padded size are left to the converter, which writes them for ids no token has (as for the real Qwen2)
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False)
                            for i in range(len(tokens)) if types[i] == 3])
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    eos, pad = tokens[get("tokenizer.ggml.eos_token_id")], tokens[get("tokenizer.ggml.padding_token_id")]
    special = {"eos_token": "<|im_end|>", "pad_token": pad}
    config = {"tokenizer_class": "Qwen2Tokenizer", "add_bos_token": False, "add_prefix_space": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 262144, "bos_token": None,
              "errors": "replace", "unk_token": None, "chat_template": get("tokenizer.chat_template"),
              "additional_special_tokens": [t for t in ("<|im_start|>", "<|im_end|>", eos) if t in tokens], **special}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    return len(tokens)


def text_config(vocab_size: int, mtp_layers: int = N_MTP) -> dict:
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(N_LAYER)]
    return {
        "model_type": "qwen3_5_text", "vocab_size": vocab_size, "hidden_size": HIDDEN, "intermediate_size": FF,
        "num_hidden_layers": N_LAYER, "layer_types": layer_types, "full_attention_interval": 4,
        "num_attention_heads": N_HEAD, "num_key_value_heads": N_KV, "head_dim": HEAD_DIM, "attn_output_gate": True,
        "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": CONV_K, "linear_key_head_dim": LIN_K_DIM, "linear_value_head_dim": LIN_V_DIM,
        "linear_num_key_heads": LIN_K_HEADS, "linear_num_value_heads": LIN_V_HEADS,
        "mtp_num_hidden_layers": mtp_layers, "mtp_use_dedicated_embeddings": False,
        "max_position_embeddings": 4096, "tie_word_embeddings": True, "use_cache": True, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_interleaved": True, "mrope_section": MROPE_SECTION},
        "eos_token_id": 151645,
    }


def tiny_qwen35(dest: Path, vocab_gguf: Path, mtp_layers: int = N_MTP, seed: int = 0, echo: bool = False) -> Path:
    """A random ``Qwen3_5ForConditionalGeneration`` checkpoint (bf16 safetensors) in ``dest``; its tokenizer from
    ``vocab_gguf`` (llama.cpp's ggml-vocab-qwen35.gguf) or copied from ``vocab_gguf``, a folder this function wrote.

    ``echo``: a control whose MTP head can draft. Every block's output projection (``o_proj``, ``out_proj``,
    ``down_proj``) is zero, so the residual stream stays the token's embedding and, with tied embeddings, the model
    repeats its last token (greedy); the MTP ``fc`` is ``[I | 0]`` (src/models/qwen35.cpp:540-549 concatenates the
    normed embedding first), so the head predicts the token it is given: the one the model will repeat. The other
    weights stay random."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    if (vocab_gguf / "tokenizer.json").is_file():  # another checkpoint's folder: its tokenizer files, copied
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copy(vocab_gguf / name, dest / name)
        n_tok = json.loads((vocab_gguf / "config.json").read_text())["text_config"]["vocab_size"]
    else:
        n_tok = qwen_tokenizer(vocab_gguf, dest)
    vocab = n_tok  # 151,936: the Qwen2 vocabulary's padded size (the real Qwen3.5 has 248,320)
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": text_config(vocab, mtp_layers), "tie_word_embeddings": True,
        "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "out_hidden_size": HIDDEN, "num_position_embeddings": 64},
        "transformers_version": "5.2.0"}, indent=2) + "\n")
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": [151645, 151643]}) + "\n")
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).contiguous()

    def norm(n):  # Qwen3.5 RMSNorm weights are stored as w - 1 (the converter adds 1 back)
        return rnd(n, scale=0.1)

    def full_attention(p: str) -> dict:
        return {p + "self_attn.q_proj.weight": rnd(N_HEAD * HEAD_DIM * 2, HIDDEN),  # query and output gate
                p + "self_attn.k_proj.weight": rnd(N_KV * HEAD_DIM, HIDDEN),
                p + "self_attn.v_proj.weight": rnd(N_KV * HEAD_DIM, HIDDEN),
                p + "self_attn.o_proj.weight": rnd(HIDDEN, N_HEAD * HEAD_DIM),
                p + "self_attn.q_norm.weight": norm(HEAD_DIM), p + "self_attn.k_norm.weight": norm(HEAD_DIM)}

    def block(p: str, kind: str) -> dict:
        t = {p + "input_layernorm.weight": norm(HIDDEN), p + "post_attention_layernorm.weight": norm(HIDDEN),
             p + "mlp.gate_proj.weight": rnd(FF, HIDDEN), p + "mlp.up_proj.weight": rnd(FF, HIDDEN),
             p + "mlp.down_proj.weight": rnd(HIDDEN, FF)}
        if kind == "full_attention":
            return {**t, **full_attention(p)}
        kd, vd = LIN_K_HEADS * LIN_K_DIM, LIN_V_HEADS * LIN_V_DIM
        q = p + "linear_attn."
        return {**t, q + "in_proj_qkv.weight": rnd(2 * kd + vd, HIDDEN), q + "in_proj_z.weight": rnd(vd, HIDDEN),
                q + "in_proj_b.weight": rnd(LIN_V_HEADS, HIDDEN), q + "in_proj_a.weight": rnd(LIN_V_HEADS, HIDDEN),
                q + "conv1d.weight": rnd(2 * kd + vd, 1, CONV_K, scale=0.3), q + "dt_bias": rnd(LIN_V_HEADS, scale=1.0),
                q + "A_log": rnd(LIN_V_HEADS, scale=0.5), q + "norm.weight": 1 + norm(LIN_V_DIM),
                q + "out_proj.weight": rnd(HIDDEN, vd)}

    cfg = text_config(vocab, mtp_layers)
    t = {"model.language_model.embed_tokens.weight": rnd(vocab, HIDDEN), "model.language_model.norm.weight": norm(HIDDEN),
         "model.visual.patch_embed.proj.weight": rnd(32, 3, 2, 16, 16)}  # skipped by the text converter
    for i, kind in enumerate(cfg["layer_types"]):
        t.update(block(f"model.language_model.layers.{i}.", kind))
    if mtp_layers:
        t.update({"mtp.fc.weight": rnd(HIDDEN, 2 * HIDDEN), "mtp.pre_fc_norm_embedding.weight": norm(HIDDEN),
                  "mtp.pre_fc_norm_hidden.weight": norm(HIDDEN), "mtp.norm.weight": norm(HIDDEN)})
        for j in range(mtp_layers):  # each MTP layer is a full-attention decoder block
            t.update(block(f"mtp.layers.{j}.", "full_attention"))
    if echo:
        for name, w in t.items():
            if name.endswith(("o_proj.weight", "out_proj.weight", "down_proj.weight")):
                t[name] = torch.zeros_like(w)
            elif name.endswith("norm.weight") and "linear_attn." not in name:
                t[name] = torch.zeros_like(w)  # stored as w - 1: unit norms
        if mtp_layers:
            t["mtp.fc.weight"] = torch.cat([torch.eye(HIDDEN), torch.zeros(HIDDEN, HIDDEN)], 1).to(torch.bfloat16)
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
