"""The AWQ stage's llmcompressor engine: real llm-compressor runs (CPU) on generated Llama, Qwen3 and Qwen3.5 (hybrid
linear/full attention, with an MTP head) checkpoints. On random weights the gain of AWQ means nothing, so these prove
only that the folded weights keep the HF function; the demo's quality table is in docs/calibration.md. The engine
choice and its refusals give one line."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from helpers import CALIB, awq_recipe
from helpers.hf_factory import make_tiny_llama, save_with_trained_norms

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe

AWQ = f"{{calibration: {CALIB}, engine: llmcompressor, n_samples: 4, seq_len: 64, q_group_size: 64}}"


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llmc") / "hf")


def tiny_qwen3(dest: Path, tokenizer_dir: Path) -> Path:
    """A 2-layer Qwen3 (q/k norms, untied head) with random weights; the tiny Llama's tokenizer cuts its text."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    dest.mkdir(parents=True)
    for f in ("tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_dir / f, dest / f)
    cfg = Qwen3Config(vocab_size=768, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=512,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, dtype="float16")
    torch.manual_seed(1)
    save_with_trained_norms(Qwen3ForCausalLM(cfg), dest)
    return dest


def tensors(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def max_rel_logit_diff(a: Path, b: Path, vocab: int) -> float:
    import torch
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([[(7 * i + 3) % vocab for i in range(48)]])
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(str(d), dtype=torch.float32)(ids).logits for d in (a, b)]
    return float((logits[0] - logits[1]).abs().max() / logits[0].abs().max())


@pytest.mark.parametrize("kind,engine", [("llama", "llmcompressor"), ("qwen3", "llmcompressor"), ("qwen3", "autoawq"),
                                         ("qwen3_5", "llmcompressor")])
def test_engines_fold_scales_keeping_the_function(tmp_path, tiny_hf, toolchain, quantize_exe, kind, engine,
                                                   monkeypatch):
    """AutoAWQ on Qwen3 is the control of its third fix-up (pipeline/stages/awq.py, import_awq): without it the run
    fails on transformers 4.56's ``decoder_layer.attention_type``. An in-process llm-compressor run leaves no quiet
    setting behind (a worker's later AutoAWQ build lost its progress bar to TQDM_DISABLE)."""
    from pipeline.stages.awq import run_awq
    from pipeline.stages.awq_llmc import QUIET

    for key in QUIET:
        monkeypatch.delenv(key, raising=False)

    if kind == "llama":
        src, folded = tiny_hf, ("model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
                                "model.layers.1.mlp.up_proj.weight", "model.layers.1.mlp.down_proj.weight")
    elif kind == "qwen3":
        src = tiny_qwen3(tmp_path / "qwen3", tiny_hf)
        folded = ("model.layers.0.input_layernorm.weight", "model.layers.1.mlp.gate_proj.weight")
    else:
        from helpers.hf_qwen35 import tiny_qwen35

        src = tiny_qwen35(tmp_path / "qwen35", toolchain.root / "vocab" / "ggml-vocab-qwen35.gguf")
        # a full-attention layer (3) and a linear-attention one (0): both kinds of block are mapped
        folded = ("model.language_model.layers.3.self_attn.q_proj.weight",
                  "model.language_model.layers.0.mlp.down_proj.weight")
    awq = AWQ if engine == "llmcompressor" else AWQ.replace("llmcompressor", "autoawq").replace("}", ", apply_clip: false}")
    if kind == "qwen3_5":  # no engine named: the stage picks llm-compressor (AutoAWQ lacks qwen3_5) and records it
        awq = awq.replace("engine: llmcompressor, ", "")
    r = load_recipe(awq_recipe(tmp_path, src, awq), quantize_exe)
    out = tmp_path / "hf-awq"
    rec = run_awq(r, src, out, tmp_path / "awq.json", threads=2)
    assert not set(QUIET) & set(os.environ)
    assert rec["engine"] == engine and bool(rec.get("llmcompressor")) == (engine == "llmcompressor")
    assert rec["params"]["engine"] == engine and rec["params"]["apply_clip"] is False
    assert json.loads((out / "config.json").read_text()) == json.loads((src / "config.json").read_text())
    before, after = tensors(src), tensors(out)
    assert before.keys() == after.keys()  # the source's names, MTP and vision tensors included
    changed = {k for k in before if not before[k].to(after[k].dtype).equal(after[k])}
    assert set(folded) <= changed, sorted(set(folded) - changed)
    if kind == "qwen3_5":
        # the MTP head and the vision tower are outside the text model: kept as they were, and the record says so
        assert rec["kept_from_source"] == ["model.visual.*", "mtp.*"]
        assert not any(k.startswith("mtp.") for k in changed)
    vocab = json.loads((src / "config.json").read_text()).get("vocab_size") or 151936
    rel = max_rel_logit_diff(src, out, vocab)
    assert rel < 0.01, f"scaling changed the function: max rel. logit diff {rel:.4f}"


def test_llmcompressor_output_converts_and_runs(tmp_path, tiny_hf, quantize_exe):
    """The folded Llama converts and quantizes like any checkpoint, and llama.cpp runs it."""
    from pipeline.gguf import read_facts
    from pipeline.stages.awq import run_awq
    from pipeline.stages.convert import convert
    from pipeline.stages.quantize import quantize

    r = load_recipe(awq_recipe(tmp_path, tiny_hf, AWQ), quantize_exe)
    run_awq(r, tiny_hf, tmp_path / "hf-awq", tmp_path / "awq.json", threads=2)
    f16 = tmp_path / "tiny-F16.gguf"
    convert(r, tmp_path / "hf-awq", f16, tmp_path / "convert.json", log=tmp_path / "convert.log")
    q = tmp_path / "tiny-Q8_0.gguf"
    quantize(r, "Q8_0", f16, q, tmp_path / "q.json", log=tmp_path / "q.log")
    assert read_facts(q).quant_type == "Q8_0"


@pytest.mark.parametrize("case", ["neither maps", "autoawq asked, qwen3_5", "llmcompressor asked, unmapped",
                                  "clip on a model only llmcompressor maps"])
def test_engine_refusals_one_line(tmp_path, tiny_hf, quantize_exe, case, monkeypatch):
    from pipeline.stages.awq import run_awq
    from pipeline.stages.awq_llmc import QUIET

    for key in QUIET:  # llm-compressor's quiet settings must not outlive its import (AutoAWQ's bars vanished)
        monkeypatch.delenv(key, raising=False)

    arch, model_type, awq, expected = {
        "neither maps": ("GPT2LMHeadModel", "gpt2", "{calibration: CAL}",
                         "awq: neither engine (autoawq, llmcompressor) maps architecture GPT2LMHeadModel (model_type "
                         "'gpt2')"),
        "autoawq asked, qwen3_5": ("Qwen3_5ForConditionalGeneration", "qwen3_5", "{calibration: CAL, engine: autoawq}",
                                   "awq: architecture Qwen3_5ForConditionalGeneration (model_type 'qwen3_5') is not "
                                   "supported by AutoAWQ 0.2.9"),
        "llmcompressor asked, unmapped": ("GPT2LMHeadModel", "gpt2", "{calibration: CAL, engine: llmcompressor}",
                                          "awq: engine llmcompressor maps architecture GPT2LMHeadModel"),
        "clip on a model only llmcompressor maps": ("Qwen3_5ForConditionalGeneration", "qwen3_5",
                                                    "{calibration: CAL, apply_clip: true}",
                                                    "awq: apply_clip: llm-compressor has no clipping search"),
    }[case]
    src = tmp_path / "src"
    shutil.copytree(tiny_hf, src)
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "architectures": [arch], "model_type": model_type}))
    r = load_recipe(awq_recipe(tmp_path, src, awq.replace("CAL", str(CALIB))), quantize_exe)
    with pytest.raises(PipelineError) as exc:
        run_awq(r, src, tmp_path / "out", tmp_path / "awq.json")
    msg = str(exc.value)
    assert "\n" not in msg and expected in msg, msg
    assert not (tmp_path / "out").exists() and not (tmp_path / "awq.json").exists()
    assert not set(QUIET) & set(os.environ)

