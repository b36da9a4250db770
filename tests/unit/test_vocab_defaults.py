"""``effective_vocab`` refuses what is not a GGUF."""

from __future__ import annotations

import pytest

from pipeline.errors import PipelineError
from pipeline.gguf.vocab_defaults import effective_vocab


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + b"\0" * 64)
    with pytest.raises(PipelineError, match="not a GGUF"):
        effective_vocab(bad)
    with pytest.raises(TypeError):
        effective_vocab(42)
