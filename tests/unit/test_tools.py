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
