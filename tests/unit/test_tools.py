"""The quant types read from gguf-py's constants.py as text equal its LlamaFileType enum."""

from __future__ import annotations

from pathlib import Path


def test_file_types_read_from_gguf_source_equal_the_enum():
    """recipe.gguf_file_types reads gguf-py's constants.py as text (no import): same names as the enum."""
    import gguf

    from pipeline.recipe import file_types_in_source

    source = (Path(gguf.__file__).parent / "constants.py").read_text(encoding="utf-8")
    want = {m.name[len("MOSTLY_"):] for m in gguf.LlamaFileType if m.name.startswith("MOSTLY_")}
    assert len(want) > 30 and file_types_in_source(source) == want
    assert file_types_in_source("class Other:\n    MOSTLY_X = 1\n") == frozenset()


def test_the_compile_shows_its_percentage_every_five_points(tmp_path, capsys):
    """A compile of minutes is not minutes of silence: cmake's percentage every 5 points, and each tool it links; the
    whole output in the log. (The command prints cmake's line format; it runs no compiler.)"""
    import sys

    from pipeline.tools_install import _check_call

    lines = [f"[{p:3d}%] Building CXX object ggml/src/f{p}.cpp.o" for p in range(0, 101)]
    lines.insert(60, "[ 59%] Linking CXX executable ../bin/llama-quantize")
    script = "import sys; sys.stdout.write(sys.argv[1])"
    _check_call([sys.executable, "-c", script, "\n".join(lines) + "\n"], tmp_path / "build.log", progress=True)
    shown = [ln[:14] for ln in capsys.readouterr().out.splitlines()]
    assert shown[:3] == ["[tools] [  0%]", "[tools] [  5%]", "[tools] [ 10%]"], shown
    assert "[tools] [ 59%]" in shown and shown[-1] == "[tools] [100%]" and len(shown) == 22, shown
    assert (tmp_path / "build.log").read_text().count("\n") == len(lines)
