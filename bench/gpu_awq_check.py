"""AWQ stage on a CUDA machine: the same entry function (pipeline.stages.awq.run_awq) as on the build box.

Run where torch sees a GPU:  PYTHONPATH=. python bench/gpu_awq_check.py
1. a tiny Llama (tests/helpers' generator), scale search only: the folded model must compute the
   same function (fp16 weights);
2. the same with clipping;
3. a random model with SmolLM2-135M's shapes (30 layers, hidden 576), clipping on, 16 x 128 and
   64 x 256 calibration tokens: wall time of the AWQ stage on the GPU.
Prints one line per run and exits non-zero when a check fails.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main() -> int:
    import torch
    from helpers import CALIB, awq_recipe  # the test suite's generator
    from helpers.hf_factory import make_tiny_llama
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    from pipeline.recipe import load_recipe
    from pipeline.stages.awq import run_awq

    assert torch.cuda.is_available(), "no CUDA device"
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, flush=True)
    base = Path(tempfile.mkdtemp(prefix="gpu-awq-"))
    src = make_tiny_llama(base / "hf")
    failures = 0
    for clip in (False, True):
        r = load_recipe(awq_recipe(base, src, f"{{calibration: {CALIB}, n_samples: 8, seq_len: 64, q_group_size: 64, "
                                              f"apply_clip: {str(clip).lower()}}}"))
        out = base / f"out-clip-{clip}"
        rec = run_awq(r, src, out, base / f"awq-{clip}.json")
        ids = torch.tensor([list(range(3, 67))])
        with torch.no_grad():
            la, lb = (AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)(ids).logits for d in (src, out))
        rel = float((la - lb).abs().max() / la.abs().max())
        ok = rec["device"] == "cuda" and (clip or rel < 0.01)
        failures += not ok
        print(f"tiny clip={clip}: device {rec['device']}, {rec['seconds']} s, max rel logit diff {rel:.5f} "
              f"{'ok' if ok else 'FAIL'}", flush=True)
    # SmolLM2-135M's shapes, random weights, this tokenizer
    big = base / "hf135m"
    cfg = LlamaConfig(vocab_size=768, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=2048,
                      tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, torch_dtype="float16")
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).half().save_pretrained(big, safe_serialization=True)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name == "special_tokens_map.json":
            (big / f.name).write_bytes(f.read_bytes())
    for n, s in ((16, 128), (64, 256)):
        r = load_recipe(awq_recipe(base, big, f"{{calibration: {CALIB}, n_samples: {n}, seq_len: {s}, "
                                              "q_group_size: 64, apply_clip: true}"))
        t = time.monotonic()
        rec = run_awq(r, big, base / f"out135m-{n}x{s}", base / f"awq135m-{n}x{s}.json")
        print(f"135M shapes, clip on, {n} x {s} tokens: device {rec['device']}, AWQ {rec['seconds']} s "
              f"(stage {time.monotonic() - t:.0f} s)", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out, "gpu_awq_check.json").write_text(json.dumps({"failures": failures}))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
