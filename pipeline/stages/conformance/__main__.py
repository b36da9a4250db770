"""``python -m pipeline.stages.conformance``: one run by hand (pipeline/stages/conformance/stage.py)."""

import argparse
import sys

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe
from pipeline.stages.conformance.stage import run


def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.stages.conformance RECIPE BASE_GGUF HF_DIR OUT [--logits F --base-record R]``: one run by hand."""
    ap = argparse.ArgumentParser(prog="python -m pipeline.stages.conformance", description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("base_gguf")
    ap.add_argument("hf_dir")
    ap.add_argument("out")
    ap.add_argument("--logits")
    ap.add_argument("--base-record")
    ap.add_argument("--awq")
    ap.add_argument("--log")
    args = ap.parse_args(argv)
    try:
        rec = run(load_recipe(args.recipe), args.base_gguf, args.hf_dir, args.logits, args.base_record, args.out,
                  args.log, awq_base=args.awq)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in rec["failures"]:
        print(line)
    for k, c in rec["checks"].items():
        print(f"{k}: {'pass' if c['passed'] else 'FAIL'}: {c.get('summary') or c.get('not_run', '')}")
    return 0 if rec["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())



sys.exit(main())
