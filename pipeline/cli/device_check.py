"""``ggufpipe device-check`` and ``ggufpipe collect``: see their ``--help`` and docs/device-check.md. device-check exits
0 when the file passes (or, without llama.cpp tools, is verified), 1 with one line ``error: ...`` when it fails."""

from __future__ import annotations

from pipeline.bounds import THREADS
from pipeline.devices.check import device_check, summary
from pipeline.devices.collect import collect
from pipeline.errors import PipelineError


def cmd_device_check(args) -> None:
    result = device_check(args.file, manifest=args.manifest, threads=args.threads, bench=not args.no_bench,
                          label=args.device, out=args.out, llama_cpp_dir=args.llama_cpp_dir, draft=args.draft,
                          mtp=args.mtp, emulate=args.emulate, power_mode=args.power_mode, profile=args.profile)
    line = summary(result)
    if not result["passed"]:
        raise PipelineError(line + (f" (result written to {args.out})" if args.out else ""))
    print(line)


def cmd_collect(args) -> None:
    out, notes = collect(args.results, artifacts=args.artifacts)
    for n in notes:
        print(n)
    print(f"wrote {out}: re-publish to show it (`snakemake`, `dvc repro`)")


def register(sub) -> None:
    p = sub.add_parser("device-check", help="on a device: verify a pulled file and its slice, re-measure the slice "
                                            "with llama.cpp, compare with the build box")
    p.add_argument("file", help="a published GGUF (or split folder / shard), its manifest.json and device-slice.logits "
                                "beside it (`dvc pull`)")
    p.add_argument("--manifest", help="manifest.json (default: the one beside the file)")
    p.add_argument("--threads", type=THREADS.arg("--threads"), help="threads (default: the CPU count, at most 4)")
    p.add_argument("--device", help="a label for this device in the results, e.g. a recipe `devices:` name "
                                    "(default: the host name)")
    p.add_argument("--out", help="write the result JSON here (for `ggufpipe collect`)")
    p.add_argument("--no-bench", action="store_true", help="skip the short llama-bench")
    p.add_argument("--draft", help="a published draft of FILE (its manifest beside it): also measure the speed-up it "
                                   "gives with this device's llama-server, with and without it")
    p.add_argument("--mtp", action="store_true", help="the same for the MTP heads inside FILE (draft: {mtp: true})")
    p.add_argument("--power-mode", help="the device's power mode, kept beside its result (a Jetson: `nvpmodel -q`, "
                                        "e.g. MAXN or 15W)")
    p.add_argument("--profile", help="the device CPU profile the tools were built for (`make tools ARCH=aarch64 "
                                     "PROFILE=...`): their system_info must show its features")
    p.add_argument("--emulate", metavar="PROFILE",
                   help="on this build box: the profile's cross-built aarch64 tools under qemu as its core "
                        "(`make tools ARCH=aarch64 PROFILE=...`; docs/devices.md#arm); no speeds")
    p.add_argument("--llama-cpp-dir", help="the llama.cpp build to use (default: $LLAMA_CPP_DIR, then PATH)")
    p.set_defaults(func=cmd_device_check)
    c = sub.add_parser("collect", help="add `device-check --out` results to artifacts/<name>/devices.json (an input "
                                       "of publish)")
    c.add_argument("results", nargs="+", metavar="RESULT.json")
    c.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    c.set_defaults(func=cmd_collect)
