"""``ggufpipe rebuild-check``: see ``ggufpipe rebuild-check --help``."""

from __future__ import annotations

from pipeline.bounds import cores_arg
from pipeline.distribution.rebuild import rebuild_check


def cmd_rebuild_check(args) -> None:
    """Rebuild a recipe from its manifest in a scratch folder and compare SHA256s (pipeline/distribution/rebuild.py)."""
    raise SystemExit(rebuild_check(args.manifest, recipe=args.recipe, cores=args.cores, keep=args.keep,
                                   only=args.only, hub_cache=args.hub_cache, out=lambda s: print(s, flush=True)))


def register(sub) -> None:
    p = sub.add_parser("rebuild-check", help="rebuild a recipe from its manifest in a scratch folder (never "
                                             "artifacts/ or work/) and compare every GGUF's SHA256 and the manifest")
    p.add_argument("manifest", help="artifacts/<name>/manifest.json")
    p.add_argument("--recipe", help="the recipe file (default: recipes/<recipe.file> of the manifest's project)")
    p.add_argument("--cores", default="all", type=cores_arg, help="Snakemake --cores for the rebuild (default: all)")
    p.add_argument("--keep", metavar="DIR", help="rebuild in DIR (new or empty) and keep it (default: a temporary "
                                                 "folder, removed)")
    p.add_argument("--only", nargs="+", metavar="KEY", help="rebuild and compare only these files (quant keys, "
                                                            "or the base type e.g. F16); the manifest is not compared")
    p.add_argument("--hub-cache", help="hub cache holding the source commit (default: $HF_HUB_CACHE, "
                                       "huggingface_hub's cache, the demo cache)")
    p.set_defaults(func=cmd_rebuild_check)
