"""``ggufpipe info``: see ``ggufpipe info --help``."""

from __future__ import annotations

import json

from pipeline.fsutil import sha256_file
from pipeline.gguf import read_header


def cmd_info(args) -> None:
    facts = read_header(args.gguf).facts(sha256_file(args.gguf))  # standard library only (also on devices)
    print(json.dumps(facts.as_dict(), indent=2))


def register(sub) -> None:
    p = sub.add_parser("info", help="print facts of a GGUF file")
    p.add_argument("gguf")
    p.set_defaults(func=cmd_info)
