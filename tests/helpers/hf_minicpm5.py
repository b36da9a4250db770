"""Generated tiny MiniCPM5 checkpoints in the layout OpenBMB publishes: a main model and a same-vocabulary draft.

MiniCPM5 is a stock ``LlamaForCausalLM`` (``model_type: llama``, no remote code: the OpenBMB/MiniCPM README and
docs/deployment/transformers.md), so the pinned converter takes it through ``LlamaModel`` (conversion/llama.py:17-34;
the tree registers no MiniCPM5 class, conversion/minicpm.py has MiniCPM 1-4 only). The config keys are those of
openbmb/MiniCPM5-1B's config.json (the Hub cannot be read offline: the values were checked against the model card's
parameter counts, 1,080,632,832 in all, 679,552,512 outside the embeddings), scaled down:

- an explicit ``head_dim`` larger than ``hidden_size / num_attention_heads`` (1-B: 128 against 1536 / 16), grouped
  queries 8:1 (16 heads, 2 KV heads), ``intermediate_size`` 3 x hidden, ``rms_norm_eps`` 1e-6, ``rope_theta`` 5e6,
  no rope scaling, untied ``lm_head``, ``max_position_embeddings`` 131072;
- BOS ``<s>``, two EOS ids (``</s>`` and ``<|im_end|>``, 1 and 130073 in the real vocabulary), pad ``</s>``.

The tokenizer: a byte-level BPE ``tokenizer.json`` (no ``tokenizer.model``, as published) with MiniCPM5's
pre-tokenizer: two splits, ``\\p{N}{1,3}`` and then the Llama-3-style pattern, before the byte-level step (the
original regexes that src/llama-vocab.cpp:546-553 quotes for ``LLAMA_VOCAB_PRE_TYPE_MINICPM5``). MiniCPM5's own
130,560-token vocabulary is not available offline; the BPE vocabulary and merges are llama.cpp's vendored
``models/ggml-vocab-qwen2.gguf`` (Qwen2's 151,643 tokens, which hold no multi-digit token, so the digit split changes
no id), with MiniCPM5's special tokens added after them. The converter hashes its check text's ids: on this vocabulary
they are Qwen2's (e636dc30..., conversion/base.py:1759-1761), so the GGUF says ``pre = qwen2``; the real MiniCPM5
tokenizer hashes to 36f3066e... and ``minicpm5`` (conversion/base.py:1921-1923). A recipe of these checkpoints sets
``tokenizer_pre: minicpm5`` (the fix path) to get what the real hash selects; the vendored vocabulary itself (its
``pre`` is ``qwen2``) is the control that shows it matters.

The chat template is the pinned tree's ``models/templates/openbmb-MiniCPM5-1B.jinja`` (ChatML, ``{{- bos_token }}``
first, ``<think>`` blocks, XML tool calls), shipped as ``chat_template.jinja`` as the repository ships it.

torch and tokenizers are imported inside the functions: the unit tier imports the helpers package, never these.
Random weights: acceptance and quality say nothing about the real model."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

# src/llama-vocab.cpp:546-553 of the pinned tree: MiniCPM5's tokenizer.json splits, in order
MINICPM5_SPLITS = (r"\p{N}{1,3}",
                   r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+| ?[^\s\p{L}\p{N}]+[\r\n]*"""
                   r"""|\s*[\r\n]+|\s+(?!\S)|\s+""")
TEMPLATE = "models/templates/openbmb-MiniCPM5-1B.jinja"
SPECIAL = ["<s>", "</s>", "<think>", "</think>"]  # added after Qwen2's <|endoftext|>, <|im_start|>, <|im_end|>

# the published 1B config's keys; the values that set the shape are scaled down per model (MAIN, DRAFT)
PUBLISHED_KEYS = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
                  "rms_norm_eps": 1e-6, "rope_theta": 5000000.0, "rope_scaling": None,
                  "max_position_embeddings": 131072, "tie_word_embeddings": False, "attention_bias": False,
                  "attention_dropout": 0.0, "mlp_bias": False, "initializer_range": 0.02, "pretraining_tp": 1,
                  "use_cache": True, "torch_dtype": "bfloat16"}
MAIN = {"hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 1,
        "head_dim": 32, "intermediate_size": 384}
