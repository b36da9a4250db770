"""The ARM kernels' spread (issue #34, docs/device-check.md): every published file of a built recipe re-measured on its
slice by `ggufpipe device-check --emulate PROFILE` (the profile's cross-built tools under qemu-user as its core) and
by the build box's own tools; prints each delta against the build box's published values, the use of the tolerance,
the wall seconds of each emulated run (a cost, not a speed) and the repack buffer llama.cpp printed under emulation
beside what the memory model predicts for the profile (`ggufpipe fit --arch ...`).

    python bench/arm_emulated.py artifacts/smollm2-135m [--profile cortex-a76] [--threads 2] [--out bench/arm/FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline import tools_cross  # noqa: E402
from pipeline.devices.check import device_check  # noqa: E402
from pipeline.memory import ModelShape, components  # noqa: E402
from pipeline.stages.publish_devices import same_top_p_limit  # noqa: E402

MIB = 1 << 20


def _row(label, r):
    s = r["slice"]
    use = max(abs(s["delta"]["kld_mean"]) / s["limit"]["kld_mean"],
              abs(s["delta"]["same_top_p_points"]) / s["limit"]["same_top_p_points"])
    return (f"| {label} | {r['file']} | {s['measured']['kld_mean']:.6f} | {s['delta']['kld_mean']:+.6f} | "
            f"{s['delta']['same_top_p_points']:+.3f} | {use:.0%} | {'pass' if r['passed'] else 'FAIL'} |"), use


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--profile", default="cortex-a76")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", help="write every result here (JSON)")
    ap.add_argument("--files", nargs="+", help="only these published files (default: every one with a slice)")
    args = ap.parse_args()
    folder = Path(args.folder)
    m = json.loads((folder / "manifest.json").read_text())
    dc, tol = m["device_check"], m["device_check"]["tolerance"]
    prof = tools_cross.profile(args.profile)
    files = [e["file"] for e in m["artifacts"] if e.get("slice") and (not args.files or e["file"] in args.files)]
    print(f"{m['name']}: slice {dc['chunks']} x {dc['ctx']} ({dc['scored_tokens']} scored); profile {prof.name} "
          f"(-march={prof.march}) under qemu -cpu {prof.qemu_cpu}; tolerance |Δ KLD| <= max({tol['kld_mean_abs']}, "
          f"{tol['kld_mean_rel']:.0%}), |Δ same top p| <= {same_top_p_limit(tol, dc['scored_tokens'])} points")
    rows, mem_rows, out = [], [], []
    for f in files:
        for label, emulate in (("x86-64 (build box)", None), (f"aarch64 {prof.name}, qemu", prof.name)):
            t0 = time.monotonic()
            r = device_check(folder / f, threads=args.threads, bench=False, label="bench", emulate=emulate)
            r["wall_seconds"] = round(time.monotonic() - t0, 1)
            out.append(r)
            line, _use = _row(label, r)
            rows.append(line[:-1] + f" {r['wall_seconds']:.0f} |")
            arch = prof.fit_arch if emulate else "x86_64"
            pred = components(ModelShape.from_gguf(folder / f), dc["ctx"], arch=arch, threads=args.threads,
                              n_outputs=dc["ctx"])["repack"] / MIB
            got = r["buffers_mib"].get("CPU_REPACK model", 0.0)
            mem_rows.append(f"| {label} | {f} | {arch} | {pred:.2f} | {got:.2f} | {got - pred:+.2f} |")
            print(rows[-1], flush=True)
    print("\n| tools | file | mean KLD | Δ mean KLD | Δ same top p (points) | use of tolerance | verdict | wall s |")
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print("\n| tools | file | fit --arch | repack predicted (MiB) | CPU_REPACK printed (MiB) | difference |")
    print("|---|---|---|---|---|---|")
    print("\n".join(mem_rows))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0 if all(r["passed"] for r in out) else 1


if __name__ == "__main__":
    sys.exit(main())
