"""The recipe `ggufpipe init` writes builds as written: a tiny random Llama with the demo's real tokenizer (SmolLM2's
BPE, chat template and generation config, so that the conformance stage's tokenizer parity holds, which the
SentencePiece test tokenizer of make_tiny_llama does not) in a local hub cache at a pinned commit; `ggufpipe init
org/name --quants Q8_0` (default gates: data/botchan.txt, family thresholds; conformance and bench on); then the
real Snakemake workflow on that file, unedited."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from helpers import ROOT, snakemake

REPO = "ggufpipe-test/tiny-smol"
COMMIT = "1e17000000000000000000000000000000c0ffee"


def tiny_with_demo_tokenizer(dest: Path, demo_snapshot: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    dest.mkdir(parents=True)
    for f in demo_snapshot.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copyfile(f.resolve(), dest / f.name)  # tokenizer, chat template, generation config, card
    cfg = LlamaConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).half().save_pretrained(dest, safe_serialization=True)
    return dest


def test_init_recipe_builds_as_written(tmp_path, demo_snapshot):
    from pipeline.demo import place_in_hub_cache

    hub = tmp_path / "hub"
    place_in_hub_cache(tiny_with_demo_tokenizer(tmp_path / "hf", demo_snapshot), hub, REPO, COMMIT)
    recipe = tmp_path / "recipes" / "tiny-smol.yaml"
    env = {**os.environ, "HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1"}
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "init", REPO, "--out", str(recipe), "--quants", "Q8_0"],
                         capture_output=True, text=True, env=env, cwd=ROOT)
    assert res.returncode == 0, res.stderr
    text = recipe.read_text()
    assert f'revision: "{COMMIT}"' in text and 'license: "apache-2.0"' in text and "chat template: found" in text
    res = snakemake(tmp_path, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    art = tmp_path / "artifacts" / "tiny-smol"
    manifest = json.loads((art / "manifest.json").read_text())
    assert manifest["source"]["commit"] == COMMIT and manifest["conformance"]["passed"] is True
    assert sorted(p.name for p in art.glob("*.gguf")) == ["tiny-smol-F16.gguf", "tiny-smol-Q8_0.gguf"]
    assert (tmp_path / "work" / "tiny-smol" / "gate.ok").exists()
