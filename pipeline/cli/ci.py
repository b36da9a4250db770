"""``ggufpipe ci``: see ``ggufpipe ci --help``."""

from __future__ import annotations

import argparse
import sys

from pipeline.bounds import cores_arg
from pipeline.distribution.ci import run_ci
from pipeline.errors import PipelineError


def cmd_ci(args) -> None:
    """Build and judge the recipes changed since ``--base`` (pipeline/distribution/ci.py); exit 0, 1 (a gate or
    check failed) or 2 (refused or could not select: nothing built)."""
    try:
        code = run_ci(args.base, args.recipes, cores=args.cores, summary=args.summary,
                      snakemake_args=args.snakemake_args, artifacts=args.artifacts, work=args.work)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)


def register(sub) -> None:
    p = sub.add_parser("ci", help="build and gate the recipes changed since a base git ref; markdown summary")
    p.add_argument("--base", default="origin/main", help="git ref to compare with (default: origin/main)")
    p.add_argument("--recipes", default="recipes", help="recipe folder (default: recipes)")
    p.add_argument("--cores", default="all", type=cores_arg, help="Snakemake --cores: all or a count (default all)")
    p.add_argument("--summary", help="also write the markdown summary to this file (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root (default: work)")
    p.add_argument("--snakemake-args", nargs=argparse.REMAINDER, default=[])
    p.set_defaults(func=cmd_ci)
