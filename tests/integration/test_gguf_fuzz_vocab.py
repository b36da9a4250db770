"""The one GGUF reader on llama.cpp's own vendored vocabulary files (``vocab/ggml-vocab-*.gguf`` of the pinned
tree: 19 tokenizers, up to 262k tokens): every pipeline reader on each file as it is, then hypothesis sets their
counts, lengths, types and token-string lengths to edge values; each mutated file parses or raises one
PipelineError line naming it, within 1 s and a tracemalloc peak of 4 x its size + 1 MiB (helpers/gguf_mutate.py;
the unit tier fuzzes generated files: tests/unit/test_gguf_fuzz.py)."""

from __future__ import annotations

import pytest
from helpers.gguf_mutate import exercise, fields, get_field, interesting, parse_bounded, set_field
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.tools import pinned_dir

VOCAB_FILES = sorted((pinned_dir() / "vocab").glob("ggml-vocab-*.gguf"))


@pytest.mark.parametrize("path", VOCAB_FILES, ids=lambda p: p.stem.removeprefix("ggml-vocab-"))
def test_every_reader_on_vendored_vocab(path):
    assert parse_bounded(path) is None
    assert exercise(path) is None


@pytest.fixture(scope="module")
def vocab_fields():
    out = {}
    for p in VOCAB_FILES:
        if p.stat().st_size > 3 << 20:  # tracemalloc parses of the 4-16 MB ones take a second each
            continue
        data = p.read_bytes()
        out[p.name] = (data, [f for f in fields(data, max_strings=2) if f.kind in ("count", "len", "type")])
    return out


@settings(max_examples=40, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck))
@given(st.data())
def test_mutated_vendored_vocab(vocab_fields, tmp_path_factory, data):
    name = data.draw(st.sampled_from(sorted(vocab_fields)))
    buf, flds = vocab_fields[name]
    f = data.draw(st.sampled_from(flds))
    buf = set_field(buf, f, data.draw(st.sampled_from(interesting(f, get_field(buf, f), len(buf)))))
    path = tmp_path_factory.getbasetemp() / f"mutated-{name}"
    path.write_bytes(buf)
    parse_bounded(path)
