"""The unit tier's guard (tests/unit/conftest.py) holds: torch, transformers, the llama.cpp tools and the network
are out of reach here and in subprocesses, while loopback stays usable. Also the key of the tools cache and the helpers
install() writes into the llama.cpp tree."""

from __future__ import annotations

import importlib
import os
import socket
import subprocess
import sys

import pytest

from pipeline import tools

from .conftest import TierViolation


@pytest.mark.parametrize("name", ["torch", "transformers", "transformers.models.llama", "awq", "accelerate"])
def test_heavy_imports_refused(name):
    with pytest.raises(TierViolation, match=f"import {name.partition('.')[0]}"):
        importlib.import_module(name)


@pytest.mark.parametrize("name", ["torch", "transformers"])
def test_heavy_imports_refused_in_subprocesses(name):
    res = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True)
    assert res.returncode != 0 and "unit tier: import of" in res.stderr, res.stderr


def test_tool_lookup_refused(tmp_path):
    from pipeline.tools import find_toolchain  # bound here, as a stage module binds it

    # the guard patches what find_toolchain calls, never the name itself: a module that binds it at import during a
    # unit test (pipeline.workflow, say) must keep the real one for the tiers that run after
    assert find_toolchain.__name__ == "find_toolchain"
    with pytest.raises(TierViolation):
        find_toolchain()
    with pytest.raises(TierViolation):
        tools.pinned_dir()
    tc = tools.Toolchain(tmp_path, tmp_path, tmp_path / "c.py", tmp_path, 1, "x", "user")
    with pytest.raises(TierViolation):
        tc.tool("llama-quantize")
    assert "LLAMA_CPP_DIR" not in os.environ and not any(tools.cache_root().iterdir())


def test_tool_lookup_refused_in_subprocesses():
    res = subprocess.run([sys.executable, "-m", "pipeline.tools", "where"], capture_output=True, text=True)
    assert res.returncode == 1 and "are not installed in" in res.stderr, res.stderr


def test_network_refused_loopback_allowed():
    with socket.socket() as s, pytest.raises(TierViolation, match="network connection"):
        s.connect(("192.0.2.1", 80))  # TEST-NET-1: refused before any packet leaves
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        with socket.create_connection(server.getsockname(), timeout=5):
            pass


def test_tools_cache_key_covers_what_shapes_the_build(monkeypatch, tmp_path):
    """Adding a target, changing a cmake flag or an asset, or editing a helper's source gives another cache folder:
    an old cache is rebuilt, never trusted."""
    key = tools.cache_key()
    assert len(key) == 12 and tools.cache_key() == key
    for name, value in (("TOOLS", (*tools.TOOLS, "llama-cli")),
                        ("CMAKE_FLAGS", (*tools.CMAKE_FLAGS, "-DGGML_CUDA=ON")),
                        ("ASSETS", (*tools.ASSETS, ("README.md", "."))),
                        ("SDIST_SHA256", "0" * 64),
                        ("PINNED_COMMIT", "deadbee"),
                        ("HELPERS", {**tools.HELPERS, "ggufpipe-other": "conformance.cpp"}),
                        ("HELPER_CMAKE", tools.HELPER_CMAKE + "# another flag\n")):
        with monkeypatch.context() as m:
            m.setattr(tools, name, value)
            assert tools.cache_key() != key, name
    # the helpers' sources: the same text keeps the key, one edited byte changes it, a missing file is one error line
    native = tmp_path / "native"
    native.mkdir()
    for source in tools.HELPERS.values():
        (native / source).write_bytes((tools.NATIVE_DIR / source).read_bytes())
    with monkeypatch.context() as m:
        m.setattr(tools, "NATIVE_DIR", native)
        assert tools.cache_key() == key
        source = native / tools.HELPERS["ggufpipe-conformance"]
        source.write_bytes(source.read_bytes() + b"// edited\n")
        assert tools.cache_key() != key
        source.unlink()
        with pytest.raises(tools.PipelineError, match=r"conformance\.cpp: the source of the helper ggufpipe-conformance"):
            tools.cache_key()


def test_helpers_written_into_the_tree(tmp_path):
    """install() writes each helper into the unpacked tree's examples/ (source, CMakeLists.txt, add_subdirectory)
    and keys the folder by what it wrote; a tree without examples/ is one error line."""
    examples = tmp_path / "llama.cpp" / "examples"
    examples.mkdir(parents=True)
    (examples / "CMakeLists.txt").write_text("add_subdirectory(simple)\n")
    from pipeline import tools_install

    written = tools_install._add_helpers(examples.parent)
    assert written == tools.helper_sources() and tools.cache_key(written) == tools.cache_key()
    for target, source in tools.HELPERS.items():
        assert (examples / target / f"{target}.cpp").read_bytes() == (tools.NATIVE_DIR / source).read_bytes()
        cmake = (examples / target / "CMakeLists.txt").read_text()
        assert f"add_executable(${{TARGET}} {target}.cpp)" in cmake and "llama-common llama" in cmake
        assert f"\nadd_subdirectory({target})" in (examples / "CMakeLists.txt").read_text()
    with pytest.raises(tools.PipelineError, match="examples/CMakeLists.txt is missing"):
        tools_install._add_helpers(tmp_path / "elsewhere")
