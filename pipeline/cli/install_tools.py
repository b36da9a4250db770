"""``ggufpipe install-tools``: see ``ggufpipe install-tools --help``."""

from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("install-tools", help="build the pinned llama.cpp tools into the cache (no-op when done)")
    p.add_argument("-j", "--jobs", type=int)
    p.set_defaults(func=lambda a: __import__("pipeline.tools_install", fromlist=["install"]).install(a.jobs))
