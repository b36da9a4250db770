"""``ggufpipe install-tools``: see ``ggufpipe install-tools --help``."""

from __future__ import annotations

from pipeline.bounds import CORES


def _install(a) -> None:
    from pipeline import tools_install  # not at import: every command imports this module

    argv = ["install", *(["-j", str(a.jobs)] if a.jobs else []), *(["--arch", a.arch] if a.arch else []),
            *(["--profile", a.profile] if a.profile else []), *(["--print-cmake"] if a.print_cmake else [])]
    if tools_install.main(argv):  # it printed its one line `error: ...`
        raise SystemExit(1)


def register(sub) -> None:
    p = sub.add_parser("install-tools", help="build the pinned llama.cpp tools into the cache (no-op when done)")
    p.add_argument("-j", "--jobs", type=CORES.arg("--jobs"))
    p.add_argument("--arch", choices=("aarch64",), help="cross-build the device tools for --profile (docs/devices.md#arm)")
    p.add_argument("--profile", help="the device CPU profile of an aarch64 build (cortex-a76, cortex-a78ae, ...)")
    p.add_argument("--print-cmake", action="store_true", help="print the cmake lines and build nothing")
    p.set_defaults(func=_install)
