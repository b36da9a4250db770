"""What pipeline/cli/__init__.py and ``ggufpipe fit`` do for the one-line contract (issue #50 item 6), each case one
that the fuzz tests (tests/unit/test_fuzz_commands.py) found: flags out of range are argparse usage errors (exit 2),
a FIFO or a crafted header is one line, a closed stdout, a nesting too deep, a path too long and a file name that is
not UTF-8 give no traceback, an error line quoting a huge input stays readable."""

from __future__ import annotations

import json
import struct

import pytest
from helpers.cli_fuzz import ERROR_LINE, USAGE_LINE, run_main

from pipeline.gguf import read_header
from unit.test_fuzz_commands import FILE, GGUF, MANIFEST, project, tiny_gguf


@pytest.fixture
def root(tmp_path):
    project(tmp_path / "p", tiny_gguf(tmp_path / FILE))
    return tmp_path / "p"


def run(argv, root, limit=3.0):
    o = run_main(argv, root, root, limit)
    assert o.crash is None, o.crash
    return o


def one_error_line(o, usage=False) -> str:
    lines = [ln for ln in o.err.splitlines() if ERROR_LINE.match(ln)]
    assert len(lines) == 1 and bool(USAGE_LINE.match(lines[0])) == usage, o.err
    if not usage:
        assert o.err.count("\n") == 1, o.err
    return lines[0]


# ------------------------------------------------------------------ fit: every number in range, the GGUF a file


@pytest.mark.parametrize("flag,value", [
    ("--ctx", "0"), ("--ctx", "-1"), ("--ctx", "2147483648"), ("--ctx", "1e9"), ("--ctx", "nan"),
    ("--parallel", "0"), ("--parallel", "257"), ("--threads", "0"), ("--threads", "513"),
    ("--mem", "0"), ("--mem", "99999999999999T"), ("--mem", "lots"), ("--mem", "-8G"), ("--parallel", "--"),
])
def test_fit_flags_out_of_range_are_usage_errors(root, flag, value):
    """llama.cpp's own bounds: n_ctx int32, -np at most LLAMA_MAX_SEQ 256, GGML_MAX_N_THREADS 512; a memory size of 1
    byte to 2^63 - 1. ``--parallel=--`` is argparse's own hole (an empty list as the value)."""
    o = run(["fit", GGUF, "--mem", "8G", f"{flag}={value}"], root)
    assert o.code == 2, (o.code, o.out, o.err)
    assert one_error_line(o, usage=True).startswith(f"ggufpipe fit: error: argument {flag}: ")


@pytest.mark.parametrize("flag,value", [("--ctx", "2147483647"), ("--parallel", "256"), ("--threads", "512"),
                                        ("--mem", "8589934591G")])
def test_fit_at_the_largest_values_in_range_answers(root, flag, value):
    o = run(["fit", GGUF, "--mem", "8G", flag, value], root)
    assert o.code in (0, 1) and (o.code == 0 or one_error_line(o).startswith("error: does not fit: ")), o.err


def _scalar(data: bytes, key: str, value: bytes, vtype: int | None = None, path=None) -> bytes:
    """``data`` (a GGUF) with the 4-byte scalar ``key`` set to ``value`` (and its type to ``vtype``)."""
    h = read_header(path)
    _, end = h.kv_spans[key]
    out = bytearray(data)
    out[end - 4:end] = value
    if vtype is not None:
        out[end - 8:end - 4] = struct.pack("<I", vtype)
    return bytes(out)


@pytest.mark.parametrize("key,value,vtype,what", [
    ("llama.block_count", struct.pack("<I", 1000), None, "must be an integer 0..512 (llama.cpp's LLAMA_MAX_LAYERS), got 1000"),
    ("llama.attention.head_count", struct.pack("<f", float("nan")), 6, "must be an integer 0..4294967295"),
    ("llama.context_length", struct.pack("<f", 1.5), 6, "got 1.5"),
])
def test_fit_refuses_a_crafted_hyperparameter_naming_the_key(root, key, value, vtype, what):
    """A GGUF whose header parses but whose hyperparameters are no model's: one line naming the file and key (a
    block count of 4 billion would size every per-layer list of the memory model)."""
    path = root / GGUF
    path.write_bytes(_scalar(path.read_bytes(), key, value, vtype, path))
    o = run(["fit", GGUF, "--mem", "8G"], root)
    assert o.code == 1 and one_error_line(o).startswith(f"error: {GGUF}: {key}: ") and what in o.err, o.err


@pytest.mark.parametrize("which", ["gguf", "draft"])
def test_fit_refuses_a_fifo_without_waiting(root, which):
    fifo = root / "f.gguf"
    import os

    os.mkfifo(fifo)
    argv = ["fit", "f.gguf", "--mem", "8G"] if which == "gguf" else ["fit", GGUF, "--mem", "8G", "--draft", "f.gguf"]
    o = run(argv, root)
    assert o.code == 1 and "f.gguf: not a regular file" in one_error_line(o), o.err


# ------------------------------------------------------------------ main: no traceback for what came from outside


def test_a_manifest_nested_too_deeply_is_one_line(root):
    (root / MANIFEST).write_text("[" * 100_000 + "]" * 100_000)
    o = run(["verify", GGUF], root)
    assert o.code == 1 and one_error_line(o).startswith("error: "), o.err


def test_a_path_too_long_is_one_line_and_short(root):
    o = run(["clean-logits", "--work", "a" * 5000], root)
    assert o.code == 1, o.err
    line = one_error_line(o)
    assert "File name too long" in line and len(line) <= 2000, line[:300]


def test_a_file_name_that_is_not_utf8_is_printed_escaped(root):
    """A name from a non-UTF-8 file system reaches argv surrogate-escaped; stdout is strict UTF-8 here, as a
    terminal's: the name is printed with backslash escapes, not as a UnicodeEncodeError."""
    name = b"m-\xff.gguf".decode("utf-8", "surrogateescape")
    art = root / "artifacts" / "m"
    (art / FILE).rename(art / name)
    m = json.loads((art / "manifest.json").read_text())
    m["artifacts"][0]["file"] = name
    (art / "manifest.json").write_text(json.dumps(m))
    o = run(["verify", str(art / name)], root)
    assert o.code == 0 and "OK  " in o.out and "\\udcff" in o.out, (o.out, o.err)


def test_an_error_line_quoting_a_huge_input_is_cut_in_the_middle(root):
    m = json.loads((root / MANIFEST).read_text())
    m["artifacts"][0]["quant_type"] = "Q" * 300_000
    (root / MANIFEST).write_text(json.dumps(m))
    o = run(["verify", GGUF], root)
    line = one_error_line(o)
    assert o.code == 1 and len(line) <= 2000 and "characters cut" in line and line.startswith(f"error: {GGUF}: "), \
        line[:300]
