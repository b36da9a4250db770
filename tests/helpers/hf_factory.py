"""Generated tiny Hugging Face checkpoints with real tokenizers: a Llama (SentencePiece BPE trained on real
text) and a GLM-4.5-style MoE with NextN/MTP layers (the demo's SmolLM2 tokenizer). torch, transformers and
sentencepiece are imported inside the functions: the unit tier imports the helpers package, never these."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from . import CALIB

GLM_SPECIAL = ["[gMASK]", "<|user|>", "<|observation|>"]  # <|endoftext|> is in the SmolLM2 vocab already

def spm_tokenizer_folder(dest: Path, sp_model: Path | bytes, extra_config: dict | None = None):
    """``tokenizer.model`` and a LlamaTokenizer ``tokenizer_config.json`` (legacy, BOS added) in ``dest``, as
    Llama-2-era repositories ship them; returns transformers' tokenizer of the folder. Both the build environment's
    transformers 5 and the autoawq environment's 4.56 read these files (each one's own tokenizer.json would not load
    in the other, and transformers 5's ``LlamaTokenizer(vocab_file=...)`` no longer reads the model file)."""
    from transformers import AutoTokenizer

    dest.mkdir(parents=True, exist_ok=True)
    (dest / "tokenizer.model").write_bytes(sp_model if isinstance(sp_model, bytes) else Path(sp_model).read_bytes())
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (dest / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizer", "add_bos_token": True, "add_eos_token": False, "legacy": True,
         "clean_up_tokenization_spaces": False, **special, **(extra_config or {})}, indent=2, ensure_ascii=False)
        + "\n", encoding="utf-8")
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return AutoTokenizer.from_pretrained(dest)


