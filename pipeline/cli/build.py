"""``ggufpipe build``: see ``ggufpipe build --help``."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from pipeline.bounds import cores_arg


def cmd_build(args) -> None:
    snakefile = Path(__file__).resolve().parents[2] / "Snakefile"
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--cores", str(args.cores)]
    if args.recipes:
        cmd += ["--config", f"recipes={','.join(args.recipes)}"]
    cmd += args.snakemake_args
    raise SystemExit(subprocess.call(cmd))


def register(sub) -> None:
    p = sub.add_parser("build", help="run the Snakemake workflow")
    p.add_argument("--cores", default="all", type=cores_arg, help="Snakemake --cores: all or a count (default all)")
    p.add_argument("recipes", nargs="*", help="recipe files or folders (default: recipes/)")
    p.add_argument("--snakemake-args", nargs=argparse.REMAINDER, default=[])
    p.set_defaults(func=cmd_build)
