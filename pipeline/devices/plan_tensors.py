"""The plan's view of a checkpoint's tensors (pipeline/devices/plan.py): the tensors a config.json stands for when only
the index is at hand (:func:`config_tensors`: Llama-style decoders and Qwen's mixtures of experts), the GGUF role of
an HF tensor name (:func:`tensor_role`), and the tensors llama-quantize never quantizes (:func:`never_quantized`)."""

from __future__ import annotations

import re

# HF tensor name -> the GGUF role llama-quantize's type choice and the memory model go by: the first role one of
# whose name parts the (lower-cased) name contains. Fused q/k/v before v_proj (which "qkv_proj" contains), gate_up
# before gate. Llama-style names, GPT-2 / GPT-NeoX / Falcon / InternLM / Phi spellings.
TENSOR_ROLES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("output", ("lm_head",)),
    ("token_embd", ("embed_tokens", "wte.", "word_embeddings", "tok_embeddings", "embedding.weight")),
    ("attn_qkv", ("qkv_proj", "query_key_value", "c_attn", "wqkv")),
    ("attn_q", ("q_proj",)),
    ("attn_k", ("k_proj",)),
    ("attn_v", ("v_proj",)),
    ("attn_output", ("o_proj", "out_proj", "attention.dense", "attn.c_proj", "self_attn.dense")),
    ("ffn_up", ("gate_up_proj", "up_proj")),
    ("ffn_gate", ("gate_proj",)),
    ("ffn_down", ("down_proj", ".w2.", "fc2", "dense_4h_to_h", "mlp.c_proj")),
)
_LAYER = re.compile(r"\.(?:layers|h|blocks|layer)\.(\d+)\.")
# MoE routers (GGUF ffn_gate_inp, src/llama-quant.cpp:304-306) and the one-row shared-expert gate (ffn_gate_inp_shexp:
# 1-D in the GGUF, and 1-D tensors stay F32, llama-quant.cpp:292): never quantized
_ROUTERS = re.compile(r"\.mlp\.gate\.weight$|\.block_sparse_moe\.gate\.weight$|shared_expert_gate\.weight$")


def tensor_role(name: str) -> tuple[str, int]:
    """(GGUF role, layer or -1) of an HF tensor name (:data:`TENSOR_ROLES`; ``"other"`` when none applies)."""
    m = _LAYER.search(name)
    layer = int(m.group(1)) if m else -1
    n = name.lower()
    if n.endswith("output.weight") and "layers" not in n:  # a checkpoint already in GGUF-like names
        return "output", layer
    for role, parts in TENSOR_ROLES:
        if any(p in n for p in parts):
            return role, layer
    return "other", layer


def never_quantized(name: str) -> bool:
    """An MoE router or shared-expert gate: llama-quantize keeps it F32 whatever the type asked for."""
    return bool(_ROUTERS.search(name))


def is_expert(name: str) -> bool:
    """A routed expert's weight (per-expert ``mlp.experts.<e>.*`` or fused ``mlp.experts.gate_up_proj``), not the
    shared expert's: the GGUF's ``*_exps`` tensors."""
    return ".experts." in name


def moe_counts(cfg: dict) -> tuple[int, int]:
    """(experts per MoE layer, experts per token) of a config.json; (0, 0) for a dense model."""
    n = int(cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts") or 0)
    return (n, int(cfg.get("num_experts_per_tok") or 0)) if n > 1 else (0, 0)


def config_tensors(cfg: dict, dtype_bytes: int) -> list[tuple[str, tuple[int, ...], int]]:
    """The tensors of a Llama-style decoder (Llama, Mistral, Qwen2, Qwen3, ...) from its config: what an index
    without headers stands for. Biases on q/k/v where the config has ``attention_bias`` (or is Qwen2); q/k norms for
    Qwen3; for Qwen's mixtures of experts (``num_experts``, ``moe_intermediate_size``: qwen2_moe, qwen3_moe) a router
    and per-expert gate/up/down in every layer that ``decoder_sparse_step`` and ``mlp_only_layers`` make sparse, plus
    the shared expert and its gate where ``shared_expert_intermediate_size`` is set."""
    h, nl, ff, v = (int(cfg[k]) for k in ("hidden_size", "num_hidden_layers", "intermediate_size", "vocab_size"))
    nh = int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads") or nh)
    hd = int(cfg.get("head_dim") or h // nh)
    mt = str(cfg.get("model_type", ""))
    bias = bool(cfg.get("attention_bias")) or mt in ("qwen2", "qwen2_moe")
    n_exp, _ = moe_counts(cfg)
    eff, sff = int(cfg.get("moe_intermediate_size") or 0), int(cfg.get("shared_expert_intermediate_size") or 0)
    step, dense_layers = int(cfg.get("decoder_sparse_step") or 1), set(cfg.get("mlp_only_layers") or [])
    b = dtype_bytes
    out = [("model.embed_tokens.weight", (v, h), b), ("model.norm.weight", (h,), b)]
    if not cfg.get("tie_word_embeddings"):
        out.append(("lm_head.weight", (v, h), b))
    for i in range(nl):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (nh * hd, h), b), (p + "self_attn.k_proj.weight", (nkv * hd, h), b),
                (p + "self_attn.v_proj.weight", (nkv * hd, h), b), (p + "self_attn.o_proj.weight", (h, nh * hd), b),
                (p + "input_layernorm.weight", (h,), b), (p + "post_attention_layernorm.weight", (h,), b)]
        if n_exp and eff and i not in dense_layers and (i + 1) % step == 0:
            out.append((p + "mlp.gate.weight", (n_exp, h), b))
            for e in range(n_exp):
                q = f"{p}mlp.experts.{e}."
                out += [(q + "gate_proj.weight", (eff, h), b), (q + "up_proj.weight", (eff, h), b),
                        (q + "down_proj.weight", (h, eff), b)]
            if sff:
                q = p + "mlp.shared_expert."
                out += [(q + "gate_proj.weight", (sff, h), b), (q + "up_proj.weight", (sff, h), b),
                        (q + "down_proj.weight", (h, sff), b), (p + "mlp.shared_expert_gate.weight", (1, h), b)]
        else:
            out += [(p + "mlp.gate_proj.weight", (ff, h), b), (p + "mlp.up_proj.weight", (ff, h), b),
                    (p + "mlp.down_proj.weight", (h, ff), b)]
        if mt.startswith("qwen3"):
            out += [(p + "self_attn.q_norm.weight", (hd,), b), (p + "self_attn.k_norm.weight", (hd,), b)]
        if bias:
            out += [(p + "self_attn.q_proj.bias", (nh * hd,), b), (p + "self_attn.k_proj.bias", (nkv * hd,), b),
                    (p + "self_attn.v_proj.bias", (nkv * hd,), b)]
    return out


_PER_EXPERT = re.compile(r"^(.*\.experts\.)(\d+)\.(.+)$")


def merge_experts(tensors: list[tuple[str, tuple[int, ...], int]]) -> list[tuple[str, tuple[int, ...], int]]:
    """Per-expert tensors (``...mlp.experts.<e>.gate_proj.weight``) as the converter writes them: one 3-D tensor per
    layer and weight (``...mlp.experts.gate_proj.weight``, shape (experts, rows, cols)), in the place of expert 0;
    everything else as it is. A 30B-A3B checkpoint has 18,432 expert tensors, its GGUF 144."""
    groups: dict[str, list] = {}
    out: list = []
    for name, shape, b in tensors:
        m = _PER_EXPERT.match(name)
        if not m:
            out.append((name, shape, b))
            continue
        key = m.group(1) + m.group(3)
        if key not in groups:
            groups[key] = [0, tuple(shape), b]
            out.append(key)
        groups[key][0] += 1
    return [(t, (groups[t][0], *groups[t][1]), groups[t][2]) if isinstance(t, str) else t for t in out]


def config_recurrent(cfg: dict, n_layer: int) -> tuple[list[bool], tuple[int, int, int, int]]:
    """(per layer: a recurrent state instead of KV; the state's sizes d_conv, d_inner, n_group, d_state) from a hybrid
    config's ``layer_types`` (``linear_attention``: Qwen3-Next, Qwen3.5), the sizes as the converter writes them
    (conversion/qwen.py:375-379: d_state = linear_key_head_dim, groups = linear_num_key_heads, d_inner =
    linear_value_head_dim x linear_num_value_heads); :func:`pipeline.memory.recurrent_state_bytes` sizes it."""
    types = cfg.get("layer_types") or []
    flags = [(types[i] if i < len(types) else "") == "linear_attention" for i in range(n_layer)]
    g = lambda key, default=0: int(cfg.get(key) or default)  # noqa: E731
    return flags, (g("linear_conv_kernel_dim", 4), g("linear_value_head_dim") * g("linear_num_value_heads"),
                   g("linear_num_key_heads"), g("linear_key_head_dim"))
