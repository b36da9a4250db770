"""The spread the on-device check's tolerance must hold (docs/device-check.md): every published file of a built recipe
re-measured on its slice by `ggufpipe device-check` with each llama.cpp build given and several thread counts; prints
each delta against the build box's values and the largest as a fraction of the tolerance.

    python bench/device_check_spread.py artifacts/smollm2-135m [--tools pinned --tools /tmp/llama-native/build]
        [--threads 1 2]

`pinned` is the pipeline's own build (GGML_NATIVE=OFF); a folder is any llama.cpp build (LLAMA_CPP_DIR layout), e.g.
one configured with -DGGML_NATIVE=ON, whose CPU kernels differ (AVX-512 where this machine has it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.devices.check import device_check  # noqa: E402
from pipeline.stages.publish_devices import same_top_p_limit  # noqa: E402
from pipeline.tools import find_toolchain  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("--tools", action="append", default=None, help="`pinned` or a llama.cpp build folder (repeat)")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    folder = Path(args.folder)
    m = json.loads((folder / "manifest.json").read_text())
    tol = m["device_check"]["tolerance"]
    files = [e["file"] for e in m["artifacts"] if e.get("slice")]
    dc = m["device_check"]
    print(f"{m['name']}: slice of {dc['chunks']} x {dc['ctx']} tokens ({dc['scored_tokens']} scored); tolerance "
          f"|Δ KLD| <= max({tol['kld_mean_abs']}, {tol['kld_mean_rel']:.0%}), |Δ same top p| <= "
          f"{same_top_p_limit(tol, dc['scored_tokens'])} points (the issue's {tol['same_top_p_points']:g} point: "
          "column `1 pt`)")
    width = max(len(f) for f in files)
    print(f"{'tools':36} {'threads':>7} {'file':{width}} {'KLD build box':>13} {'Δ KLD':>10} {'Δ top (pts)':>11} "
          f"{'use of tol':>10} {'1 pt':>4} {'s':>5}")
    worst = 0.0
    for tools in args.tools or ["pinned"]:
        tdir = None if tools == "pinned" else tools
        label = f"pinned {find_toolchain().root.name}" if tdir is None else tdir
        for t in args.threads:
            for f in files:
                r = device_check(folder / f, threads=t, bench=False, label="spread", llama_cpp_dir=tdir)
                s = r["slice"]
                use = max(abs(s["delta"]["kld_mean"]) / s["limit"]["kld_mean"],
                          abs(s["delta"]["same_top_p_points"]) / s["limit"]["same_top_p_points"])
                worst = max(worst, use)
                one = "ok" if abs(s["delta"]["same_top_p_points"]) <= tol["same_top_p_points"] else "out"
                print(f"{label[:36]:36} {t:>7} {f:{width}} {s['expected']['kld_mean']:>13.6f} "
                      f"{s['delta']['kld_mean']:>+10.6f} {s['delta']['same_top_p_points']:>+11.3f} {use:>10.1%} "
                      f"{one:>4} {s['seconds']:>5.1f}" + ("" if r["passed"] else "  FAIL"))
    print(f"largest use of the tolerance: {worst:.1%} ({'PASS' if worst <= 1 else 'FAIL'}: every run inside)")
    return 0 if worst <= 1 else 1


if __name__ == "__main__":
    sys.exit(main())
