"""Seed GGUFs, their integer fields and mutations of them, and every pipeline reader run on one file: shared by
tests/unit/test_gguf_fuzz.py (hypothesis), tests/integration/test_gguf_fuzz_vocab.py (llama.cpp's vendored
vocab files) and bench/fuzz_gguf.py (atheris, a million inputs).

:func:`fields` walks a well-formed GGUF and lists where its counts, lengths, types, shapes and offsets lie, so
that a mutation can aim at them (a random byte flip rarely hits a count); :func:`exercise` runs
``pipeline.gguf.read_header`` and every consumer of its result, and raises :class:`Crash` for anything but a
one-line :class:`~pipeline.errors.PipelineError` naming the file (or, from the vocabulary mirror, the
``ValueError`` that stands for llama.cpp's refusal)."""

from __future__ import annotations

import random
import struct
import time
import tracemalloc
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from pipeline.errors import PipelineError

# bounds of the issue (#17): one parse per input
MAX_SECONDS = 1.0
MAX_PEAK = lambda size: 4 * size + (1 << 20)  # noqa: E731  tracemalloc peak, bytes


@dataclass(frozen=True)
class Field:
    offset: int
    size: int  # bytes: 4 or 8 (or the scalar's size)
    kind: str  # "count", "len", "type", "dims", "dim", "offset", "value"
    label: str


class Crash(AssertionError):
    """A reader broke the contract: another exception, several lines, the file not named, too slow or too big."""


# --------------------------------------------------------------------------- seeds

