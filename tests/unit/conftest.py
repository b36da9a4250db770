"""The unit tier: no compiled llama.cpp tools, no torch/transformers, no network.

Every test in this folder runs under :func:`unit_tier_guard` (its fixtures' setup and teardown too), so the tier cannot drift:

- importing torch, transformers (or AutoAWQ, accelerate, safetensors' torch bindings) raises
  :class:`TierViolation`, in this process and in any Python subprocess a test starts (stub packages
  first on PYTHONPATH);
- looking up the llama.cpp tools (the pinned cache, ``LLAMA_CPP_DIR``, a tool's path or version)
  raises it; subprocesses see an empty tools cache and no ``LLAMA_CPP_DIR``;
- a socket connecting anywhere but the loopback interface raises it; pip and huggingface_hub in
  subprocesses are offline.

``make test-fast`` runs this tier in a light venv (core + dev extras: no torch, no snakemake); ``make test``
runs it first in the whole suite (tests/conftest.py orders the tiers), before any other tier imports torch.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib.abc
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "awq", "accelerate")


class TierViolation(Exception):
    """Raised (never caught as a PipelineError) when a unit test reaches for what its tier excludes."""


class _HeavyImportBlocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in HEAVY:
            raise TierViolation(f"unit tier: `import {name}` (torch/transformers belong to tests/integration)")
        return None


_STUB = ("raise RuntimeError('unit tier: import of {name} in a subprocess of a unit test "
         "(torch/transformers belong to tests/integration)')\n")


def _no_tools(*_args, **_kwargs):
    raise TierViolation("unit tier: llama.cpp tools looked up (tests that need them belong to tests/integration)")


def _loopback_only(connect):
    def guarded(sock, address, *args, **kwargs):
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            host = address[0]
            try:
                loopback = ipaddress.ip_address(host).is_loopback
            except ValueError:
                loopback = host == "localhost"
            if not loopback:
                raise TierViolation(f"unit tier: network connection to {address!r} (only loopback is allowed)")
        return connect(sock, address, *args, **kwargs)
    return guarded


@functools.cache
def _scratch() -> Path:
    """One folder per process for the stub packages and the empty tools cache."""
    folder = Path(tempfile.mkdtemp(prefix="unit-tier-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


@contextlib.contextmanager
def unit_tier_guard(basetemp: Path):
    loaded = sorted(m for m in HEAVY if m in sys.modules)
    if loaded:  # imported by a test of another tier in this process: the guard could not catch it
        raise TierViolation(f"unit tier: {', '.join(loaded)} already imported; run tests/unit first or alone")
    stubs = basetemp / "unit-tier-stubs"
    if not stubs.is_dir():
        for name in HEAVY:
            (stubs / name).mkdir(parents=True)
            (stubs / name / "__init__.py").write_text(_STUB.format(name=name))
    empty_cache = basetemp / "unit-tier-empty-cache"
    empty_cache.mkdir(exist_ok=True)

    from pipeline import tools, tools_install

    blocker = _HeavyImportBlocker()
    sys.meta_path.insert(0, blocker)
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(stubs), os.environ.get("PYTHONPATH")])))
        mp.setenv("GGUFPIPE_CACHE", str(empty_cache))
        mp.delenv("LLAMA_CPP_DIR", raising=False)
        mp.setenv("PIP_NO_INDEX", "1")  # no registry for a pip that a test starts
        mp.setenv("HF_HUB_OFFLINE", "1")
        # what find_toolchain() and install() call through the module's globals, never a name other modules bind
        # at import (`from .tools import find_toolchain` in a module first imported during a unit test would
        # keep the patched function for the rest of the process)
        for name in ("pinned_dir", "_user_toolchain", "read_build_version"):
            mp.setattr(tools, name, _no_tools)
        mp.setattr(tools_install, "install", _no_tools)
        mp.setattr(tools.Toolchain, "tool", _no_tools)
        mp.setattr(socket.socket, "connect", _loopback_only(socket.socket.connect))
        mp.setattr(socket.socket, "connect_ex", _loopback_only(socket.socket.connect_ex))
        yield
    finally:
        mp.undo()
        sys.meta_path.remove(blocker)


# Around each phase of every test in this folder (fixture setup included, whatever the fixture's scope):
# a session fixture that a unit test is the first to request is made under the guard too.
@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with unit_tier_guard(_scratch()):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with unit_tier_guard(_scratch()):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
    with unit_tier_guard(_scratch()):
        return (yield)
