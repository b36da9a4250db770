"""``ggufpipe verify``: see ``ggufpipe verify --help``."""

from __future__ import annotations

from pipeline.distribution.verify import verify


def cmd_verify(args) -> None:
    for path in args.files:
        print(verify(path, manifest=args.manifest))


def register(sub) -> None:
    p = sub.add_parser("verify", help="check GGUF files (or the folder / any shard of a split file) against their "
                                      "manifest")
    p.add_argument("files", nargs="+", metavar="PATH")
    p.add_argument("--manifest", help="manifest.json (default: the one beside each file or split folder)")
    p.set_defaults(func=cmd_verify)
