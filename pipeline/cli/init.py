"""``ggufpipe init``: write a starter recipe for a checkpoint (a local HF folder or ``org/name[@revision]`` in the local
hub cache), checked and validated; see ``ggufpipe init --help`` and docs/init.md."""

from __future__ import annotations

import argparse
from pathlib import Path

from pipeline.bounds import CTX
from pipeline.errors import PipelineError
from pipeline.init import DEFAULT_QUANTS, inspect_source, render, slug, write_recipe
from pipeline.memory_profiles import ARCH_FEATURES, parse_size
from pipeline.recipe.devices import DEVICE_NAME_RE, Device
from pipeline.tools import find_toolchain

ROOT = Path(__file__).resolve().parent.parent.parent
DEFAULT_GATES = ROOT / "data" / "botchan.txt"


def parse_device(text: str):
    """``name:memory[:ctx[:arch]]``, e.g. ``pi5:8G:4096:arm64-dotprod`` -> Device."""
    parts = text.split(":")
    shown = repr(text) if len(text) <= 80 else repr(text[:77] + "...")
    if not 2 <= len(parts) <= 4 or not parts[0]:
        raise PipelineError(f"--device {shown}: name:memory[:ctx[:arch]], e.g. pi5:8G:4096:arm64-dotprod")
    if not DEVICE_NAME_RE.match(parts[0]):
        raise PipelineError(f"--device {shown}: the name {parts[0][:40]!r} is not a device name (lowercase a-z 0-9 . _ "
                            "-, at most 32 characters, as recipe devices[].name)")
    try:
        memory = parse_size(parts[1])
    except PipelineError as exc:
        raise PipelineError(f"--device {shown}: {exc}") from None
    try:
        ctx = CTX.arg("ctx")(parts[2]) if len(parts) > 2 and parts[2] else 4096
    except argparse.ArgumentTypeError as exc:
        raise PipelineError(f"--device {shown}: the context size: {exc}") from None
    arch = parts[3] if len(parts) > 3 and parts[3] else "x86_64"
    if arch not in ARCH_FEATURES:
        raise PipelineError(f"--device {shown}: unknown arch {arch[:40]!r}: one of {', '.join(ARCH_FEATURES)}")
    return Device(parts[0], memory=parts[1], memory_bytes=memory, ctx=ctx, arch=arch)


def cmd_init(args) -> None:
    devices = [parse_device(d) for d in args.device or []]
    if args.out and (Path(args.out).exists() or Path(args.out).is_symlink()):
        raise PipelineError(f"{args.out} exists: not overwritten (remove it or pass another --out)")
    gates = Path(args.gates).expanduser()
    if not gates.is_file() or gates.stat().st_size == 0:
        raise PipelineError(f"--gates {gates}: not a (non-empty) text file")
    tc = find_toolchain()
    src = inspect_source(args.source, tc.convert_script, tc.build_number, allow_pickle=args.allow_pickle,
                         trust_remote_code=args.trust_remote_code)
    name = args.name or slug(src.repo.split("/")[-1] if src.repo else src.folder.name)
    out = Path(args.out) if args.out else Path("recipes") / f"{name}.yaml"
    quants = [q.strip().upper() for q in args.quants.split(",") if q.strip()] if args.quants else list(DEFAULT_QUANTS)
    if not quants:
        raise PipelineError("--quants: give at least one quant type, e.g. Q8_0,Q4_K_M")
    text = render(src, name, out, gates, quants, devices, tc.build_number, args.allow_pickle, args.trust_remote_code)
    recipe = write_recipe(out, text, str(tc.tool("llama-quantize")))
    print(f"wrote {out}: {recipe.name} ({src.architecture}, {recipe.outtype}; {', '.join(q.key for q in recipe.quants)})"
          + (f"; MTP layers: {src.mtp_layers}" if src.mtp_layers else ""))
    offline = "HF_HUB_OFFLINE=1 " if src.repo else ""
    print(f"next: {offline}ggufpipe build {out}")


def register(sub) -> None:
    p = sub.add_parser("init", help="write a starter recipe for a checkpoint (local folder or org/name[@revision] "
                                    "in the local hub cache)")
    p.add_argument("source", help="a local Hugging Face folder, or org/name[@revision] in the local hub cache (offline)")
    p.add_argument("--out", help="the recipe to write (default recipes/<name>.yaml); never overwritten")
    p.add_argument("--name", help="the recipe's name (default: a slug of the repo or folder name)")
    p.add_argument("--device", action="append", metavar="NAME:MEMORY[:CTX[:ARCH]]",
                   help="a target device (repeatable), e.g. pi5:8G:4096:arm64-dotprod: adds the largest stock quant "
                        "whose estimated memory fits it (ctx default 4096, arch default x86_64)")
    p.add_argument("--quants", help="comma-separated quant types instead of the default Q8_0,Q4_K_M")
    p.add_argument("--gates", default=str(DEFAULT_GATES), help="the eval text of the gates (default data/botchan.txt)")
    p.add_argument("--allow-pickle", action="store_true", help="accept pickled weights (writes source.allow_pickle)")
    p.add_argument("--trust-remote-code", action="store_true",
                   help="accept a config that names custom code (writes source.trust_remote_code)")
    p.set_defaults(func=cmd_init)
