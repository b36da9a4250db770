"""``ggufpipe dvc-link``: see ``ggufpipe dvc-link --help``."""

from __future__ import annotations

from pathlib import Path

from pipeline.distribution.dvc import link
from pipeline.layout import Layout


def cmd_dvc_link(args) -> None:
    print(link(args.name, args.file, args.stage, Layout(Path(args.artifacts), Path(args.work)), args.lock))


def register(sub) -> None:
    p = sub.add_parser("dvc-link", help="a gguf@ DVC stage: publish one GGUF as its manifest says")
    p.add_argument("--name", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--stage", required=True, help="the DVC stage name (its dvc.lock entry is dropped on rejection)")
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--work", default="work")
    p.add_argument("--lock", default="dvc.lock")
    p.set_defaults(func=cmd_dvc_link)
