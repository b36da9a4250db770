"""Is the speed-up decision stable? The demo's pairs measured again and again by the speed-up stage (issue #30).

Run:  PYTHONPATH=. python bench/speedup_stability.py [--repeats 5] [--evidence] [--greedy-only]
On the committed demo files (artifacts/, `dvc pull` first): each repeat runs pipeline/stages/speedup.py on every
pair of recipes/smollm2-135m.yaml with the recipe's prompts, n_predict, n_max and draft.speedup settings, every core;
``--evidence`` adds the F16 main with the draft's Q4_0 (the same trained weights, 2.9x smaller). Prints one line per
run (chosen n_max, median speed-up, interval, decision) and per pair whether every repeat decided the same.
``--greedy-only``: the stage's greedy rounds alone (what the decision is made from), without the sampled and
concurrent conditions that follow it, at a third of the time.
Run it on a quiet box: it is a clock.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--evidence", action="store_true")
    ap.add_argument("--greedy-only", action="store_true")
    args = ap.parse_args()
    from pipeline.recipe import load_recipe
    from pipeline.stages.draft import vocab_check
    from pipeline.stages.speedup import speedup

    r = load_recipe(ROOT / "recipes" / "smollm2-135m.yaml")
    d = r.draft
    art, dart = ROOT / "artifacts" / r.name, ROOT / "artifacts" / r.draft_name
    pairs = [(art / r.artifact_for(m), dart / r.draft_recipe().artifact_for(k)) for m, k in d.pairs]
    if args.evidence:
        pairs.append((art / r.artifact_for(r.base_key), dart / r.draft_recipe().artifact_for("Q4_0")))
    threads = os.cpu_count() or 1
    decisions: dict[str, list[bool]] = {}
    with tempfile.TemporaryDirectory(prefix="speedup-stability-") as tmp:
        for i in range(args.repeats):
            for main, draft in pairs:
                label = f"{main.name} + {draft.name}"
                vocab = Path(tmp) / f"vocab-{main.stem}.json"
                if not vocab.exists():
                    vocab_check(main, draft, vocab)
                if args.greedy_only:
                    rec = greedy(main, draft, d, threads, Path(tmp) / "server.log")
                else:
                    rec = speedup(main, draft, vocab, d.eval_text, d.n_max, d.prompts, d.n_predict,
                                  Path(tmp) / "speedup.json", d.speedup, threads=threads, log=Path(tmp) / "server.log")
                c = rec["by_n_max"][str(rec["best_n_max"])]
                more = "" if args.greedy_only else f"sampled {rec['sampled']['speedup']:.3f}x, " + (
                    f"{d.speedup.parallel} concurrent {rec['concurrent']['speedup']:.3f}x, " if "concurrent" in rec
                    else "")
                print(f"repeat {i + 1}  {label}: n_max {rec['best_n_max']}, {rec['speedup']:.3f}x "
                      f"({rec['interval'][0]:.3f}-{rec['interval'][1]:.3f}), acceptance {c['acceptance_rate']:.3f}, "
                      f"{more}{'LINE' if rec['helps'] else 'no line'}, {rec['seconds']:.0f} s", flush=True)
                decisions.setdefault(label, []).append(rec["helps"])
    stable = True
    for label, got in decisions.items():
        same = len(set(got)) == 1
        stable &= same
        print(f"{label}: {'the same decision' if same else 'DIFFERENT decisions'} in {len(got)} repeats "
              f"({'line' if got[0] else 'no line'})")
    return 0 if stable else 1


def greedy(main: Path, draft: Path, d, threads: int, log: Path) -> dict:
    """The stage's greedy rounds and decision (pipeline/stages/speedup.py), without its sampled and concurrent rounds."""
    import time

    from pipeline.stages.draft import prompts_from_text
    from pipeline.stages.speedup import PROMPT_CHARS, box, greedy_rounds, server_args, servers, verdict
    from pipeline.tools import find_toolchain

    t0, tc, s = time.monotonic(), find_toolchain(), d.speedup
    prompts, n_predict = s.prompts or d.prompts, s.n_predict or d.n_predict
    passages = prompts_from_text(Path(d.eval_text).read_text(encoding="utf-8"), prompts, PROMPT_CHARS)
    configs = {n: server_args(main, draft, d.spec_type, n, threads, 1) for n in (None, *d.n_max)}
    with servers(tc, configs, log, "stability") as urls:
        by_n, best = greedy_rounds(urls, passages, n_predict, d.n_max, s.rounds, s.seed, "stability")
    helps, _ = verdict(by_n[str(best)]["speedup"], by_n[str(best)]["interval"], best, box())
    return {"by_n_max": by_n, "best_n_max": best, "speedup": by_n[str(best)]["speedup"],
            "interval": by_n[str(best)]["interval"], "helps": helps, "seconds": time.monotonic() - t0}


if __name__ == "__main__":
    sys.exit(main())
