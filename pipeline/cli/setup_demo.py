"""``ggufpipe setup-demo``: see ``ggufpipe setup-demo --help``."""

from __future__ import annotations

from pathlib import Path

from pipeline import demo


def _run(a) -> None:
    hub = Path(a.hub_cache) if a.hub_cache else None
    print(demo.setup_demo(hub))
    if a.rotated:
        print(demo.setup_rotated_demo(hub))


def register(sub) -> None:
    p = sub.add_parser("setup-demo", help="put the embedded demo model into the local hub cache")
    p.add_argument("--hub-cache", help="hub cache folder (default: the demo cache)")
    p.add_argument("--rotated", action="store_true",
                   help="also put the rotated demo (same function, weights off the Q4_1 grid; docs/rotation.md) "
                        "next to it and print its snapshot folder")
    p.set_defaults(func=_run)
