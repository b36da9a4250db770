"""The hyperparameter check (pipeline/stages/conformance/hparams.py) on generated configs: transformers' own
(LlamaConfig.save_pretrained) and raw config.json files of architectures this transformers does not know
(rope parameters per layer type, a ``text_config``); GGUF metadata as pipeline.gguf.read_header returns it."""

from __future__ import annotations

import json

import pytest

from pipeline.stages.conformance.hparams import REL_TOL, check_hparams, hf_config


def _llama(tmp_path, **kw):
    from transformers import LlamaConfig

    LlamaConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, rope_theta=500000.0,
                rms_norm_eps=1e-5, max_position_embeddings=2048, **kw).save_pretrained(tmp_path)
    return tmp_path


def _md(arch="llama", **kv):
    base = {"rope.freq_base": 500000.0, "attention.layer_norm_rms_epsilon": 9.999999747378752e-06,  # float32(1e-5)
            "attention.head_count": 4, "attention.head_count_kv": 2, "embedding_length": 64, "context_length": 2048}
    base.update(kv)
    return {"general.architecture": arch, **{f"{arch}.{k}": v for k, v in base.items() if v is not None}}


def test_float32_storage_is_equal_and_a_scaled_rope_base_is_not(tmp_path):
    hf = _llama(tmp_path)
    ok = check_hparams("r", _md(), hf)
    assert ok["passed"] and ok["source"] == "transformers" and len(ok["compared"]) == 6, ok
    assert max(r["relative_difference"] for r in ok["compared"]) < REL_TOL / 10  # float32 rounding: 2.5e-8
    bad = check_hparams("r", _md(**{"rope.freq_base": 550000.0}), hf)
    assert not bad["passed"] and bad["failures"] == [
        "conformance: recipe r: hyperparameters: llama.rope.freq_base = 550000 in the GGUF, rope_parameters.rope_theta = 500000 in "
        "the HF config (relative difference 0.1, tolerance 1e-06)"]


@pytest.mark.parametrize("key,value", [("attention.head_count", 8), ("attention.head_count_kv", 4),
                                       ("attention.layer_norm_rms_epsilon", 1e-6), ("embedding_length", 128)])
def test_each_key_that_changes_the_computation_fails(tmp_path, key, value):
    rec = check_hparams("r", _md(**{key: value}), _llama(tmp_path))
    assert not rec["passed"] and len(rec["failures"]) == 1 and f"llama.{key} = " in rec["failures"][0], rec


def test_context_length_is_a_warning_and_missing_keys_are_listed(tmp_path):
    rec = check_hparams("r", _md(**{"context_length": 4096, "rope.freq_base": None}), _llama(tmp_path))
    assert rec["passed"] and len(rec["warnings"]) == 1 and "llama.context_length = 4096" in rec["warnings"][0]
    assert {"key": "llama.rope.freq_base", "hf": "rope_parameters.rope_theta", "why": "not in the GGUF"} in rec["not_compared"]


def test_linear_rope_scaling_factor(tmp_path):
    hf = _llama(tmp_path, rope_scaling={"rope_type": "linear", "factor": 4.0})
    assert check_hparams("r", _md(**{"rope.scaling.factor": 4.0}), hf)["passed"]
    rec = check_hparams("r", _md(**{"rope.scaling.factor": 2.0}), hf)
    assert not rec["passed"] and "llama.rope.scaling.factor = 2 in the GGUF, rope_parameters.factor = 4" in rec["failures"][0]


def test_unknown_architecture_reads_config_json_per_layer_type_and_text_config(tmp_path):
    cfg = {"model_type": "not-a-transformers-model", "architectures": ["X"],
           "text_config": {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
                           "rope_parameters": {"full_attention": {"rope_theta": 1e6, "rope_type": "default"},
                                               "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}}}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert hf_config(tmp_path)[1] == "config.json"
    md = {"general.architecture": "x", "x.rope.freq_base": 1e6, "x.rope.freq_base_swa": 1e4,
          "x.attention.head_count": 4, "x.attention.head_count_kv": [1, 0, 1, 0], "x.embedding_length": 64}
    rec = check_hparams("r", md, tmp_path)
    assert rec["passed"] and {r["key"] for r in rec["compared"]} == {
        "x.rope.freq_base", "x.rope.freq_base_swa", "x.attention.head_count", "x.embedding_length"}, rec
    assert {"key": "x.attention.head_count_kv", "hf": "num_key_value_heads",
            "why": "per-layer array in the GGUF"} in rec["not_compared"]
    md["x.rope.freq_base_swa"] = 1e5
    rec = check_hparams("r", md, tmp_path)
    assert not rec["passed"] and "rope_parameters.rope_theta = 10000" in rec["failures"][0], rec


def test_minicpm_scales(tmp_path):
    """MiniCPM's embedding, residual and logit scales, derived as its modeling code does (config.json: transformers
    4.56 has no MiniCPM class); a residual scale computed without the square root fails."""
    cfg = {"model_type": "minicpm", "architectures": ["MiniCPMForCausalLM"], "hidden_size": 256,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 4, "scale_emb": 12,
           "scale_depth": 1.4, "dim_model_base": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    md = {"general.architecture": "minicpm", "minicpm.embedding_scale": 12.0, "minicpm.residual_scale": 0.7,
          "minicpm.logit_scale": 8.0, "minicpm.embedding_length": 256, "minicpm.attention.head_count": 4,
          "minicpm.attention.head_count_kv": 2, "minicpm.rope.freq_base": 10000.0,
          "minicpm.attention.layer_norm_rms_epsilon": 9.999999747378752e-06}
    rec = check_hparams("r", md, tmp_path)
    assert rec["passed"] and len(rec["compared"]) == 8, rec
    md["minicpm.residual_scale"] = 1.4 / 4
    rec = check_hparams("r", md, tmp_path)
    assert rec["failures"] == ["conformance: recipe r: hyperparameters: minicpm.residual_scale = 0.35 in the GGUF, "
                               "scale_depth / sqrt(num_hidden_layers) = 0.7 in the HF config (relative difference 0.5, "
                               "tolerance 1e-06)"], rec
