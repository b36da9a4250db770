"""``ggufpipe validate``: see ``ggufpipe validate --help``."""

from __future__ import annotations

from pathlib import Path

from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe, load_recipes
from pipeline.tools import find_toolchain


def cmd_validate(args) -> None:
    exe = str(find_toolchain().tool("llama-quantize"))
    paths = [Path(p) for p in args.recipes] or [Path("recipes")]
    recipes = []
    for p in paths:
        recipes += load_recipes(p, exe) if p.is_dir() else [load_recipe(p, exe)]
    names: dict[str, Path] = {}
    for r in recipes:
        if r.name in names and names[r.name] != r.path:
            raise RecipeError(r.path, "name", f"{r.name!r} is already used by {names[r.name]}")
        names[r.name] = r.path
        print(f"ok  {r.path}: {r.name} ({r.outtype}; {', '.join(q.key for q in r.quants)})")


def register(sub) -> None:
    p = sub.add_parser("validate", help="validate recipes (default: recipes/)")
    p.add_argument("recipes", nargs="*")
    p.set_defaults(func=cmd_validate)
