"""The one GGUF reader (pipeline/gguf/reader.py) on malformed input: hypothesis mutates generated GGUFs (a tiny
model with an MTP block, every value and block type with split keys, a 3000-token vocabulary) at their counts,
lengths, types, shapes, offsets and split keys, flips, cuts, inserts and deletes bytes, and writes files whose
split keys have any type. Every input must parse or raise one PipelineError line naming the file (so must every
pipeline reader of the result: facts, vocab checks, MTP, split, hub, imatrix), within 1 s and a tracemalloc peak
of 4 x its size + 1 MiB (helpers/gguf_mutate.py). Bounded: about 20 s in all. The vendored llama.cpp vocab files
are fuzzed in tests/integration/test_gguf_fuzz_vocab.py; a million inputs in bench/fuzz_gguf.py."""

from __future__ import annotations

import os

import pytest
from gguf import GGUFValueType, GGUFWriter
from helpers.gguf_mutate import exercise, fields, get_field, interesting, parse_bounded, seed_files, set_field
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipeline.errors import PipelineError
from pipeline.gguf import read_header

SETTINGS = settings(max_examples=int(os.environ.get("GGUF_FUZZ_EXAMPLES", 800)), deadline=None,
                    derandomize=not os.environ.get("GGUF_FUZZ_EXAMPLES"), database=None,
                    suppress_health_check=list(HealthCheck))


class Seeds(tuple):
    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Seeds({self[1]})"


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf-fuzz")
    files = seed_files(folder / "seeds")
    return Seeds(({name: (path.read_bytes(), fields(path.read_bytes())) for name, path in files.items()}, folder))


def check(folder, data: bytes) -> str | None:
    path = folder / "input.gguf"
    path.write_bytes(data)
    err = parse_bounded(path)
    assert exercise(path) == err
    return err


def test_tensor_bytes_fill_the_data_section(seeds, tmp_path):
    """Per-tensor bytes (shape, block size, type size) plus alignment padding are the data section exactly."""
    from helpers.gguf_factory import read_tokenizer, tiny_llama

    data, folder = seeds
    paths = [folder / "seeds" / f"{name}.gguf" for name in data]
    tok = read_tokenizer(folder / "seeds" / "tiny.gguf")
    paths += [tiny_llama(tmp_path / f"t{i}.gguf", tok, n_layer=i, n_embd=32, n_head=4, n_head_kv=2, n_ff=64,
                         dtype=dtype) for i, dtype in ((1, "F16"), (3, "F32"))]
    for path in paths:
        h = read_header(path)
        padded = sum(-(-t.n_bytes // h.alignment) * h.alignment for t in h.tensors)
        assert padded == h.file_size - h.data_offset, path.name
        assert [t.offset for t in h.tensors] == sorted(t.offset for t in h.tensors)
        assert all(t.offset % h.alignment == 0 for t in h.tensors)
    kinds = read_header(folder / "seeds" / "kinds.gguf")
    assert kinds.alignment == 64
    assert {t.type_name: t.n_bytes for t in kinds.tensors} == {"F32": 128, "F16": 16, "Q8_0": 136, "Q4_K": 144,
                                                                "IQ4_NL": 36, "I32": 12}


@SETTINGS
@given(st.data())
def test_mutated_fields(seeds, data):
    """Counts, lengths, types, dims, offsets and split/alignment/token-id values set to edge values."""
    (files, folder) = seeds
    name = data.draw(st.sampled_from(sorted(files)))
    buf, flds = files[name]
    for _ in range(data.draw(st.integers(1, 3))):
        f = data.draw(st.sampled_from(flds))
        buf = set_field(buf, f, data.draw(st.sampled_from(interesting(f, get_field(buf, f), len(buf)))))
    check(folder, buf)


@SETTINGS
@given(st.data())
def test_mutated_bytes(seeds, data):
    """Byte flips, cuts, insertions and deletions, mostly in the header."""
    (files, folder) = seeds
    name = data.draw(st.sampled_from(sorted(files)))
    buf = bytearray(files[name][0])
    for _ in range(data.draw(st.integers(1, 4))):
        kind = data.draw(st.sampled_from(["flip", "cut", "insert", "delete", "byte"]))
        pos = data.draw(st.integers(0, min(len(buf), 4096)))
        if kind == "flip" and pos < len(buf):
            buf[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "byte" and pos < len(buf):
            buf[pos] = data.draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF]))
        elif kind == "cut":
            del buf[pos:]
        elif kind == "insert":
            buf[pos:pos] = data.draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del buf[pos:pos + data.draw(st.integers(1, 16))]
    check(folder, bytes(buf))


