"""``ggufpipe clean-logits``: see ``ggufpipe clean-logits --help``."""

from __future__ import annotations

from pathlib import Path

from pipeline.layout import recipe_name_arg
from pipeline.stages.clean_logits import clean_logits


def cmd_clean_logits(args) -> None:
    gone = clean_logits(Path(args.work), args.names, dry_run=args.dry_run)
    for path, size in gone:
        print(f"{'would empty' if args.dry_run else 'emptied'} {path} ({size / 1e6:.1f} MB)")
    print(f"{sum(s for _, s in gone) / 1e6:.1f} MB in {len(gone)} base logits file(s)"
          + (" would be freed" if args.dry_run else " freed"))


def register(sub) -> None:
    p = sub.add_parser("clean-logits", help="empty the base logits of finished builds (recomputed only when an eval needs them)")
    p.add_argument("names", nargs="*", type=recipe_name_arg, help="recipe names (default: all under --work)")
    p.add_argument("--work", default="work")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(func=cmd_clean_logits)
