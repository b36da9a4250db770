"""The AWQ stage: a real AutoAWQ run (CPU) on a tiny Llama generated here, with a SentencePiece
tokenizer trained here on real text; its output converts and quantizes; bad inputs give one line."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from helpers import CALIB, ROOT, awq_recipe
from helpers.hf_factory import make_tiny_llama

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-awq") / "hf")


def weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(f))
    return out


def test_awq_folds_scales_and_converts(tmp_path, tiny_hf, quantize_exe):
    """Scale search only (no clipping): weights change, the function does not; the folder is a clean
    HF checkpoint (no quantization_config, tokenizer present) that converts and quantizes."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipeline.gguf import read_facts
    from pipeline.stages.awq import run_awq
    from pipeline.stages.convert import convert
    from pipeline.stages.quantize import quantize

    r = load_recipe(awq_recipe(tmp_path, tiny_hf, f"{{calibration: {CALIB}, n_samples: 8, seq_len: 64, "
                                                  "q_group_size: 64, apply_clip: false}"), quantize_exe)
    out = tmp_path / "hf-awq"
    rec = run_awq(r, tiny_hf, out, tmp_path / "awq.json", threads=2)
    assert rec["device"] == "cpu" and rec["params"]["n_samples"] == 8 and len(rec["calibration_sha256"]) == 64
    assert rec["engine"] == "autoawq" and rec["params"]["engine"] == "autoawq"  # chosen: AutoAWQ maps llama
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in cfg and cfg == json.loads((tiny_hf / "config.json").read_text())
    assert (out / "tokenizer.model").read_bytes() == (tiny_hf / "tokenizer.model").read_bytes()
    assert (out / "tokenizer_config.json").is_file() and not list(out.glob(".*tmp*"))

    before, after = weights(tiny_hf), weights(out)
    assert before.keys() == after.keys()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    # scales folded: each norm and the projections after it, v into o, up into down
    for k in ("model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
              "model.layers.1.post_attention_layernorm.weight", "model.layers.1.mlp.down_proj.weight",
              "model.layers.1.mlp.up_proj.weight"):
        assert k in changed, k
    # the tied embedding keeps its source name (a GGUF without token_embd would not load)
    assert after["model.embed_tokens.weight"].equal(before["model.embed_tokens.weight"])
    assert "lm_head.weight" not in after

    ids = torch.tensor([list(range(3, 67))])
    logits = [AutoModelForCausalLM.from_pretrained(d, torch_dtype=torch.float32)(ids).logits for d in (tiny_hf, out)]
    rel = (logits[0] - logits[1]).abs().max() / logits[0].abs().max()
    assert rel < 0.01, f"scaling changed the function: max rel. logit diff {rel:.4f}"

    f16 = tmp_path / "tiny-F16.gguf"
    convert(r, out, f16, tmp_path / "convert.json", log=tmp_path / "convert.log")
    q = tmp_path / "tiny-Q8_0.gguf"
    quantize(r, "Q8_0", f16, q, tmp_path / "q.json", log=tmp_path / "q.log")
    assert read_facts(f16).quant_type == "F16" and read_facts(q).quant_type == "Q8_0"
    # and llama.cpp loads and runs it
    from pipeline.tools import find_toolchain, run_tool

    res = run_tool(find_toolchain(), "llama-perplexity", ["-m", q, "-f", CALIB, "-c", "64", "--chunks", "2", "-t", "2"],
                   None)
    assert re.search(r"\[1\]\d+\.\d+", res.output), res.output[-2000:]  # a perplexity from the model's logits