QK_SCALE, HEAD_SCALE = 4.0, 8.0  # on initializer_range 0.02: attention and output logits of a few units
DRAFT = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1,
         "head_dim": 32, "intermediate_size": 192}


def pinned_tree_file(rel: str) -> bytes:
    """A file of the pinned llama.cpp tree, read from the llama-cpp-python sdist that `make tools` built from."""
    from pipeline.tools import SDIST_FILE, SDIST_NAME, SDIST_SHA256, SDIST_VERSION, cache_root, pip_fetch

    sdist = pip_fetch(SDIST_NAME, SDIST_VERSION, SDIST_FILE, SDIST_SHA256, cache_root() / "downloads", sdist=True)
    with tarfile.open(sdist) as tar:
        for member in tar:
            if member.name.endswith(f"vendor/llama.cpp/{rel}"):
                return tar.extractfile(member).read()
    raise FileNotFoundError(f"{rel} is not in {sdist}")


def write_tokenizer(vocab_gguf: Path, dest: Path, template: str) -> dict:
    """``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json`` and ``chat_template.jinja`` into
    ``dest``; returns {token: id} of the special tokens and the padded vocabulary size."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    from pipeline.gguf import read_header

    h = read_header(vocab_gguf)
    tokens, types, merges = (h.array(k) for k in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
                                                    "tokenizer.ggml.merges"))
    normal = [t for i, t in enumerate(tokens) if types[i] == 1]
    control = [t for i, t in enumerate(tokens) if types[i] == 3]  # <|endoftext|>, <|im_start|>, <|im_end|>
    vocab = {t: i for i, t in enumerate(normal)}
    # ignore_merges: MiniCPM5's BPE looks whole pieces up first (llama.cpp sets it for minicpm5,
    # src/llama-vocab.cpp:2170-2172)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges], fuse_unk=False,
                               byte_fallback=False, ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated", invert=False) for r in MINICPM5_SPLITS]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control + SPECIAL])
    ids = {t: tok.token_to_id(t) for t in control + SPECIAL}
    dest.mkdir(parents=True, exist_ok=True)
    tok.save(str(dest / "tokenizer.json"))
    special = {"bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "</s>", "unk_token": None}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": False, "add_eos_token": False,
              "clean_up_tokenization_spaces": False, "model_max_length": 131072,
              "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<think>", "</think>"], **special}
    (dest / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    (dest / "special_tokens_map.json").write_text(json.dumps(special, indent=2, ensure_ascii=False) + "\n")
    (dest / "chat_template.jinja").write_text(template, encoding="utf-8")
    n = tok.get_vocab_size(with_added_tokens=True)
    return {"ids": ids, "vocab_size": (n + 127) // 128 * 128}  # padded like the real 130,560


def tiny_minicpm5(dest: Path, vocab_gguf: Path, shape: dict = MAIN, architectures: list | None = None,
                  seed: int = 0) -> Path:
    """A random MiniCPM5-layout checkpoint (``shape``: :data:`MAIN` or :data:`DRAFT`) with the tokenizer above;
    ``architectures`` replaces the published ``["LlamaForCausalLM"]`` (a repackaged checkpoint naming a class the
    converter does not register)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tok = write_tokenizer(vocab_gguf, dest, pinned_tree_file(TEMPLATE).decode())
    ids = tok["ids"]
    config = {**PUBLISHED_KEYS, **shape, "vocab_size": tok["vocab_size"], "bos_token_id": ids["<s>"],
              "eos_token_id": [ids["</s>"], ids["<|im_end|>"]], "pad_token_id": ids["</s>"]}
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**{k: v for k, v in config.items() if k not in ("architectures",
                                                                                          "model_type")}))
    with torch.no_grad():  # trained-looking: attention peaked enough that positions (rope) matter, confident logits
        for name, p in model.named_parameters():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                p.mul_(QK_SCALE)
            elif name == "lm_head.weight":
                p.mul_(HEAD_SCALE)
    model.to(torch.bfloat16).save_pretrained(dest, safe_serialization=True)
    # config.json and generation_config.json as published (save_pretrained writes transformers 5's own spelling)
    if architectures is not None:
        config["architectures"] = list(architectures)
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (dest / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<s>"], "eos_token_id": [ids["</s>"], ids["<|im_end|>"]], "pad_token_id": ids["</s>"],
         "do_sample": True, "temperature": 0.6, "top_p": 0.95}, indent=2) + "\n")
    return dest

