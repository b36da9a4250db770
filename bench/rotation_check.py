"""Proof that the rotated demo (issue #19, pipeline/rotate.py) is the same function with its weights off the grid.

Run:  PYTHONPATH=. python bench/rotation_check.py [--chunks 16] [--threads 2]
- ``setup_rotated_demo()`` (the demo, then its rotated copy, in the demo hub cache);
- both snapshots to F16 GGUF with the pinned ``convert_hf_to_gguf.py`` (pipeline.tools.run_converter);
- ``llama-perplexity --kl-divergence-base`` on the original F16 over data/botchan.txt (-c 512 --chunks 16 -b 512
  -t 2), then ``--kl-divergence`` of the rotated F16 against those logits: PPL before/after, ln PPL ratio, mean
  and 99th percentile KLD, same top p (top-1 agreement);
- the grid measure (pipeline.rotate.grid_fraction): the fraction of 32-weight blocks a Q4_1 block (Q8_0 for the
  embeddings, which the source GGUF holds as Q8_0) represents exactly, within float16 rounding, before and after.
Verdict with the thresholds fixed before measuring: mean KLD <= 1e-3 and same top p >= 0.98 ("function preserved").
Works in a temporary folder under /tmp; prints one line per step and the numbers.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEXT = ROOT / "data" / "botchan.txt"
MAX_KLD_MEAN, MIN_SAME_TOP_P = 1e-3, 0.98  # fixed before measuring
GRID_TENSORS = [("model.layers.0.self_attn.q_proj.weight", "q4_1"), ("model.layers.0.mlp.down_proj.weight", "q4_1"),
                ("model.layers.15.mlp.gate_proj.weight", "q4_1"), ("model.layers.29.self_attn.o_proj.weight", "q4_1"),
                ("model.layers.29.mlp.up_proj.weight", "q4_1"), ("model.embed_tokens.weight", "q8_0")]
LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.weight$")


def grid_report(src: Path, rot: Path) -> list[str]:
    from safetensors.numpy import load_file

    from pipeline.rotate import grid_fraction

    a, b = load_file(str(src / "model.safetensors")), load_file(str(rot / "model.safetensors"))
    lines = [f"{'tensor':48} {'grid':5} {'before':>8} {'after':>8}"]
    for name, kind in GRID_TENSORS:
        lines.append(f"{name:48} {kind:5} {grid_fraction(a[name], kind):8.2%} {grid_fraction(b[name], kind):8.2%}")
    lines.append(f"{'lm_head.weight (tied before: embed_tokens)':48} {'q8_0':5} "
                 f"{grid_fraction(a['model.embed_tokens.weight'], 'q8_0'):8.2%} "
                 f"{grid_fraction(b['lm_head.weight'], 'q8_0'):8.2%}")
    names = sorted(n for n in a if LINEAR.match(n))
    blocks = np.array([a[n].size // 32 for n in names], dtype=np.float64)
    before = np.array([grid_fraction(a[n]) for n in names]) @ blocks / blocks.sum()
    after = np.array([grid_fraction(b[n]) for n in names]) @ blocks / blocks.sum()
    lines.append(f"{f'all {len(names)} q/k/v/o/gate/up/down ({int(blocks.sum())} blocks)':48} {'q4_1':5} "
                 f"{before:8.2%} {after:8.2%}")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    from pipeline.demo import DEMO_COMMIT, DEMO_REPO, ROTATED_COMMIT, ROTATED_REPO, setup_demo, setup_rotated_demo
    from pipeline.errors import PipelineError
    from pipeline.stages.evaluate import (
        has_final_estimate,
        has_kld_statistics_end,
        parse_kld_statistics,
        run_perplexity,
    )
    from pipeline.tools import find_toolchain, run_converter, tail

    start = time.monotonic()
    t = time.monotonic()
    rot = setup_rotated_demo()
    src = setup_demo()
    print(f"[1] snapshots: {DEMO_REPO}@{DEMO_COMMIT[:12]} and {ROTATED_REPO}@{ROTATED_COMMIT} "
          f"({time.monotonic() - t:.1f} s)", flush=True)
    tc = find_toolchain()
    with tempfile.TemporaryDirectory(prefix="ggufpipe-rotation-", dir="/tmp") as tmpd:
        tmp = Path(tmpd)
        ggufs = {}
        for label, snap in (("original", src), ("rotated", rot)):
            t = time.monotonic()
            out = tmp / f"{label}-F16.gguf"
            res = run_converter(tc, [str(snap), "--outfile", str(out), "--outtype", "f16"], tmp / f"convert-{label}.log")
            if res.returncode or not out.is_file():
                raise PipelineError(f"convert {label}: {tail(res.output)}")
            ggufs[label] = out
            print(f"[2] {label} F16 GGUF: {out.stat().st_size / 2**20:.1f} MiB ({time.monotonic() - t:.1f} s)", flush=True)

        common = ["-c", "512", "--chunks", str(args.chunks), "-b", "512", "-t", str(args.threads)]
        logits = tmp / "original.logits"
        t = time.monotonic()
        res = run_perplexity(tc, ["-m", ggufs["original"], "-f", TEXT, *common, "--kl-divergence-base", logits],
                             tmp / "ppl-base.log", has_final_estimate, "rotation check: base")
        m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", res.output)
        if res.returncode or not m:
            raise PipelineError(f"llama-perplexity (base): {tail(res.output)}")
        print(f"[3] original F16: PPL {m.group(1)} +/- {m.group(2)} ({time.monotonic() - t:.1f} s)", flush=True)
        t = time.monotonic()
        res = run_perplexity(tc, ["-m", ggufs["rotated"], *common, "--kl-divergence-base", logits, "--kl-divergence"],
                             tmp / "ppl-kld.log", has_kld_statistics_end, "rotation check: rotated")
        s = parse_kld_statistics(res.output)
        print(f"[4] rotated F16 against it ({time.monotonic() - t:.1f} s)", flush=True)

    t = time.monotonic()
    grid = grid_report(src, rot)
    print(f"[5] grid measure ({time.monotonic() - t:.1f} s)", flush=True)
    ok = s["kld_mean"] <= MAX_KLD_MEAN and s["same_top_p"] >= MIN_SAME_TOP_P
    print(f"\nbotchan.txt, -c 512 --chunks {args.chunks} -b 512 -t {args.threads}, llama.cpp b{tc.build_number}")
    print(f"PPL original F16   {s['ppl_base']:.4f}")
    print(f"PPL rotated F16    {s['ppl_q']:.4f}")
    print(f"ln(PPL ratio)      {s['ln_ppl_ratio']:.6f}")
    print(f"mean KLD           {s['kld_mean']:.6g}   (99.0 %: {s['kld_p99']:.6g}, max {s['kld_max']:.6g})")
    print(f"same top p         {s['same_top_p']:.4%}")
    print(f"RMS delta p        {s['rms_dp']:.4%}")
    print("\n" + "\n".join(grid))
    print(f"\nverdict: {'function preserved' if ok else 'NOT preserved'} (mean KLD <= {MAX_KLD_MEAN:g}, "
          f"same top p >= {MIN_SAME_TOP_P:.0%}); {time.monotonic() - start:.0f} s in all")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
