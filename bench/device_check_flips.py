"""Per token, where two llama.cpp builds disagree on a published file's top token over its device slice
(docs/device-check.md, the tolerance): each quant's log-probabilities written by both builds (llama-perplexity
--kl-divergence-base on the slice's text and settings), then compared with the slice's F16 ones.

    python bench/device_check_flips.py artifacts/smollm2-135m /tmp/llama-native/build/bin [--text data/botchan.txt]

Prints per quant: tokens whose top token differs between the builds and the pinned build's top-2 gap on them,
tokens lost / gained against the F16's top token (McNemar's a and b) and the net change in same-top-p points.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.stages.logitsfile import read_logits_file  # noqa: E402
from pipeline.tools import find_toolchain  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("folder")
    ap.add_argument("other_bin", help="the other build's bin folder (llama-perplexity)")
    ap.add_argument("--text", default="data/botchan.txt", help="the slice's eval text (its first chunks)")
    args = ap.parse_args()
    folder = Path(args.folder)
    m = json.loads((folder / "manifest.json").read_text())
    dc = m["device_check"]
    base = read_logits_file(folder / dc["file"])
    builds = {"pinned": find_toolchain().bin_dir, "other": Path(args.other_bin)}
    with tempfile.TemporaryDirectory() as tmp:
        for e in m["artifacts"]:
            if not e.get("slice") or e["role"] == "base":
                continue
            lp = {}
            for b, bin_dir in builds.items():
                out = Path(tmp) / f"{b}.logits"
                subprocess.run([str(bin_dir / "llama-perplexity"), "-m", str(folder / e["file"]), "-f", args.text, "-c",
                                str(dc["ctx"]), "--chunks", str(dc["chunks"]), "-b", str(dc["ctx"]), "-t", "2",
                                "--kl-divergence-base", str(out)], check=True, capture_output=True)
                f = read_logits_file(out)
                if not np.array_equal(f.tokens, base.tokens):
                    raise SystemExit(f"{args.text}: not the slice's tokens")
                lp[b] = [f.log_probs(c) for c in range(dc["chunks"])]
            lost = gained = changed = 0
            gaps = []
            for c in range(dc["chunks"]):
                top_base = base.log_probs(c).argmax(1)
                p, o = lp["pinned"][c], lp["other"][c]
                tp, to = p.argmax(1), o.argmax(1)
                lost += int(((tp == top_base) & (to != top_base)).sum())
                gained += int(((tp != top_base) & (to == top_base)).sum())
                s = np.sort(p, axis=1)
                gap = s[:, -1] - s[:, -2]
                changed += int((tp != to).sum())
                gaps += list(gap[tp != to])
            n = dc["scored_tokens"]
            print(f"{e['file']}: top token differs between the builds on {changed} of {n} tokens (pinned top-2 gap "
                  f"there: median {np.median(gaps):.3f}, max {max(gaps):.3f} nats, {sum(g < 0.23 for g in gaps)} "
                  f"under 0.23); vs the F16's top token lost {lost}, gained {gained}: net "
                  f"{100 * (gained - lost) / n:+.3f} points, McNemar z {(gained - lost) / max(1, lost + gained) ** 0.5:+.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
