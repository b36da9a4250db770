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


def tiny_qwen35_moe(dest: Path, tokenizer_dir: Path, n_expert: int = 16, top_k: int = 2, seed: int = 0) -> Path:
    """A random ``Qwen3_5MoeForConditionalGeneration`` checkpoint (issue #31; transformers' ``qwen3_5_moe``, the
    converter's ``Qwen3_5MoeTextModel``, llama.cpp ``qwen35moe``: conversion/qwen.py:658-661): the hybrid layers of
    :func:`tiny_qwen35` (three Gated DeltaNet, one gated full attention) with a sparse MoE block in every layer:
    ``n_expert`` routed experts, ``top_k`` per token, and one shared expert behind its sigmoid gate
    (``mlp.shared_expert_gate``, one row). Experts as transformers 5 stores them (``Qwen3_5MoeExperts``: one fused
    ``mlp.experts.gate_up_proj`` [experts, 2 x width, hidden] and ``mlp.experts.down_proj``), which the converter
    splits (conversion/qwen.py:98-117). Widths 256 (K/IQ types need rows of 256); router rows of std 1 so that F16
    rounding does not flip experts. One MTP layer (a full-attention block with its own experts, ``mtp.*``), as the
    published checkpoints have: the pinned converter requires one unless asked for ``--no-mtp``
    (conversion/qwen.py:299-305). Tokenizer: ``tokenizer_dir``'s (the demo's SmolLM2)."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, dest / name)
    vocab = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    H, F, NH, KV, HD = 256, 256, 4, 1, 64
    LK, LV, KD, VD = 2, 4, 32, 32
    layer_types = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(N_LAYER)]
    text = {
        "model_type": "qwen3_5_moe_text", "vocab_size": vocab, "hidden_size": H, "num_hidden_layers": N_LAYER,
        "layer_types": layer_types, "full_attention_interval": 4, "num_attention_heads": NH, "num_key_value_heads": KV,
        "head_dim": HD, "attention_bias": False, "attention_dropout": 0.0, "hidden_act": "silu", "rms_norm_eps": 1e-6,
        "linear_conv_kernel_dim": CONV_K, "linear_key_head_dim": KD, "linear_value_head_dim": VD,
        "linear_num_key_heads": LK, "linear_num_value_heads": LV, "moe_intermediate_size": F,
        "shared_expert_intermediate_size": F, "num_experts": n_expert, "num_experts_per_tok": top_k,
        "router_aux_loss_coef": 0.001, "output_router_logits": False, "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "max_position_embeddings": 4096, "tie_word_embeddings": False, "use_cache": True, "dtype": "bfloat16",
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                            "mrope_interleaved": True, "mrope_section": [4, 2, 2]},
        "bos_token_id": 1, "eos_token_id": 2}
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe", "text_config": text,
        "tie_word_embeddings": False,
        "vision_config": {"model_type": "qwen3_5_moe", "depth": 1, "hidden_size": 32, "intermediate_size": 64,
                          "num_heads": 2, "in_channels": 3, "patch_size": 16, "spatial_merge_size": 2,
                          "temporal_patch_size": 2, "out_hidden_size": H, "num_position_embeddings": 64},
        "transformers_version": "5.17.0"}, indent=2) + "\n")
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=0.05):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).contiguous()

    def norm(n):  # stored as w - 1, as in tiny_qwen35
        return rnd(n, scale=0.1)

    p0 = "model.language_model."
    t = {p0 + "embed_tokens.weight": rnd(vocab, H, scale=1.0), p0 + "norm.weight": norm(H),
         "lm_head.weight": rnd(vocab, H), "model.visual.patch_embed.proj.weight": rnd(32, 3, 2, 16, 16)}
    kd, vd = LK * KD, LV * VD
    t.update({"mtp.fc.weight": rnd(H, 2 * H), "mtp.pre_fc_norm_embedding.weight": norm(H),
              "mtp.pre_fc_norm_hidden.weight": norm(H), "mtp.norm.weight": norm(H)})
    blocks = [(f"{p0}layers.{i}.", kind) for i, kind in enumerate(layer_types)] + [("mtp.layers.0.", "full_attention")]
    for p, kind in blocks:
        t.update({p + "input_layernorm.weight": norm(H), p + "post_attention_layernorm.weight": norm(H),
                  p + "mlp.gate.weight": rnd(n_expert, H, scale=1.0),
                  p + "mlp.experts.gate_up_proj": rnd(n_expert, 2 * F, H), p + "mlp.experts.down_proj": rnd(n_expert, H, F),
                  p + "mlp.shared_expert.gate_proj.weight": rnd(F, H), p + "mlp.shared_expert.up_proj.weight": rnd(F, H),
                  p + "mlp.shared_expert.down_proj.weight": rnd(H, F), p + "mlp.shared_expert_gate.weight": rnd(1, H)})
        if kind == "full_attention":
            t.update({p + "self_attn.q_proj.weight": rnd(NH * HD * 2, H), p + "self_attn.k_proj.weight": rnd(KV * HD, H),
                      p + "self_attn.v_proj.weight": rnd(KV * HD, H), p + "self_attn.o_proj.weight": rnd(H, NH * HD),
                      p + "self_attn.q_norm.weight": norm(HD), p + "self_attn.k_norm.weight": norm(HD)})
        else:
            q = p + "linear_attn."
            t.update({q + "in_proj_qkv.weight": rnd(2 * kd + vd, H), q + "in_proj_z.weight": rnd(vd, H),
                      q + "in_proj_b.weight": rnd(LV, H), q + "in_proj_a.weight": rnd(LV, H),
                      q + "conv1d.weight": rnd(2 * kd + vd, 1, CONV_K, scale=0.3), q + "dt_bias": rnd(LV, scale=1.0),
                      q + "A_log": rnd(LV, scale=0.5), q + "norm.weight": 1 + norm(VD), q + "out_proj.weight": rnd(H, vd)})
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest
