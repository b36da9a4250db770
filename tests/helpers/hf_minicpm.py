"""Generated tiny MiniCPM checkpoints (``MiniCPMForCausalLM``, llama.cpp's ``minicpm`` architecture): a main model
and a smaller draft that share one real tokenizer, for the speculative-decoding pair of tests/e2e/test_minicpm_pair.py.

Random weights, real config keys of MiniCPM (1/2/4) scaled down:

- ``scale_emb``, ``scale_depth`` and ``dim_model_base``: the converter turns them into ``minicpm.embedding_scale``,
  ``minicpm.residual_scale`` (= scale_depth / sqrt(num_hidden_layers)) and ``minicpm.logit_scale``
  (= hidden_size / dim_model_base), conversion/minicpm.py:21-31 of the pinned tree; llama.cpp's defaults when a GGUF
  lacks them are the MiniCPM-2B values 12, 1.4 / sqrt(n_layer), 256 / n_embd (src/models/minicpm.cpp:4-14). The
  main keeps 12 and 1.4 and scales ``dim_model_base`` with the width (logit scale 8, MiniCPM-2B's is 2304/256 = 9).
- heads: grouped-query attention (the converter un-permutes q with n_head and k with n_kv_head,
  conversion/minicpm.py:51-61), head size 64.
- rope: the main has MiniCPM4-style ``longrope`` (``rope_scaling`` with ``long_factor`` / ``short_factor`` of
  head_dim / 2 entries each and ``original_max_position_embeddings``): the converter writes them as
  ``rope_factors_long`` / ``rope_factors_short`` (conversion/minicpm.py:33-46) and llama.cpp loads them when the
  scaling type is LONGROPE (src/models/minicpm.cpp:53-59); the draft has plain rope (``rope_scaling: null``,
  MiniCPM-2B / 1B style).
- embeddings: the main has its own ``lm_head``, the draft ties it to the token embedding (no ``lm_head`` tensor;
  llama.cpp duplicates ``token_embd`` as the output, src/models/minicpm.cpp:33-38).
- ``auto_map``: the real repositories ship remote code (configuration_minicpm.py / modeling_minicpm.py), so the
  fetch stage asks for ``source.trust_remote_code: true``; these folders carry the key and no code file.

The tokenizer: Mistral 7B v0.1's SentencePiece model (32000 tokens, byte-fallback BPE; BOS 1, EOS 2, UNK 0) from the
``mistral-common`` wheel on PyPI, as transformers' ``LlamaTokenizer`` (legacy, add BOS). MiniCPM 1/2 ship the same
family: a ``LlamaTokenizer`` over a SentencePiece BPE ``tokenizer.model`` with byte fallback (122753 tokens in
MiniCPM-2B), and the converter reads only that file (``MiniCPMModel.set_vocab`` -> ``_set_vocab_sentencepiece``,
conversion/minicpm.py:48-49, conversion/base.py:2081-2099). The chat template is the one llama.cpp's built-in MiniCPM
format renders (``<用户>`` user ``<AI>``, src/llama-chat.cpp:180-182, 521-532), led by ``{{ bos_token }}``.

torch and safetensors are imported inside the functions: the unit tier imports the helpers package, never these."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

# Mistral's SentencePiece tokenizer from a registry package (the same wheel as tests/integration/test_conformance_checks.py)
MISTRAL_COMMON = ("mistral-common", "1.13.1", "mistral_common-1.13.1-py3-none-any.whl",
                  "98b4d0755b8d90bf4691fa8f1b70cb3b4a8cd4dc1653c4ed08ef3d1c7d2c29af")
MISTRAL_V1 = "mistral_common/data/tokenizer.model.v1"  # Mistral 7B v0.1, 32000 tokens
N_VOCAB = 32000

# MiniCPM 1/2's format, as llama.cpp's built-in MiniCPM format renders it (src/llama-chat.cpp:521-532): user turns as
# <用户>{content}<AI>, every other message as its stripped content; led by the BOS text, as MiniCPM5-1B's vendored
# template is (models/templates/openbmb-MiniCPM5-1B.jinja:1), so that HF's chat path has the BOS llama.cpp adds
# (without it the conformance stage's chat-template check fails: "llama.cpp adds BOS 1 where HF has none")
CHAT_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                 "{{ '<用户>' + message['content'].strip() + '<AI>' }}"
                 "{% else %}{{ message['content'].strip() }}{% endif %}{% endfor %}")

AUTO_MAP = {"AutoConfig": "configuration_minicpm.MiniCPMConfig", "AutoModel": "modeling_minicpm.MiniCPMModel",
            "AutoModelForCausalLM": "modeling_minicpm.MiniCPMForCausalLM"}

# The pair: hidden sizes multiples of 256 in the main (k-quants need 256-wide rows), the draft narrower and shallower
MAIN = {"hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 640, "dim_model_base": 32, "tie_word_embeddings": False, "longrope": True}
DRAFT = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
         "intermediate_size": 320, "dim_model_base": 16, "tie_word_embeddings": True, "longrope": False}


def minicpm_config(spec: dict, vocab_size: int = N_VOCAB) -> dict:
    """The config.json of a MiniCPMForCausalLM checkpoint with the shapes of ``spec`` (MAIN or DRAFT)."""
    head_dim = spec["hidden_size"] // spec["num_attention_heads"]
    cfg = {
        "architectures": ["MiniCPMForCausalLM"], "auto_map": AUTO_MAP, "model_type": "minicpm",
        "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "initializer_range": 0.1,
        "hidden_size": spec["hidden_size"], "intermediate_size": spec["intermediate_size"],
        "num_hidden_layers": spec["num_hidden_layers"], "num_attention_heads": spec["num_attention_heads"],
        "num_key_value_heads": spec["num_key_value_heads"], "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "rope_scaling": None,
        "scale_emb": 12, "scale_depth": 1.4, "dim_model_base": spec["dim_model_base"],
        "tie_word_embeddings": spec["tie_word_embeddings"], "torch_dtype": "bfloat16", "use_cache": True,
        "vocab_size": vocab_size,
    }
    if spec["longrope"]:  # MiniCPM4's shape of it: factors per rotary pair, the pre-training context
        n = head_dim // 2
        cfg["max_position_embeddings"] = 8192
        cfg["rope_scaling"] = {"rope_type": "longrope", "original_max_position_embeddings": 4096,
                               "long_factor": [round(1.0 + 0.05 * i, 4) for i in range(n)],
                               "short_factor": [round(1.0 + 0.01 * i, 4) for i in range(n)]}
    return cfg


def mistral_tokenizer_model(dest: Path) -> Path:
    """Mistral 7B v0.1's tokenizer.model, extracted from the pinned mistral-common wheel (pip's cache)."""
    from pipeline.tools import cache_root, pip_fetch

    wheel = pip_fetch(*MISTRAL_COMMON, cache_root() / "downloads")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheel) as zf:
        dest.write_bytes(zf.read(MISTRAL_V1))
    return dest


def write_tokenizer(dest: Path, sp_model: Path) -> None:
    """The HF tokenizer files of a MiniCPM 1/2 repository: ``tokenizer.model`` with a LlamaTokenizer
    ``tokenizer_config.json`` (chat template inside, as those repositories have it) and ``special_tokens_map.json``."""
    from helpers.hf_factory import spm_tokenizer_folder

    tok = spm_tokenizer_folder(dest, sp_model, {"chat_template": CHAT_TEMPLATE})
    assert tok.vocab_size == N_VOCAB, tok.vocab_size


def make_tiny_minicpm(dest: Path, spec: dict, sp_model: Path, seed: int = 0) -> Path:
    """A random MiniCPMForCausalLM folder at ``dest`` (safetensors, bfloat16 like the real checkpoints): config.json,
    generation_config.json, the tokenizer files and model.safetensors."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    write_tokenizer(dest, sp_model)
    cfg = minicpm_config(spec)
    (dest / "config.json").write_text(json.dumps(cfg, indent=2))
    (dest / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                             "do_sample": True, "top_p": 0.8, "temperature": 0.8}))
    H, FF, V = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    HD = H // cfg["num_attention_heads"]
    KV = cfg["num_key_value_heads"] * HD
    g = torch.Generator().manual_seed(seed)

    std = cfg["initializer_range"]  # MiniCPM's own init scale (0.1)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16).contiguous()

    def norm(n):  # trained-looking RMS norm weights, not all ones
        return (torch.rand(n, generator=g) + 0.5).to(torch.bfloat16)

    t = {"model.embed_tokens.weight": rnd(V, H), "model.norm.weight": norm(H)}
    if not cfg["tie_word_embeddings"]:
        t["lm_head.weight"] = rnd(V, H)
    for b in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = norm(H)
        t[p + "post_attention_layernorm.weight"] = norm(H)
        t[p + "self_attn.q_proj.weight"] = rnd(H, H)
        t[p + "self_attn.k_proj.weight"] = rnd(KV, H)
        t[p + "self_attn.v_proj.weight"] = rnd(KV, H)
        t[p + "self_attn.o_proj.weight"] = rnd(H, H)
        t[p + "mlp.gate_proj.weight"] = rnd(FF, H)
        t[p + "mlp.up_proj.weight"] = rnd(FF, H)
        t[p + "mlp.down_proj.weight"] = rnd(H, FF)
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def make_minicpm_pair(folder: Path) -> tuple[Path, Path]:
    """The main and the draft in ``folder`` (``main/``, ``draft/``), one tokenizer: (main, draft)."""
    sp = mistral_tokenizer_model(folder / "tokenizer" / "tokenizer.model")
    return make_tiny_minicpm(folder / "main", MAIN, sp, seed=0), make_tiny_minicpm(folder / "draft", DRAFT, sp, seed=1)
