"""How far apart do mixes measure on the gate text when the exhaustive search rates them (nearly) equal? (issue #32)

Run:  python bench/mix_near.py RECIPE --work W --artifacts A [--alternatives 8] [--within 0.01] [--threads 2]
Needs RECIPE built with `search: exhaustive` (every group measured at every candidate). For each mix of the recipe,
re-solves it with one group's chosen type forbidden, group by group (the largest groups first), and keeps up to
``--alternatives`` mixes written differently (by the types llama-quantize writes) whose additive prediction, from
the exhaustive measurements, is within ``--within`` of the solved mix's at no more bytes (a target mix: within 0.2 %
of its bytes). Each, and the solved mix, is quantized and measured on the recipe's first gate set (llama-perplexity
--kl-divergence against the gate's reference logits). Prints each alternative's bytes, prediction and gate mean KLD
over the solved mix's, and the range per mix: the resolution of a "gate KLD <= 1.05x the exhaustive search's" test.
Results:
bench/RESULTS.md#a-fisher-weighted-error-and-what-the-gate-test-can-resolve-2026-12-05-later.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("recipe")
    ap.add_argument("--work", default="work")
    ap.add_argument("--artifacts", default="artifacts")
    ap.add_argument("--alternatives", type=int, default=8)
    ap.add_argument("--within", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)

    from bench.mix_bench import quantize_map
    from pipeline.errors import PipelineError
    from pipeline.gguf.reader import read_header
    from pipeline.layout import Layout
    from pipeline.recipe import EvalSet, load_recipe
    from pipeline.stages.evaluate import kl_divergence
    from pipeline.stages.mix.plan import header_bytes
    from pipeline.stages.mix.sensitivity import RETRIES
    from pipeline.stages.mix.solve import choose, predicted_kld, tensor_types
    from pipeline.tools import find_toolchain

    r = load_recipe(a.recipe)
    L = Layout(Path(a.artifacts), Path(a.work))
    sens = json.loads(L.sensitivity(r.name, "plain").read_text())
    if any(v.get("source", "measured") != "measured" for g in sens["groups"] for v in g["kld"].values()):
        raise SystemExit(f"{L.sensitivity(r.name, 'plain')}: not an exhaustive sensitivity (build with search: "
                         "exhaustive first)")
    groups, floor = sens["groups"], sens["floor"]
    fk = sens["floor_kld"]["kld_mean"]
    base = L.source_gguf(r, "plain")
    fixed = header_bytes(read_header(base), None) + sens["kept_bytes"]
    g = r.first_eval_set
    gate = EvalSet(name=g.name, text=g.text, ctx=g.ctx, chunks=g.chunks)
    logits = L.base_logits(r.name, g.name)
    tc = find_toolchain()

    def written(choice: dict) -> tuple:  # what llama-quantize writes: candidates that fall back alike are one file
        return tuple(sorted((t, sens["tensors"][t]["types"][c]) for t, c in tensor_types(sens, choice).items()))

    with tempfile.TemporaryDirectory() as tmp:
        def gate_kld(label: str, choice: dict) -> float:
            out = quantize_map(tc, base, tensor_types(sens, choice), Path(tmp) / "mix.gguf", a.threads)
            metrics, _ = kl_divergence(tc, gate, out, logits, a.threads, None, f"near {label}", RETRIES)
            return metrics["kld_mean"]

        for q in r.quants:
            if not q.mix:
                continue
            lay = json.loads(L.mix_layout(r.name, q.key).read_text())
            cands = q.mix.candidates  # the solve stage's: a mix may allow fewer than the sensitivity measured
            kw = {"budget": lay["bytes"]} if "bytes" in lay else {"target": lay["aim"]}
            choice, total, pred = choose(groups, cands, floor, fk, fixed, **kw)
            ref = gate_kld(q.key, choice)
            print(f"{q.key}: solved {total} bytes, predicted {pred:.5f}, gate mean KLD {ref:.5f}", flush=True)
            seen, ratios = {written(choice)}, []
            for grp in sorted(groups, key=lambda x: -x["bytes"][floor]):
                if len(ratios) >= a.alternatives:
                    break
                barred = copy.deepcopy(groups)
                for x in barred:
                    if x["group"] == grp["group"]:
                        x["kld"][choice[grp["group"]]] = {"kld_mean": 1e9}
                try:
                    alt, size, _ = choose(barred, cands, floor, fk, fixed, **kw)
                except PipelineError:
                    continue
                p = predicted_kld(groups, alt, floor, fk)
                near = size <= (total if "budget" in kw else total * 1.002) and p <= pred * (1 + a.within)
                if not near or written(alt) in seen:
                    continue
                seen.add(written(alt))
                k = gate_kld(f"{q.key} without {grp['group']} at {choice[grp['group']]}", alt)
                ratios.append(k / ref)
                print(f"  without {grp['group']} at {choice[grp['group']]}: {size} bytes ({size / total:.4f}), "
                      f"predicted {p / pred:.4f}x, gate {k:.5f} = {k / ref:.3f}x", flush=True)
            if ratios:
                print(f"{q.key}: {len(ratios)} near mixes, gate mean KLD {min(ratios):.3f}-{max(ratios):.3f}x the "
                      "solved mix's\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