def make_tiny_llama(dest: Path, intermediate: int = 512) -> Path:
    """A 2-layer Llama (hidden 256, 4 heads, 1 KV head of 64: every AWQ-clipped linear has a multiple of
    64 output features; tied embeddings like SmolLM2) with random weights and a byte-fallback BPE
    SentencePiece tokenizer."""
    import sentencepiece as spm
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest.mkdir(parents=True)
    spm.SentencePieceTrainer.train(
        input=str(CALIB), model_prefix=str(dest / "spm"), vocab_size=768, model_type="bpe", byte_fallback=True,
        character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, num_threads=1, minloglevel=2,
        input_sentence_size=20000, shuffle_input_sentence=False)
    tok = spm_tokenizer_folder(dest, (dest / "spm.model").read_bytes())
    for f in ("spm.model", "spm.vocab"):
        (dest / f).unlink()
    cfg = LlamaConfig(vocab_size=tok.vocab_size, hidden_size=256, intermediate_size=intermediate, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=1, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    torch.manual_seed(0)
    save_with_trained_norms(LlamaForCausalLM(cfg), dest)
    return dest


def save_with_trained_norms(model, dest: Path, suffix: str = "layernorm.weight") -> None:
    """``model`` in float16 into ``dest``, its norms (parameters ending in ``suffix``) drawn from U(0.5, 1.5) first:
    trained-looking, not all ones, so that scales folded into them show."""
    import torch

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(suffix):
                p.uniform_(0.5, 1.5)
    model.half().save_pretrained(dest, safe_serialization=True)


def tiny_glm4_moe(dest, tokenizer_dir, n_layer: int = 2, nextn_layers: int = 1, seed: int = 0):
    """A random Glm4MoeForCausalLM checkpoint (safetensors): layer 0 dense, the others (MTP layers
    included) MoE with 4 routed experts and a shared one; hidden size 64."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    tok = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    n_tok = len(tok["model"]["vocab"])
    assert all(t["id"] < n_tok for t in tok["added_tokens"])
    tok["added_tokens"] += [{"id": n_tok + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": True} for i, t in enumerate(GLM_SPECIAL)]
    (dest / "tokenizer.json").write_text(json.dumps(tok))
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, dest / name)
    vocab = (n_tok + len(GLM_SPECIAL) + 7) // 8 * 8
    H, NH, KV, HD, FF, E, FFE = 64, 4, 2, 16, 128, 4, 32
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "vocab_size": vocab, "hidden_size": H,
        "num_hidden_layers": n_layer, "num_nextn_predict_layers": nextn_layers, "num_attention_heads": NH,
        "num_key_value_heads": KV, "head_dim": HD, "intermediate_size": FF, "moe_intermediate_size": FFE,
        "n_routed_experts": E, "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
        "routed_scaling_factor": 1.0, "norm_topk_prob": True, "partial_rotary_factor": 0.5, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 4096, "attention_bias": True, "use_qk_norm": False,
        "tie_word_embeddings": False, "n_group": 1, "topk_group": 1, "torch_dtype": "float32",
        "bos_token_id": 1, "eos_token_id": 2}))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return (torch.randn(*shape, generator=g) * 0.05).contiguous()

    t = {"model.embed_tokens.weight": rnd(vocab, H), "model.norm.weight": torch.ones(H), "lm_head.weight": rnd(vocab, H)}
    for b in range(n_layer + nextn_layers):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = torch.ones(H)
        t[p + "post_attention_layernorm.weight"] = torch.ones(H)
        for proj, rows in (("q", NH * HD), ("k", KV * HD), ("v", KV * HD)):
            t[p + f"self_attn.{proj}_proj.weight"] = rnd(rows, H)
            t[p + f"self_attn.{proj}_proj.bias"] = rnd(rows)
        t[p + "self_attn.o_proj.weight"] = rnd(H, NH * HD)
        mlps = {"mlp.": FF} if b == 0 else {**{f"mlp.experts.{e}.": FFE for e in range(E)}, "mlp.shared_experts.": FFE}
        for q, ff in mlps.items():
            t[p + q + "gate_proj.weight"], t[p + q + "up_proj.weight"] = rnd(ff, H), rnd(ff, H)
            t[p + q + "down_proj.weight"] = rnd(H, ff)
        if b > 0:
            t[p + "mlp.gate.weight"] = rnd(E, H)
            t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(E)
        if b >= n_layer:  # the NextN/MTP layer's own tensors
            t[p + "eh_proj.weight"] = rnd(H, 2 * H)
            for norm in ("enorm", "hnorm", "shared_head.norm"):
                t[p + f"{norm}.weight"] = torch.ones(H)
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest




def tiny_qwen3_moe(dest, tokenizer_dir, n_layer: int = 2, n_expert: int = 16, top_k: int = 2, seed: int = 0,
                   expert_width: int = 256):
    """A random Qwen3MoeForCausalLM checkpoint (issue #31; transformers' ``qwen3_moe``, the converter's
    ``Qwen3MoeModel``: conversion/qwen.py:258): every layer MoE with ``n_expert`` routed experts, ``top_k`` per token,
    no shared expert; hidden and expert widths 256 (K/IQ types need rows of 256: no fallback); q/k norms. The router
    rows are scaled up (std 1 instead of 0.05), so its top-k is far from a tie and F16 rounding does not flip
    experts. ``expert_width``: another width makes the K/IQ types fall back on ``ffn_down_exps``. Tokenizer:
    ``tokenizer_dir``'s (the demo's SmolLM2, 49,152 tokens)."""
    import torch
    from safetensors.torch import save_file

    dest.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / name, dest / name)
    n_tok = len(json.loads((tokenizer_dir / "tokenizer.json").read_text())["model"]["vocab"])
    H, NH, KV, HD, FFE = 256, 4, 2, 64, expert_width
    (dest / "config.json").write_text(json.dumps({
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": n_tok, "hidden_size": H,
        "num_hidden_layers": n_layer, "num_attention_heads": NH, "num_key_value_heads": KV, "head_dim": HD,
        "intermediate_size": 4 * H, "moe_intermediate_size": FFE, "num_experts": n_expert, "num_experts_per_tok": top_k,
        "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True, "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6, "max_position_embeddings": 4096, "tie_word_embeddings": False, "attention_bias": False,
        "torch_dtype": "float16", "bos_token_id": 1, "eos_token_id": 2}))
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, std=0.05):
        return (torch.randn(*shape, generator=g) * std).half().contiguous()

    t = {"model.embed_tokens.weight": rnd(n_tok, H, std=1.0), "model.norm.weight": torch.ones(H).half(),
         "lm_head.weight": rnd(n_tok, H)}
    for b in range(n_layer):
        p = f"model.layers.{b}."
        t[p + "input_layernorm.weight"] = t[p + "post_attention_layernorm.weight"] = torch.ones(H).half()
        t[p + "self_attn.q_norm.weight"] = t[p + "self_attn.k_norm.weight"] = torch.ones(HD).half()
        for proj, rows in (("q", NH * HD), ("k", KV * HD), ("v", KV * HD)):
            t[p + f"self_attn.{proj}_proj.weight"] = rnd(rows, H)
        t[p + "self_attn.o_proj.weight"] = rnd(H, NH * HD)
        t[p + "mlp.gate.weight"] = rnd(n_expert, H, std=1.0)
        for e in range(n_expert):
            q = f"{p}mlp.experts.{e}."
            t[q + "gate_proj.weight"], t[q + "up_proj.weight"] = rnd(FFE, H), rnd(FFE, H)
            t[q + "down_proj.weight"] = rnd(H, FFE)
    t = {k: v.clone() for k, v in t.items()}  # shared norms saved as separate tensors
    save_file(t, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def make_echo_pair(dest: Path, main_shape: tuple[int, int] = (512, 8), draft_shape: tuple[int, int] = (128, 1)):
    """(main, draft): two Llama checkpoints sharing make_tiny_llama's tokenizer that both repeat their input token, a
    heavy main (``(hidden, layers)``) and a light draft. Each layer's output projections are zero, so the residual
    stream stays the token's embedding and the tied output head scores that token highest (random rows of width 128
    and up: a row's product with itself is about its width, with another about its square root). Structured, not
    trained: every drafted token is accepted, and the main still computes every layer, so a clock sees what an
    accepted draft is worth."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok_src = make_tiny_llama(dest / "tok")
    out = []
    for name, (hidden, layers) in (("main", main_shape), ("draft", draft_shape)):
        folder = dest / name
        folder.mkdir(parents=True)
        for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
            shutil.copyfile(tok_src / f, folder / f)
        cfg = LlamaConfig(vocab_size=json.loads((tok_src / "config.json").read_text())["vocab_size"],
                          hidden_size=hidden, intermediate_size=3 * hidden, num_hidden_layers=layers,
                          num_attention_heads=hidden // 64, num_key_value_heads=1, head_dim=64,
                          max_position_embeddings=4096, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2)
        torch.manual_seed(len(out))
        model = LlamaForCausalLM(cfg)
        with torch.no_grad():
            model.model.embed_tokens.weight.normal_(0.0, 1.0)
            for p_name, p in model.named_parameters():
                if p_name.endswith(("o_proj.weight", "down_proj.weight")):
                    p.zero_()
        model.half().save_pretrained(folder, safe_serialization=True)
        out.append(folder)
    return tuple(out)


