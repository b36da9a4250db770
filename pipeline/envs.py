"""The Python environments a build runs in, one per concern, each installed from its lock (requirements/<name>.lock).

- ``build`` (the interpreter that runs Snakemake and the stages: ``.venv``): orchestration, the reference side
  (conformance, ``init``, rotation) and the pipeline itself;
- ``converter``: llama.cpp's ``convert_hf_to_gguf.py`` under its own pins (the pinned tree's
  requirements/requirements-convert_hf_to_gguf.txt), with this machine's CPU torch in place of its CUDA one;
- ``autoawq``: AutoAWQ 0.2.9, archived upstream, with the transformers it imports unpatched (4.56.2).

The extra environments live in ``<build venv>/envs/<name>`` (``make env-<name>``), or under ``$GGUFPIPE_ENVS``.
A stage that needs one and finds it missing fails in one line naming it and the command that builds it.

Standard library only: the Snakefile and every stage process load this module."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from pipeline.errors import PipelineError

ROOT = Path(__file__).resolve().parent.parent  # the checkout: requirements/ sits beside pipeline/


@dataclass(frozen=True)
class Env:
    name: str
    purpose: str

    @property
    def lock(self) -> Path:
        return ROOT / "requirements" / f"{self.name}.lock"


ENVS = {
    "converter": Env("converter", "llama.cpp's convert_hf_to_gguf.py"),
    "autoawq": Env("autoawq", "AutoAWQ 0.2.9 calibration"),
}
BUILD = "build"  # the interpreter running Snakemake and the stages (sys.executable)

# The converter's own pins: requirements/requirements-convert_hf_to_gguf.txt and the -legacy_llama file it includes,
# in the pinned tree (tests/integration/test_envs.py reads them there). Only the CUDA index's torch is not installable
# here; the manifest records each pin the converter environment does not meet.
CONVERTER_PINS = {"torch": "==2.11.0", "numpy": "~=2.2.6", "sentencepiece": ">=0.1.98,<0.3.0",
                  "transformers": "==4.57.6", "protobuf": ">=4.21.0,<5.0.0"}


class EnvError(PipelineError):
    """An environment a stage needs is not installed: ``env`` (its name), ``path`` (where it was looked for),
    ``command`` (what builds it)."""

    def __init__(self, env: str, path: Path, command: str):
        self.env, self.path, self.command = env, path, command
        super().__init__(f"the {env} environment ({ENVS[env].purpose}) is not installed at {path}: run `{command}`")

    def __reduce__(self):
        return type(self), (self.env, self.path, self.command)


@cache
def lock_digest(name: str) -> str:
    """The SHA256 of environment ``name``'s lock: part of the rerun trigger of the stages that run in it."""
    lock = ENVS[name].lock
    if not lock.is_file():
        raise PipelineError(f"{lock}: the lock of the {name} environment is missing (`make locks` writes it)")
    return hashlib.sha256(lock.read_bytes()).hexdigest()


def envs_dir() -> Path:
    return Path(os.environ.get("GGUFPIPE_ENVS") or Path(sys.prefix) / "envs")


def env_python(name: str) -> Path:
    """The interpreter of environment ``name``; :class:`EnvError` when it is not installed."""
    if name not in ENVS:
        raise PipelineError(f"unknown environment {name!r} (known: {', '.join(ENVS)})")
    folder = envs_dir() / name
    python = folder / "bin" / "python"
    if not (folder / ".installed").is_file() or not python.exists():
        raise EnvError(name, folder, f"make env-{name}")
    return python


def env_environ(name: str, path_first: tuple = (), base: dict | None = None) -> dict:
    """The environment variables of a process of environment ``name`` started by the pipeline: ``base`` (this
    process's by default) with the pipeline package (and ``path_first``) first on the path, since the environments
    hold only their own packages, and the environment's name."""
    base = os.environ if base is None else base
    path = [*map(str, path_first), str(ROOT), *filter(None, [base.get("PYTHONPATH")])]
    return {**base, "PYTHONPATH": os.pathsep.join(path), "GGUFPIPE_ENV": name}


