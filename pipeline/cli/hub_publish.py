"""``ggufpipe hub-publish``: see ``ggufpipe hub-publish --help``."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.distribution.hub import hub_publish, plan_markdown
from pipeline.layout import Layout
from pipeline.recipe import load_recipe


def cmd_hub_publish(args) -> None:
    """Upload a built artifact folder to the recipe's Hugging Face repo (pipeline/distribution/hub.py); --dry-run: plan only."""
    recipe = load_recipe(args.recipe)  # quant types were checked by the build; the manifest pins the recipe
    _desc, rec = hub_publish(recipe, Layout(Path(args.artifacts), Path(args.work)), dry_run=args.dry_run,
                             show=lambda d: print(json.dumps(d, indent=2) if args.json else plan_markdown(d), flush=True))
    if rec is None:
        print("dry run: nothing uploaded", file=sys.stderr)
    else:
        print(f"committed {rec['commit_oid']} to {rec['repo']} (branch {rec['revision']}): {rec['commit_url']}",
              file=sys.stderr)


def register(sub) -> None:
    p = sub.add_parser("hub-publish", help="upload a built recipe's artifact folder to its Hugging Face repo "
                                           "(`publish:` section) in one commit; --dry-run prints the plan")
    p.add_argument("--recipe", required=True)
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root, for the upload record (default: work)")
    p.add_argument("--dry-run", action="store_true", help="check the folder and print the plan; no network")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (default: a markdown table)")
    p.set_defaults(func=cmd_hub_publish)
