"""Stock vs hand recipe vs measured mix on a generated mixture of experts (issue #31 item 3).

Run:  PYTHONPATH=. python bench/moe_mix.py [--work DIR] [--bands 2]
Builds, through the real Snakefile, a tiny random Qwen3-MoE (tests/helpers/hf_factory.tiny_qwen3_moe: 2 layers x 16
experts, top-2, widths 256; the demo's SmolLM2 tokenizer) with three files at Q4_K_M's size or below:
- stock Q4_K_M;
- a hand recipe of the kind public MoE uploads use: attention at Q8_0, every routed expert at Q3_K (``tensor_types``;
  llama-quantize's rules keep the router F32, the output and embeddings stay as Q4_K_M puts them);
- a measured mix (``type: mix``, ``budget: {size_of: Q4_K_M}``): expert groups per role and band, candidates
  Q3_K..Q6_K, the sensitivity measured on data/botchan-calib.txt.
The gate measures each against the F16 on data/botchan.txt (the first 9 x 512 tokens), a text the sensitivity never
saw. Prints bytes, bpw, mean KLD, PPL ratio and same-top-p per file, and the mix's solved map by group.

RANDOM WEIGHTS: the KLD values say nothing about a real model; the point is that each path works on experts and its
numbers are recorded (bench/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

HAND = [r"attn_=q8_0", r"_exps=q3_k"]  # the output and embeddings as the stock type leaves them


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--work", type=Path, default=None)
    ap.add_argument("--bands", type=int, default=2)
    a = ap.parse_args()
    from helpers.hf_factory import tiny_qwen3_moe

    from pipeline.demo import setup_demo

    root = a.work or Path(tempfile.mkdtemp(prefix="moe-mix-"))
    src = tiny_qwen3_moe(root / "hf", setup_demo(), n_expert=16)
    recipe = root / "recipes" / "moe-mix.yaml"
    recipe.parent.mkdir(parents=True, exist_ok=True)
    recipe.write_text(yaml.safe_dump({
        "name": "moe-mix", "source": {"path": str(src)}, "bench": False, "conformance": False,
        "sensitivity": {"text": str(ROOT / "data" / "botchan-calib.txt"), "ctx": 512, "chunks": 4, "bands": a.bands},
        "quants": ["Q4_K_M", {"type": "Q4_K_M", "variant": "hand", "tensor_types": HAND},
                   {"type": "mix", "label": "Q4_K_M_MIX", "budget": {"size_of": "Q4_K_M"}}],
        "gates": [{"name": "botchan", "text": str(ROOT / "data" / "botchan.txt"), "ctx": 512, "chunks": 9,
                   "max_kld_mean": 100.0, "max_ppl_ratio": 1000.0, "max_kld_p99": 1000.0, "min_same_top_p": 0.0}],
    }, sort_keys=False))
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(ROOT / "Snakefile"), "--directory",
                          str(root), "--cores", "2", "--config", f"recipes={recipe}"], capture_output=True, text=True)
    if res.returncode != 0:
        print(res.stdout[-3000:] + res.stderr[-3000:])
        return 1
    m = json.loads((root / "artifacts" / "moe-mix" / "manifest.json").read_text())
    print(f"built in {time.monotonic() - t0:.0f} s under {root}")
    print("| file | bytes | bpw | mean KLD | PPL ratio | same top p |")
    print("|---|---|---|---|---|---|")
    for e in m["artifacts"]:
        if e.get("role") == "base":
            continue
        g = e["metrics"]["botchan"]
        print(f"| {e['file']} | {e['size_bytes']} | {e['bits_per_weight']} | {g['kld_mean']:.6f} | "
              f"{g['ppl_ratio']:.6f} | {g['same_top_p']:.4f} |")
    mix = next(e["mix"] for e in m["artifacts"] if e.get("mix"))
    print(f"mix: predicted {mix['predicted']}; groups (role.band -> type):")
    print(", ".join(f"{k} {v}" for k, v in mix["choice"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
