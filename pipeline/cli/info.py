"""``ggufpipe info``: see ``ggufpipe info --help``."""

from __future__ import annotations

import json
import os
import stat

from pipeline.errors import PipelineError
from pipeline.fsutil import sha256_file
from pipeline.gguf import read_header


def _regular_file(path: str) -> None:
    """Refuse, in one line, what is not a regular file before it is opened: opening a FIFO blocks until a writer
    comes, and a device or a folder is no GGUF."""
    try:
        st = os.stat(path)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # a NUL byte in the path
        raise PipelineError(f"{path!r}: cannot read: {exc}") from None
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else "a FIFO, socket or device"
        raise PipelineError(f"{path}: not a regular file ({what}): info reads a GGUF file")


def cmd_info(args) -> None:
    _regular_file(args.gguf)
    facts = read_header(args.gguf).facts(sha256_file(args.gguf))  # standard library only (also on devices)
    print(json.dumps(facts.as_dict(), indent=2))


def register(sub) -> None:
    p = sub.add_parser("info", help="print facts of a GGUF file")
    p.add_argument("gguf")
    p.set_defaults(func=cmd_info)