def test_calibration_reproducible_at_fixed_threads(tmp_path, tiny_hf, quantize_exe):
    """Two processes at the same settings (2 threads, the workflow's calib_threads) give bit-identical AWQ
    weights (scale search) and a bit-identical importance matrix: one AWQ run from here, one
    through `ggufpipe stage awq` in a new process (each starts its own process of the autoawq environment);
    llama-imatrix twice."""
    import subprocess
    import sys

    import torch

    from pipeline.fsutil import sha256_file
    from pipeline.stages.awq import run_awq
    from pipeline.stages.convert import convert
    from pipeline.stages.imatrix import imatrix

    recipe = tmp_path / "calib.yaml"
    recipe.write_text(f"name: tiny-awq\nsource: {{path: {tiny_hf}}}\nquants: [Q4_K_M]\nbench: false\n"
                      f"awq: {{calibration: {CALIB}, n_samples: 4, seq_len: 64, q_group_size: 64, apply_clip: false}}\n"
                      f"imatrix: {{calibration: {CALIB}, ctx: 128, chunks: 4}}\n")
    r = load_recipe(recipe, quantize_exe)
    assert r.imatrix.chunks == 4  # clipping off to keep the test short (measured deterministic too: bench/)
    run_awq(r, tiny_hf, tmp_path / "a1", tmp_path / "a1.json", threads=2)
    (tmp_path / "work" / "tiny-awq").mkdir(parents=True)
    (tmp_path / "work" / "tiny-awq" / "hf").symlink_to(tiny_hf)
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "awq", "--recipe", str(recipe), "--work",
                          str(tmp_path / "work"), "--artifacts", str(tmp_path / "art"), "--threads", "2"],
                         capture_output=True, text=True, cwd=ROOT)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    a2 = tmp_path / "work" / "tiny-awq" / "hf-awq" / "model.safetensors"
    assert sha256_file(tmp_path / "a1" / "model.safetensors") == sha256_file(a2)
    assert not torch.equal(weights(tiny_hf)["model.layers.0.self_attn.v_proj.weight"],
                           weights(a2.parent)["model.layers.0.self_attn.v_proj.weight"])  # AWQ did change them

    f16 = tmp_path / "tiny-F16.gguf"
    convert(r, tiny_hf, f16, tmp_path / "convert.json", log=tmp_path / "convert.log")
    shas = []
    for i in (1, 2):
        rec = imatrix(r, "plain", f16, tmp_path / f"imx{i}.gguf", tmp_path / f"imx{i}.json", log=tmp_path / f"imx{i}.log",
                      threads=2)
        assert rec["threads"] == 2 and rec["facts"]["chunk_count"] == 4 and rec["facts"]["entries"] > 0
        shas.append(sha256_file(tmp_path / f"imx{i}.gguf"))
    assert shas[0] == shas[1]


@pytest.mark.parametrize("case", ["short text", "unsupported arch", "clip shape", "group size"])
def test_awq_bad_inputs_one_line(tmp_path, tiny_hf, quantize_exe, case):
    from pipeline.stages.awq import run_awq

    src, awq = tiny_hf, f"{{calibration: {CALIB}, n_samples: 8, seq_len: 64, q_group_size: 64}}"
    expected = {"short text": "awq: calibration text short.txt has",
                "unsupported arch": "awq: architecture LlamaForCausalLM (model_type 'bert') is not supported by AutoAWQ",
                "clip shape": "awq: apply_clip: layer model.layers.0.mlp.gate_proj has 96 output features",
                "group size": "awq: q_group_size: layer model.layers.0.mlp.down_proj has 320 input features, "
                              "not a multiple of 128"}[case]
    if case == "short text":
        (tmp_path / "short.txt").write_text("A short calibration text. " * 20)
        awq = "{calibration: short.txt, n_samples: 8, seq_len: 64, q_group_size: 64}"
    elif case == "unsupported arch":  # asked of AutoAWQ (left to choose, the stage would take llmcompressor)
        awq = f"{{calibration: {CALIB}, engine: autoawq, n_samples: 8, seq_len: 64, q_group_size: 64}}"
        src = tmp_path / "bert"
        shutil.copytree(tiny_hf, src)
        cfg = json.loads((src / "config.json").read_text())
        (src / "config.json").write_text(json.dumps({**cfg, "model_type": "bert"}))
    elif case == "clip shape":
        src = make_tiny_llama(tmp_path / "odd", intermediate=96)
    else:
        awq = f"{{calibration: {CALIB}, n_samples: 8, seq_len: 64, q_group_size: 128}}"
        src = make_tiny_llama(tmp_path / "g", intermediate=320)
    r = load_recipe(awq_recipe(tmp_path, src, awq), quantize_exe)
    out = tmp_path / "out"
    with pytest.raises(PipelineError) as exc:
        run_awq(r, src, out, tmp_path / "awq.json")
    msg = str(exc.value)
    assert "\n" not in msg and expected in msg, msg
    assert not out.exists() and not (tmp_path / "awq.json").exists()


