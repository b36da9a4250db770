"""The llama.cpp toolchain: found, versioned, re-install is a no-op, clear errors when unusable."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import pytest

from pipeline import tools
from pipeline.errors import PipelineError, ToolError


def test_pinned_toolchain_found(toolchain):
    assert toolchain.origin == "pinned"
    assert toolchain.build_number == tools.PINNED_BUILD == 11312
    assert toolchain.commit == "0c1e570"
    for name in tools.TOOLS:
        assert os.access(toolchain.tool(name), os.X_OK)
    assert toolchain.convert_script.is_file()
    assert (toolchain.gguf_py / "gguf" / "__init__.py").is_file()
    assert (toolchain.root / "vocab" / "ggml-vocab-llama-bpe.gguf").is_file()


def test_reinstall_is_noop(toolchain):
    t0 = time.monotonic()
    res = subprocess.run([sys.executable, "-m", "pipeline.tools", "install"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "already installed" in res.stdout
    assert time.monotonic() - t0 < 20


def test_pipeline_gguf_is_the_pinned_gguf_py(toolchain):
    """The pipeline reads GGUFs with the gguf-py of the pinned tree, which knows its newest types."""
    import gguf

    assert hasattr(gguf.LlamaFileType, "MOSTLY_Q2_0") and hasattr(gguf.GGMLQuantizationType, "Q2_0")
    from pipeline.recipe import gguf_file_types, known_quant_types

    known, _ = known_quant_types(str(toolchain.tool("llama-quantize")))
    missing = {t for t in known if t not in gguf_file_types()} - {"F16", "BF16", "F32", "COPY", "Q3_K", "Q4_K", "Q5_K"}
    assert missing == set()


def test_gguf_py_source_is_the_toolchains(toolchain):
    """`pipeline.tools gguf-py --source` unpacks the pinned tree's gguf-py from the sdist alone, with no compiled tool:
    the files the toolchain holds."""
    import filecmp

    from pipeline.tools_install import gguf_py_source

    src = gguf_py_source()
    assert src.name.startswith(f"gguf-py-b{tools.PINNED_BUILD}-")
    cmp = filecmp.dircmp(src, toolchain.gguf_py, ignore=["__pycache__"])
    assert not (cmp.left_only or cmp.right_only or cmp.diff_files)
    for sub in ("gguf",):
        inner = cmp.subdirs[sub]
        assert not (inner.left_only or inner.right_only or inner.diff_files), inner.report()
    res = subprocess.run([sys.executable, "-m", "pipeline.tools", "gguf-py", "--source"], capture_output=True,
                         text=True)
    assert res.returncode == 0 and res.stdout.strip() == str(src)


def test_version_read_from_tool(toolchain):
    assert tools.read_build_version(toolchain.tool("llama-perplexity")) == (11312, "0c1e570")


def _user_tree(toolchain, tmp_path):
    """A user-provided llama.cpp tree (layout of a llama.cpp checkout: build/bin + converter)."""
    root = tmp_path / "llama.cpp"
    (root / "build").mkdir(parents=True)
    shutil.copytree(toolchain.bin_dir, root / "build" / "bin", symlinks=True)
    shutil.copy2(toolchain.convert_script, root / "convert_hf_to_gguf.py")
    os.symlink(toolchain.gguf_py, root / "gguf-py")
    os.symlink(toolchain.convert_script.parent / "conversion", root / "conversion")
    return root


def test_user_build_via_env(toolchain, tmp_path, monkeypatch):
    root = _user_tree(toolchain, tmp_path)
    monkeypatch.setenv("LLAMA_CPP_DIR", str(root))
    tc = tools.find_toolchain()
    assert tc.origin == "user" and tc.build_number == 11312 and tc.bin_dir == root / "build" / "bin"


def test_user_dir_not_a_build(tmp_path, monkeypatch):
    monkeypatch.setenv("LLAMA_CPP_DIR", str(tmp_path))
    with pytest.raises(PipelineError, match="has no llama-quantize"):
        tools.find_toolchain()


def test_broken_tool_binary(toolchain, tmp_path, monkeypatch):
    root = _user_tree(toolchain, tmp_path)
    perp = root / "build" / "bin" / "llama-perplexity"
    perp.unlink()
    perp.write_bytes(b"\x7fELF broken")
    perp.chmod(0o755)
    monkeypatch.setenv("LLAMA_CPP_DIR", str(root))
    with pytest.raises(PipelineError, match="llama-perplexity"):
        tools.find_toolchain()


def test_not_installed_message(tmp_path, monkeypatch):
    monkeypatch.delenv("LLAMA_CPP_DIR", raising=False)
    monkeypatch.setenv("GGUFPIPE_CACHE", str(tmp_path))
    with pytest.raises(PipelineError, match=r"not installed in .*: run `make tools`"):
        tools.find_toolchain()


def test_run_tool_failure_is_one_line(toolchain, tmp_path):
    log = tmp_path / "q.log"
    with pytest.raises(ToolError) as exc:
        tools.run_tool(toolchain, "llama-quantize", [tmp_path / "missing.gguf", tmp_path / "out.gguf", "Q4_K_M"], log)
    assert (exc.value.tool, exc.value.log) == ("llama-quantize", log) and exc.value.returncode not in (0, None)
    # the one line, as before ToolError had fields
    assert str(exc.value).startswith(f"llama-quantize failed (exit {exc.value.returncode}): ")
    assert str(exc.value).endswith(f" [log: {log}]") and "\n" not in str(exc.value)
    assert "missing.gguf" in log.read_text()