def make_tiny_phi3_longrope(dest: Path, tokenizer_dir: Path, init: float = 0.1, seed: int = 0) -> Path:
    """A 2-layer Phi-3-style model with LongRoPE: trained context 2048, original 512, short factors near 1 and long
    ones up to 16.5 (Phi-3-mini-128k's shape, scaled down); the SentencePiece tokenizer of ``tokenizer_dir`` (a
    make_tiny_llama folder). Random weights drawn wider than the default (``init``) so that the logits are peaked
    enough for a rope error to show in top-1 agreement and KLD."""
    import torch
    from transformers import Phi3Config, Phi3ForCausalLM

    dest.mkdir(parents=True)
    for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(Path(tokenizer_dir) / f, dest / f)
    half = 32  # head size 64
    cfg = Phi3Config(vocab_size=768, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=4, max_position_embeddings=2048, original_max_position_embeddings=512,
                     rope_scaling={"rope_type": "longrope", "short_factor": [1.0 + 0.05 * i for i in range(half)],
                                   "long_factor": [1.0 + 0.5 * i for i in range(half)]},
                     initializer_range=init, bos_token_id=1, eos_token_id=2, pad_token_id=0, sliding_window=None,
                     tie_word_embeddings=False)
    torch.manual_seed(seed)
    save_with_trained_norms(Phi3ForCausalLM(cfg), dest, suffix="layernorm.weight")
    return dest
