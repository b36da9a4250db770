"""``ggufpipe dvc-matrix``: see ``ggufpipe dvc-matrix --help``."""

from __future__ import annotations

from pipeline.distribution.dvc import write_matrix


def cmd_dvc_matrix(args) -> None:
    m = write_matrix(args.recipes, args.out, check=args.check)
    print(f"{args.out}: {len(m['recipes'])} recipe stage(s), {len(m['ggufs'])} GGUF stage(s)"
          + (" (up to date)" if args.check else ""))


def register(sub) -> None:
    p = sub.add_parser("dvc-matrix", help="write dvc-matrix.yaml (the DVC stages) from the recipes")
    p.add_argument("--recipes", default="recipes")
    p.add_argument("--out", default="dvc-matrix.yaml")
    p.add_argument("--check", action="store_true", help="fail when the file is out of date instead of writing it")
    p.set_defaults(func=cmd_dvc_matrix)