def current() -> str:
    """The environment this process runs in (``build`` unless the pipeline started it in another)."""
    return os.environ.get("GGUFPIPE_ENV", BUILD)


@cache
def env_versions(name: str, packages: tuple[str, ...]) -> dict:
    """The installed versions of ``packages`` in environment ``name`` (those installed), as
    :func:`pipeline.provenance.python_versions` reads them there (with none of this process's PYTHONPATH)."""
    code = ("import json, sys; from pipeline.provenance import python_versions; "
            "print(json.dumps(python_versions(tuple(sys.argv[1:]))))")
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    res = subprocess.run([str(env_python(name)), "-c", code, *packages], capture_output=True, text=True,
                         env=env_environ(name, base=clean))
    if res.returncode != 0:
        raise PipelineError(f"the {name} environment ({envs_dir() / name}) cannot report its packages: "
                            f"{(res.stderr.strip().splitlines() or ['no output'])[-1]}")
    return json.loads(res.stdout)


def lock_pins(lock: Path) -> dict[str, str]:
    """The distributions a lock installs: {name (lower case): version}."""
    return dict(line.split(" ", 1)[0].lower().split("==", 1) for line in lock.read_text().splitlines()
                if "==" in line and not line.startswith((" ", "#")))


@cache
def build_pins(packages: tuple[str, ...]) -> dict[str, str | None]:
    """The versions requirements/build.lock pins for ``packages``: part of the rerun trigger of a stage whose output
    they shape in the build environment (the lock as a whole changes with every tool bump)."""
    pins = lock_pins(ROOT / "requirements" / "build.lock")
    return {p: pins.get(p) for p in packages}


def cuda_wheels(lock: Path) -> list[str]:
    """The NVIDIA CUDA wheels a lock would install (``nvidia-*`` distributions): none may, on a CPU build box."""
    return [name for name in lock_pins(lock) if name.startswith("nvidia-")]


def _release(version: str) -> tuple[int, ...]:
    """The numeric release of a version (``2.13.0+cpu`` -> (2, 13, 0)); enough for the converter's pins."""
    out = []
    for part in version.split("+", 1)[0].split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
    return tuple(out)


def _meets(version: str, spec: str) -> bool:
    """``version`` against a comma-separated specifier of ``==``, ``~=``, ``>=``, ``<=``, ``<``, ``>`` clauses."""
    v = _release(version)
    for clause in spec.split(","):
        op, want = re.fullmatch(r"\s*(==|~=|>=|<=|<|>)\s*(\S+)\s*", clause).groups()
        w = _release(want)
        ok = {"==": v == w, ">=": v >= w, "<=": v <= w, "<": v < w, ">": v > w,
              "~=": v >= w and v[:len(w) - 1] == w[:-1]}[op]
        if not ok:
            return False
    return True


def converter_deviations(installed: dict) -> dict:
    """Each converter pin the installed versions do not meet: {package: {"required", "installed"}}."""
    return {pkg: {"required": spec, "installed": installed.get(pkg)} for pkg, spec in CONVERTER_PINS.items()
            if installed.get(pkg) is None or not _meets(installed[pkg], spec)}


if __name__ == "__main__":  # make, before installing an environment: `python -m pipeline.envs check-lock LOCK`
    if len(sys.argv) != 3 or sys.argv[1] != "check-lock":
        sys.exit("usage: python -m pipeline.envs check-lock LOCK")
    found = cuda_wheels(Path(sys.argv[2]))
    if found:
        sys.exit(f"error: {sys.argv[2]}: resolves CUDA wheels ({', '.join(found)}); this build box installs the CPU "
                 "torch: pin it in the lock's .in file and run `make locks`")