def synthetic_tokens(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyzĠäöü日本<>|_"
    out = ["<unk>", "<s>", "</s>"]
    seen = set(out)
    while len(out) < n:
        t = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        if t not in seen:
            seen.add(t)
            out.append(t)
    return out


def write_vocab(path: Path, n_tokens: int, seed: int = 0) -> Path:
    """A vocab-only GGUF (a large string array): gpt2 BPE, scores, token types, merges, a chat template."""
    tokens = synthetic_tokens(n_tokens, seed)
    w = GGUFWriter(path, "llama")
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_scores([float(-i) for i in range(n_tokens)])
    w.add_token_types([3 if i < 3 else 1 for i in range(n_tokens)])
    w.add_token_merges([f"{a} {b}" for a, b in zip(tokens[3:200], tokens[4:201], strict=False)])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(False)
    w.add_chat_template("{% for m in messages %}<|im_start|>{{ m.content }}<|im_end|>{% endfor %}")
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()
    return path


def write_kinds(path: Path, split: tuple[int, int, int] | None = (0, 2, 5)) -> Path:
    """Every GGUF value type as a scalar and an array, split keys, imatrix keys, ``general.alignment`` 64, and
    tensors of several ggml block layouts (F32, F16, Q8_0, Q4_K, IQ4_NL, I32)."""
    w = GGUFWriter(path, "llama")
    w.add_file_type(7)
    w.add_custom_alignment(64)
    w.add_string("general.name", "kinds")
    for i, t in enumerate((GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
                           GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.FLOAT32, GGUFValueType.BOOL,
                           GGUFValueType.UINT64, GGUFValueType.INT64, GGUFValueType.FLOAT64)):
        value = True if t == GGUFValueType.BOOL else (1.5 if t in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64) else 7)
        w.add_key_value(f"kinds.scalar.{i}", value, t)
        w.add_key_value(f"kinds.array.{i}", [value] * 3, GGUFValueType.ARRAY, sub_type=t)
    w.add_array("kinds.strings", ["a", "bc", ""])
    if split:
        w.add_uint16("split.no", split[0])
        w.add_uint16("split.count", split[1])
        w.add_int32("split.tensors.count", split[2])
    w.add_array("imatrix.datasets", ["botchan-calib.txt"])
    w.add_uint32("imatrix.chunk_count", 4)
    w.add_uint32("imatrix.chunk_size", 256)
    w.add_uint32("llama.nextn_predict_layers", 1)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((4, 8), dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(8, dtype=np.float16))
    for name, qtype, rows, row_bytes in (("blk.0.attn_q.weight", GGMLQuantizationType.Q8_0, 2, 68),
                                         ("blk.0.ffn_up.weight", GGMLQuantizationType.Q4_K, 1, 144),
                                         ("blk.1.nextn.eh_proj.weight", GGMLQuantizationType.IQ4_NL, 2, 18)):
        w.add_tensor(name, rng.integers(0, 255, (rows, row_bytes), dtype=np.uint8), raw_dtype=qtype)
    w.add_tensor("blk.0.in_sum2", np.arange(3, dtype=np.int32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def seed_files(folder: Path) -> dict[str, Path]:
    """The generated seeds: a tiny loadable model with an MTP block (tests/helpers/gguf_factory.py), every
    value and block type with split keys, and a vocab-only file with a 3000-token string array."""
    from .gguf_factory import KV, Tokenizer, tiny_llama

    folder.mkdir(parents=True, exist_ok=True)
    tokens = synthetic_tokens(300)
    tok = Tokenizer({
        "tokenizer.ggml.model": KV(GGUFValueType.STRING, "gpt2"),
        "tokenizer.ggml.pre": KV(GGUFValueType.STRING, "smollm"),
        "tokenizer.ggml.tokens": KV(GGUFValueType.ARRAY, tokens, GGUFValueType.STRING),
        "tokenizer.ggml.token_type": KV(GGUFValueType.ARRAY, [3, 3, 3] + [1] * 297, GGUFValueType.INT32),
        "tokenizer.ggml.merges": KV(GGUFValueType.ARRAY, [f"{a} {b}" for a, b in zip(tokens[3:50], tokens[4:51],
                                                                                        strict=False)], GGUFValueType.STRING),
        "tokenizer.ggml.bos_token_id": KV(GGUFValueType.UINT32, 1),
        "tokenizer.ggml.eos_token_id": KV(GGUFValueType.UINT32, 2),
        "tokenizer.chat_template": KV(GGUFValueType.STRING, "{{ messages }}"),
    })
    # an MTP block where the installed gguf-py names its tensors (the pinned one does; PyPI's 0.19.0 of the light
    # venv, `make test-fast`, does not): the "kinds" seed has a hand-written nextn tensor either way
    from gguf.constants import MODEL_ARCH, MODEL_TENSOR, MODEL_TENSORS

    eh_proj = getattr(MODEL_TENSOR, "NEXTN_EH_PROJ", None)
    nextn = 1 if eh_proj is not None and eh_proj in MODEL_TENSORS.get(MODEL_ARCH.EXAONE4, ()) else 0
    return {
        "tiny": tiny_llama(folder / "tiny.gguf", tok, n_layer=1, n_embd=16, n_head=2, n_head_kv=1, n_ff=32,
                           nextn_layers=nextn, tie_embeddings=True),
        "kinds": write_kinds(folder / "kinds.gguf"),
        "vocab": write_vocab(folder / "vocab.gguf", 3000),
    }


# --------------------------------------------------------------------------- where the integers lie

_FMT = "BbHhIif?--Qqd"  # GGUF value type -> struct format (8 string, 9 array: not fixed-size)


def fields(data: bytes, max_strings: int = 4) -> list[Field]:
    """The integer fields of a well-formed GGUF: header counts, each key's length and type, string lengths,
    array element types and counts (and the first ``max_strings`` element lengths of a string array), each
    tensor's name length, n_dims, dims, type and offset; split.* and general.alignment values."""
    out = [Field(8, 8, "count", "n_tensors"), Field(16, 8, "count", "n_kv")]
    n_tensors, n_kv = struct.unpack_from("<qq", data, 8)
    pos = 24

    def u(fmt: str, p: int) -> int:
        return struct.unpack_from(fmt, data, p)[0]

    for _ in range(n_kv):
        out.append(Field(pos, 8, "len", "key length"))
        n = u("<Q", pos)
        key = data[pos + 8:pos + 8 + n].decode("utf-8", "replace")
        pos += 8 + n
        out.append(Field(pos, 4, "type", f"{key} type"))
        vtype = u("<I", pos)
        pos += 4
        if vtype == 8:
            out.append(Field(pos, 8, "len", f"{key} string length"))
            pos += 8 + u("<Q", pos)
        elif vtype == 9:
            et = u("<I", pos)
            out.append(Field(pos, 4, "type", f"{key} element type"))
            out.append(Field(pos + 4, 8, "count", f"{key} count"))
            count = u("<Q", pos + 4)
            pos += 12
            if et == 8:
                for i in range(count):
                    if i < max_strings or i == count - 1:
                        out.append(Field(pos, 8, "len", f"{key}[{i}] length"))
                    pos += 8 + u("<Q", pos)
            else:
                pos += struct.calcsize("<" + _FMT[et]) * count
        else:
            size = struct.calcsize("<" + _FMT[vtype])
            if key.startswith("split.") or key == "general.alignment" or key.endswith("_token_id"):
                out.append(Field(pos, size, "value", key))
            pos += size
    for i in range(n_tensors):
        out.append(Field(pos, 8, "len", f"tensor {i} name length"))
        pos += 8 + u("<Q", pos)
        out.append(Field(pos, 4, "dims", f"tensor {i} n_dims"))
        n_dims = u("<I", pos)
        pos += 4
        for d in range(n_dims):
            out.append(Field(pos, 8, "dim", f"tensor {i} ne[{d}]"))
            pos += 8
        out.append(Field(pos, 4, "type", f"tensor {i} ggml type"))
        out.append(Field(pos + 4, 8, "offset", f"tensor {i} offset"))
        pos += 12
    return out


def interesting(field: Field, old: int, size: int) -> list[int]:
    bits = field.size * 8
    vals = [0, 1, 2, 3, 4, 7, 8, 13, 24, 31, 32, 63, 64, 255, 256, 4095, 2**15, 2**16 - 1, 2**31 - 1, 2**31,
            2**32 - 1, 2**32, 2**62, 2**63 - 1, 2**63, 2**64 - 1, size, size - 1, size + 1, 2 * size,
            old + 1, old - 1, old * 2, old // 2, old + 8, old - 8, old ^ (1 << (bits - 1))]
    return sorted({v & ((1 << bits) - 1) for v in vals})


def set_field(data: bytes, field: Field, value: int) -> bytes:
    return data[:field.offset] + (value & ((1 << field.size * 8) - 1)).to_bytes(field.size, "little") + \
        data[field.offset + field.size:]


def get_field(data: bytes, field: Field) -> int:
    return int.from_bytes(data[field.offset:field.offset + field.size], "little")


# --------------------------------------------------------------------------- the contract

def _check_error(exc: BaseException, path: Path, what: str) -> str:
    msg = str(exc)
    if "\n" in msg or str(path) not in msg:
        raise Crash(f"{what}: error message not one line naming the file: {msg!r}")
    return msg


def parse_bounded(path: Path) -> str | None:
    """One fresh parse of ``path`` (no cache) within the bounds: None when it parses, else its one-line error."""
    from pipeline.gguf import reader

    size = path.stat().st_size
    # CPU time of this process, not wall time: the bound is on the parse's own work, and on two busy cores a test
    # worker can wait longer than the bound for a parse of milliseconds (docs/testing.md, 2026-12-04 evening)
    t0 = time.process_time()
    try:
        reader._read_header(path)
        err = None
    except PipelineError as exc:
        err = _check_error(exc, path, "read_header")
    except Exception as exc:  # noqa: BLE001  the contract under test
        raise Crash(f"read_header: {type(exc).__name__}: {exc}") from exc
    seconds = time.process_time() - t0
    if seconds > MAX_SECONDS:
        raise Crash(f"read_header took {seconds:.2f} s of CPU on {size} bytes")
    tracemalloc.start()
    try:
        try:
            reader._read_header(path)
        except PipelineError:
            pass
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if peak > MAX_PEAK(size):
        raise Crash(f"read_header: tracemalloc peak {peak} bytes on a {size}-byte file")
    return err


def exercise(path: Path) -> str | None:
    """``read_header`` and every pipeline reader of its result on ``path``: None when the header parsed, else its
    one-line error; :class:`Crash` when anything breaks the contract."""
    from pipeline.gguf import general_metadata, read_facts, read_header, reader, tokenizer_sha256, vocab_defaults
    from pipeline.stages import hubfiles, imatrix, mtp, split, vocab

    reader._PARSED.clear()
    try:
        h = read_header(path)
    except PipelineError as exc:
        return _check_error(exc, path, "read_header")
    except Exception as exc:  # noqa: BLE001
        raise Crash(f"read_header: {type(exc).__name__}: {exc}") from exc
    calls = [
        ("facts", lambda: h.facts()),
        ("get", lambda: [h.get(k) for k in h.metadata]),
        ("raw arrays", lambda: [(h.array(k, raw_strings=True), h.array_bytes(k)) for k in h.metadata]),
        ("tensor sizes", lambda: [t.type_name for t in h.tensors]),
        ("tokenizer_sha256", lambda: tokenizer_sha256(path)),
        ("general_metadata", lambda: general_metadata(path)),
        ("read_facts", lambda: read_facts(path, with_sha256=False)),
        ("mtp_facts", lambda: mtp.mtp_facts(path)),
        ("shard_header", lambda: split.check_header(path, split.shard_header(path), 1, 2, 5)),
        ("oversized_tensor", lambda: split.oversized_tensor(h, 1 << 20)),
        ("vocab facts", lambda: vocab._vocab_facts(path)),
        ("chat_format", lambda: hubfiles.chat_format(path)),
        ("imatrix_facts", lambda: imatrix.imatrix_facts(path)),
    ]
    for name, call in calls:
        try:
            call()
        except PipelineError as exc:
            _check_error(exc, path, name)
        except Exception as exc:  # noqa: BLE001
            raise Crash(f"{name}: {type(exc).__name__}: {exc}") from exc
    for name, call in (("effective_vocab", vocab_defaults.effective_vocab), ("eog_set", vocab_defaults.eog_set)):
        try:
            call(path)
        except PipelineError as exc:
            _check_error(exc, path, name)
        except ValueError:
            pass  # llama.cpp refuses this vocabulary: vocab.py makes it a PipelineError
        except Exception as exc:  # noqa: BLE001
            raise Crash(f"{name}: {type(exc).__name__}: {exc}") from exc
    return None