_VALUES = st.one_of(
    st.tuples(st.sampled_from([GGUFValueType.UINT16, GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64,
                               GGUFValueType.INT64, GGUFValueType.UINT8]), st.integers(0, 2**7 - 1)),
    st.tuples(st.just(GGUFValueType.INT32), st.integers(-(2**31), -1)),
    st.tuples(st.just(GGUFValueType.STRING), st.text(max_size=8)),
    st.tuples(st.just(GGUFValueType.FLOAT32), st.floats(width=32)),
    st.tuples(st.just(GGUFValueType.BOOL), st.booleans()),
    st.tuples(st.just(GGUFValueType.ARRAY), st.lists(st.integers(0, 9), min_size=1, max_size=3)),
)


@SETTINGS
@given(st.dictionaries(st.sampled_from(["split.no", "split.count", "split.tensors.count", "general.file_type",
                                        "general.architecture", "tokenizer.ggml.eos_token_id",
                                        "tokenizer.ggml.tokens", "imatrix.chunk_count", "imatrix.datasets"]),
                       _VALUES, max_size=5))
def test_any_type_for_split_and_consumer_keys(seeds, kvs):
    """Well-formed files whose split, file-type, architecture, token and imatrix keys have any GGUF type."""
    (_, folder) = seeds
    path = folder / "typed.gguf"
    w = GGUFWriter(path, "llama") if "general.architecture" not in kvs else GGUFWriter(path, None)
    for key, (vtype, value) in kvs.items():
        if vtype == GGUFValueType.ARRAY:
            w.add_key_value(key, value, vtype, sub_type=GGUFValueType.INT32)
        else:
            w.add_key_value(key, value, vtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    assert parse_bounded(path) is None
    assert exercise(path) is None


def test_huge_counts_refused_before_allocating(seeds):
    """A count of 2**63-1 keys, tensors, array elements or string bytes: one line, at once."""
    (files, folder) = seeds
    buf, flds = files["vocab"]
    for f in flds:
        if f.kind in ("count", "len"):
            err = check(folder, set_field(buf, f, 2**63 - 1))
            assert err is not None and "truncated GGUF" in err, (f, err)
    with pytest.raises(PipelineError, match="input.gguf: truncated GGUF"):
        read_header(folder / "input.gguf")


def _crafted(path, n_tensors: int, n_keys: int, array_keys: bool = False, dims: tuple[int, ...] = (0,)):
    """A header of ``n_keys`` tiny keys (uint8 values, or empty uint32 arrays) and ``n_tensors`` empty F32 tensors,
    written byte by byte (GGUFWriter would take minutes for tens of thousands of entries)."""
    import struct

    def s(b: bytes) -> bytes:
        return struct.pack("<Q", len(b)) + b

    out = [b"GGUF", struct.pack("<Iqq", 3, n_tensors, n_keys)]
    for i in range(n_keys):
        value = struct.pack("<IIQ", 9, 4, 0) if array_keys else struct.pack("<IB", 0, 1)
        out.append(s(f"k{i}".encode()) + value)
    for i in range(n_tensors):
        out.append(s(f"t{i}".encode()) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}q", *dims)
                   + struct.pack("<IQ", 0, 0))
    data = b"".join(out)
    path.write_bytes(data + b"\0" * (-len(data) % 32))
    return path


@pytest.mark.parametrize("n_tensors,n_keys,array_keys,dims", [
    (0, 40_000, False, (0,)), (0, 8_000, True, (0,)), (16_000, 0, False, (0,)),
    (8_000, 0, False, (0, 1_000_003, 1_000_003, 1_000_003)), (0, 12_000, False, (0,)), (2_000, 0, False, (0,))])
def test_many_tiny_entries_stay_in_the_memory_bound(tmp_path, n_tensors, n_keys, array_keys, dims):
    """Headers of tens of thousands of tiny entries (Python objects of a fixed size each, far more than their
    bytes): each parses within 4 x size + 1 MiB, or is refused in one line before its objects are made (the
    reader charges each entry its measured cost, pipeline/gguf/reader.py). 12,000 keys and 2,000 tensors parse."""
    path = _crafted(tmp_path / "crafted.gguf", n_tensors, n_keys, array_keys, dims)
    err = parse_bounded(path)  # raises Crash past 1 s or past the memory bound
    if n_keys == 12_000 or n_tensors == 2_000:
        assert err is None
    else:
        assert err is not None and "would take more memory than the reader allows a file of this size" in err, err
