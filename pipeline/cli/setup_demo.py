"""``ggufpipe setup-demo``: see ``ggufpipe setup-demo --help``."""

from __future__ import annotations

from pathlib import Path


def register(sub) -> None:
    p = sub.add_parser("setup-demo", help="put the embedded demo model into the local hub cache")
    p.add_argument("--hub-cache", help="hub cache folder (default: the demo cache)")
    p.set_defaults(func=lambda a: print(__import__("pipeline.demo", fromlist=["setup_demo"]).setup_demo(
        Path(a.hub_cache) if a.hub_cache else None)))
