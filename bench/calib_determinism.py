"""Are the calibration stages bit-deterministic? AWQ (torch, CPU) and llama-imatrix, by thread count.

Run:  PYTHONPATH=. python bench/calib_determinism.py [--demo] [--threads 1,2,2] [--no-awq]
On the tiny Llama of tests/helpers (and with --demo also llama-imatrix on the demo F16 GGUF),
each run in its own process:
- run_awq (pipeline/stages/awq.py) with torch threads 1, 2, 2 (scale search, and scale search + clipping):
  SHA256 of the folded model.safetensors, and the largest weight difference between the first two runs;
- llama-imatrix (pipeline/stages/imatrix.py) with -t 1, 2, 2: SHA256 of the imatrix GGUF.
Prints one line per run and a verdict per stage (which runs gave the same bytes).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

AWQ_CFG = "{{calibration: {calib}, n_samples: 8, seq_len: 64, q_group_size: 64, apply_clip: {clip}}}"


def _child(kind: str, recipe: str, src: str, out: str, threads: int) -> None:
    """One stage run in this (fresh) process."""
    from pipeline.recipe import load_recipe
    from pipeline.tools import find_toolchain

    r = load_recipe(recipe, str(find_toolchain().tool("llama-quantize")))
    if kind == "awq":
        from pipeline.stages.awq import run_awq

        run_awq(r, src, out, out + ".json", threads=threads)
    else:
        from pipeline.stages.imatrix import imatrix

        imatrix(r, "plain", src, out, out + ".json", log=out + ".log", threads=threads)


def _run(kind: str, recipe: Path, src: Path, out: Path, threads: int) -> str:
    from pipeline.fsutil import sha256_file

    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from bench.calib_determinism import _child; "
            "_child(*sys.argv[1:5], int(sys.argv[5]))")
    res = subprocess.run([sys.executable, "-c", code, kind, str(recipe), str(src), str(out), str(threads)],
                         capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{kind} -t {threads} failed:\n{res.stdout[-2000:]}{res.stderr[-2000:]}")
    return sha256_file(out / "model.safetensors" if kind == "awq" else out)


def _max_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return max(float((x[k].float() - y[k].float()).abs().max()) for k in x)


def main() -> int:
    from helpers import CALIB, awq_recipe
    from helpers.hf_factory import make_tiny_llama

    from pipeline.recipe import load_recipe
    from pipeline.stages.convert import convert
    from pipeline.tools import find_toolchain

    demo = "--demo" in sys.argv
    threads = [int(t) for t in sys.argv[sys.argv.index("--threads") + 1].split(",")] if "--threads" in sys.argv \
        else [1, 2, 2]
    verdicts = {}
    with tempfile.TemporaryDirectory(prefix="calib-det-") as d:
        d = Path(d)
        hf = make_tiny_llama(d / "hf")
        for clip in () if "--no-awq" in sys.argv else ("false", "true"):
            (d / f"clip-{clip}").mkdir()
            rp = awq_recipe(d / f"clip-{clip}", hf, AWQ_CFG.format(calib=CALIB, clip=clip))
            outs = {}
            for i, t in enumerate(threads):
                out = d / f"awq-{clip}-{i}"
                outs[i] = out
                sha = _run("awq", rp, hf, out, t)
                print(f"awq apply_clip={clip} threads={t} run={i}: {sha}", flush=True)
                verdicts.setdefault(f"awq clip={clip}", []).append((t, sha))
            print(f"awq apply_clip={clip}: max |w(run 0) - w(run 1)| = {_max_diff(outs[0], outs[1]):.3g}", flush=True)
        rp = d / "imx.yaml"
        rp.write_text(f"name: tiny-imx\nsource: {{path: {hf}}}\nimatrix: {{calibration: {CALIB}, ctx: 128, chunks: 8}}\n"
                      "quants: [Q4_K_M]\nbench: false\n")
        r = load_recipe(rp, str(find_toolchain().tool("llama-quantize")))
        f16 = d / "tiny-F16.gguf"
        convert(r, hf, f16, d / "convert.json", log=d / "convert.log")
        bases = [("tiny", f16)]
        if demo:
            from pipeline.demo import source_gguf  # noqa: F401  (the demo hub snapshot must exist)

            demo_f16 = d / "demo-F16.gguf"
            snap = next((Path.home() / ".cache/ggufpipe/demo/hub").glob("models--*/snapshots/*"))
            convert(r, snap, demo_f16, d / "convert-demo.json", log=d / "convert-demo.log")
            bases.append(("demo", demo_f16))
        for label, base in bases:
            for i, t in enumerate(threads):
                sha = _run("imatrix", rp, base, d / f"imx-{label}-{i}.gguf", t)
                print(f"imatrix {label} -t {t} run={i}: {sha}", flush=True)
                verdicts.setdefault(f"imatrix {label}", []).append((t, sha))
    for k, runs in verdicts.items():
        groups: dict[str, list[str]] = {}
        for i, (t, sha) in enumerate(runs):
            groups.setdefault(sha, []).append(f"run {i} (t={t})")
        print(f"{k}: " + ("all runs identical" if len(groups) == 1 else
                          "DIFFER: " + " | ".join(", ".join(g) + f" -> {s[:12]}" for s, g in groups.items())))
    print(json.dumps({k: [s for _, s in v] for k, v in verdicts.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
