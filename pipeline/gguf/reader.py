"""The project's one GGUF reader, standard library only: what ``ggufpipe verify`` needs on a device, and what
every stage reads of a GGUF (header keys, vocabulary arrays on demand, per-tensor facts).

It reads what llama.cpp's ``gguf_init_from_file`` reads before the tensor data (``ggml/src/gguf.cpp`` of the
pinned build b11312) and refuses a file where that function would: magic, version (2 or 3), tensor and
key/value counts, the key/value section (scalars and strings kept, arrays measured and skipped: their elements
are decoded only when asked for, :meth:`GGUFHeader.array`), ``general.alignment``, and every tensor info
(name, shape, ggml type, offset). From them it derives the data section's start, each tensor's size in bytes
(block size and bytes per block of its type, :mod:`pipeline.gguf.types`) and checks that the offsets are the
ones llama.cpp expects and that the data lies inside the file.

The bytes may be untrusted (devices verify files pulled from storage): every malformed input raises a
:class:`~pipeline.errors.PipelineError` of one line naming the file and what is wrong, never another
exception. Counts and lengths are checked against the bytes left in the file before anything is allocated
or looped over (tests/unit/test_gguf_fuzz.py, bench/fuzz_gguf.py).

No numpy, no ``gguf`` package: a device install stays small. tests/integration/test_device.py checks the
facts derived here against gguf-py's ``GGUFReader`` on real files.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
from array import array
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.fsutil import file_identity, sha256_file
from pipeline.gguf.types import (
    ARRAY,
    DEFAULT_ALIGNMENT,
    GGML_TYPES,
    GGUF_MAGIC,
    MAX_DIMS,
    MAX_NAME,
    SCALARS,
    STRING,
    UINT32,
    file_type_name,
    ggml_type_name,
    tensor_nbytes,
)

_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")
# the fewest bytes one entry can take: a key/value (key length, a 1-byte key, type, a 1-byte value) and a
# tensor info (name length, n_dims, type, offset): counts above (bytes left) / these are truncated files
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_BYTES = 8 + 4 + 4 + 8
# The reader's memory bound (issue #17): parsing a file takes at most 4 x its size + 1 MiB (tracemalloc peak). A
# real GGUF is far inside (tens of keys, ~1,000 tensors, megabytes to gigabytes of data); a header of tens of
# thousands of tiny entries is not, since each costs Python objects of a fixed size: measured on CPython 3.11,
# 94-121 bytes a key (dict slot, key string), 273-300 a tensor (TensorInfo, name, shape tuple), plus an
# ArrayValue's 4 integers. These upper bounds are charged while parsing, and a file that would pass the budget is
# refused in one line before its objects are made.
_KV_COST, _ARRAY_COST, _TENSOR_COST, _DIM_COST = 128, 192, 320, 40
_BUDGET_FACTOR, _BUDGET_EXTRA = 4, 1 << 20


@dataclass(frozen=True, slots=True)
class ArrayValue:
    """A metadata array, measured but not decoded: element type and count (and where its elements lie in
    the file, for :meth:`GGUFHeader.array`)."""

    elem_type: int
    count: int
    offset: int = field(default=0, compare=False, repr=False)  # absolute: the first element
    end: int = field(default=0, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGML ne[0..n_dims)
    ggml_type: int
    offset: int  # absolute: from the start of the file
    n_elements: int
    n_bytes: int

    @property
    def type_name(self) -> str:
        return ggml_type_name(self.ggml_type)


@dataclass
class GGUFFacts:
    """What the manifest records of a GGUF file."""

    file: str
    quant_type: str
    sha256: str
    size_bytes: int
    bits_per_weight: float
    gguf_version: int
    tensor_count: int
    parameter_count: int
    architecture: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # scalars as Python numbers/bools, strings as str, arrays as ArrayValue
    alignment: int
    data_offset: int  # where the tensor data section starts
    tensors: tuple[TensorInfo, ...]
    file_size: int
    # per key, in metadata order: its bytes [start, end) in the file, flat, and its GGUF value type (compact: a
    # crafted header of many tiny keys must not cost more memory than needed; see kv_spans / value_types)
    spans: array = field(default_factory=lambda: array("Q"), compare=False, repr=False)
    types: bytes = field(default=b"", compare=False, repr=False)

    @cached_property
    def kv_spans(self) -> dict[str, tuple[int, int]]:
        """key -> the bytes [start, end) of its whole key/value entry in the file."""
        s = self.spans
        return {k: (s[2 * i], s[2 * i + 1]) for i, k in enumerate(self.metadata)}

    @cached_property
    def value_types(self) -> dict[str, int]:
        """key -> its GGUF value type (:mod:`pipeline.gguf.types`; ARRAY for arrays)."""
        return dict(zip(self.metadata, self.types, strict=True))

    @property
    def file_type(self) -> str:
        return file_type_name(self.metadata.get("general.file_type"))

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_end(self) -> int:
        return max((t.offset + t.n_bytes for t in self.tensors), default=self.data_offset)

    def facts(self, sha256: str = "") -> GGUFFacts:
        """The :class:`GGUFFacts` of this file (what the manifest records)."""
        n_params, n_bytes = self.parameter_count, sum(t.n_bytes for t in self.tensors)
        arch = self.metadata.get("general.architecture", "")
        return GGUFFacts(
            file=self.path.name, quant_type=self.file_type, sha256=sha256, size_bytes=self.file_size,
            bits_per_weight=round(n_bytes * 8 / n_params, 4) if n_params else 0.0, gguf_version=self.version,
            tensor_count=len(self.tensors), parameter_count=n_params,
            architecture=arch if isinstance(arch, str) else str(arch),
        )

    def get(self, key: str, default: Any = None) -> Any:
        """The value of ``key`` with arrays decoded (:meth:`array`), like gguf-py's ``ReaderField.contents()``."""
        value = self.metadata.get(key, default)
        return self.array(key) if isinstance(value, ArrayValue) else value

    def array(self, key: str, raw_strings: bool = False) -> list | None:
        """The elements of the array ``key`` (None when absent or not an array): numbers, bools, or strings
        (``str``, undecodable bytes kept as surrogates; ``bytes`` with ``raw_strings``). Read from the file
        on demand: a 256k-token vocabulary is not decoded unless asked for."""
        value = self.metadata.get(key)
        if not isinstance(value, ArrayValue):
            return None
        data = self._span(key, value.offset, value.end)
        if value.elem_type == STRING:
            out, pos, size = [], 0, len(data)
            for _ in range(value.count):
                if pos + 8 > size:
                    raise self._changed(key)
                (n,) = _U64.unpack_from(data, pos)
                end = pos + 8 + n
                if end > size:
                    raise self._changed(key)
                s = data[pos + 8:end]
                out.append(s if raw_strings else s.decode("utf-8", "surrogateescape"))
                pos = end
            return out
        st = SCALARS.get(value.elem_type)
        if st is None or len(data) != st.size * value.count:
            raise self._changed(key)
        return list(struct.unpack(f"<{value.count}{st.format[1:]}", data))

    def array_bytes(self, key: str) -> bytes | None:
        """The raw bytes of the elements of a numeric array ``key`` (None when absent or not one)."""
        value = self.metadata.get(key)
        if not isinstance(value, ArrayValue) or value.elem_type == STRING:
            return None
        return self._span(key, value.offset, value.end)

    def _span(self, key: str, start: int, end: int) -> bytes:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(start)
                data = fh.read(end - start)
        except OSError as exc:
            raise PipelineError(f"{self.path}: cannot read: {exc.strerror or exc}") from None
        if len(data) != end - start:
            raise self._changed(key)
        return data

    def _changed(self, key: str) -> PipelineError:
        return PipelineError(f"{self.path}: key {key!r}: the array's bytes differ from the header read earlier "
                             "(the file changed while it was read)")


class _Truncated(Exception):
    pass


_PARSED: dict[tuple, GGUFHeader] = {}  # (path, device, inode, size, mtime) -> header: see read_header
_PARSED_MAX = 64


def read_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse and check the header of the GGUF at ``path``; a PipelineError (one line) when llama.cpp would
    refuse it or its tensor data does not fit in the file.

    Parsed once per process for the same path and file (device, inode, size, mtime): publish reads each
    GGUF's header for its facts, imatrix keys and MTP tensors, twice over (about 20 ms each on the demo's
    49k-token vocabulary). A rewritten or replaced file is parsed again."""
    path = Path(path)
    try:
        key = (os.fspath(path), *file_identity(path))
    except (OSError, ValueError):
        key = None  # open() below gives the error
    if key in _PARSED:
        return _PARSED[key]
    header = _read_header(path)
    if key is not None:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        _PARSED[key] = header
    return header


def _read_header(path: Path) -> GGUFHeader:
    try:
        with open(path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            magic = fh.read(4)
            if magic != GGUF_MAGIC:
                raise PipelineError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return parse_buffer(buf, path, size)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:  # open() of a path with a NUL byte
        raise PipelineError(f"{path!r}: cannot read: {exc}") from None


def parse_buffer(buf: Any, path: Path, size: int | None = None) -> GGUFHeader:
    """The checks of :func:`read_header` on the bytes of a GGUF (a memory map or ``bytes``; ``path`` names it
    in messages and is where :meth:`GGUFHeader.array` reads from). Not cached; bench/fuzz_gguf.py feeds it."""
    size = len(buf) if size is None else size
    if bytes(buf[:4]) != GGUF_MAGIC:
        raise PipelineError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}, expected b'GGUF')")
    try:
        return _parse(buf, path, size)
    except _Truncated:
        raise PipelineError(f"{path}: truncated GGUF: the header ends past the end of the file "
                            f"({size} bytes)") from None


def _parse(buf: Any, path: Path, size: int) -> GGUFHeader:
    p = _Parser(buf, path, size)
    version, pos = p.header()
    meta, spans, types, pos = p.kv_section(pos)
    alignment = p.alignment(meta, types)
    infos, pos = p.tensor_infos(pos)
    data_offset = p.place_tensors(infos, pos, alignment)
    return GGUFHeader(path, version, meta, alignment, data_offset, tuple(infos), size, spans, bytes(types))


class _Parser:
    """One parse of a GGUF header (:func:`_parse`): the bytes, their size, the entry counts and the memory
    charged so far. The loops bind methods to locals: a vocabulary or ~1,000 tensors go through them."""

    __slots__ = ("buf", "path", "size", "n_tensors", "n_kv", "budget", "cost")

    def __init__(self, buf: Any, path: Path, size: int) -> None:
        self.buf, self.path, self.size = buf, path, size
        self.n_tensors = self.n_kv = 0
        self.budget = _BUDGET_FACTOR * size + _BUDGET_EXTRA - (256 << 10)  # less what any parse allocates besides entries
        self.cost = 0

    def bad(self, msg: str) -> PipelineError:
        return PipelineError(f"{self.path}: unreadable GGUF header: {msg}")

    def unpack(self, st: struct.Struct, pos: int) -> tuple[Any, int]:
        end = pos + st.size
        if end > self.size:
            raise _Truncated
        return st.unpack_from(self.buf, pos)[0], end

    def string(self, pos: int) -> tuple[str, int]:
        n, pos = self.unpack(_U64, pos)
        end = pos + n
        if end > self.size:
            raise _Truncated
        return bytes(self.buf[pos:end]).decode("utf-8", "surrogateescape"), end

    def charge(self, amount: int, what: str | None) -> None:
        """Charge an entry's cost; past the budget, refuse the file (``what``: what is charged; None: only add)."""
        self.cost += amount
        if what and self.cost > self.budget:
            raise self.bad(f"{self.n_kv} keys and {self.n_tensors} tensors in {self.size} bytes: {what} would take "
                           f"more memory than the reader allows a file of this size ({_BUDGET_FACTOR} x size + 1 MiB)")

    def header(self) -> tuple[int, int]:
        """The version and the entry counts (kept for the sections); returns (version, position after them)."""
        if self.size < 24:
            raise _Truncated
        version, pos = self.unpack(_U32, 4)
        if version & 0xFFFF == 0:
            raise self.bad(f"version {version:#x}: a big-endian GGUF file?")
        if version not in (2, 3):
            raise self.bad(f"unsupported GGUF version {version} (llama.cpp b11312 reads 2 and 3)")
        n_tensors, pos = self.unpack(_I64, pos)
        n_kv, pos = self.unpack(_I64, pos)
        if n_tensors < 0 or n_kv < 0:
            raise self.bad(f"negative tensor or key count ({n_tensors}, {n_kv})")
        if n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES > self.size - pos:
            raise _Truncated  # more entries than the bytes left can hold: refused before looping over them
        self.n_tensors, self.n_kv = n_tensors, n_kv
        return version, pos

    def kv_section(self, pos: int) -> tuple[dict[str, Any], array, bytearray, int]:
        """The key/value entries from ``pos``: (metadata, spans, value types, position after them)."""
        meta: dict[str, Any] = {}
        spans = array("Q")
        types = bytearray()
        charge, string, unpack = self.charge, self.string, self.unpack
        for _ in range(self.n_kv):
            charge(_KV_COST, "its keys")
            start = pos
            key, pos = string(pos)
            if not key or key in meta:
                raise self.bad(f"{'empty' if not key else 'duplicate'} key {key!r}")
            vtype, pos = unpack(_U32, pos)
            if vtype == STRING:
                meta[key], pos = string(pos)
            elif vtype in SCALARS:
                meta[key], pos = unpack(SCALARS[vtype], pos)
            elif vtype == ARRAY:
                meta[key], pos = self.array_value(key, pos)
            else:
                raise self.bad(f"key {key!r} has invalid GGUF type {vtype}")
            spans.append(start)
            spans.append(pos)
            types.append(vtype)
        return meta, spans, types, pos

    def array_value(self, key: str, pos: int) -> tuple[ArrayValue, int]:
        """The array value of ``key`` at ``pos``, measured but not decoded; returns it and the position after it."""
        elem_type, pos = self.unpack(_U32, pos)
        count, pos = self.unpack(_U64, pos)
        first = pos
        if elem_type == STRING:
            pos = self.skip_strings(pos, count)
        elif elem_type in SCALARS:
            pos += SCALARS[elem_type].size * count
        else:
            raise self.bad(f"key {key!r} is an array of invalid GGUF type {elem_type}")
        if pos > self.size:
            raise _Truncated
        self.charge(_ARRAY_COST, "its keys")
        return ArrayValue(elem_type, count, first, pos), pos

    def skip_strings(self, pos: int, count: int) -> int:
        """The position after ``count`` strings from ``pos``. Inlined: a vocabulary is 10^4-10^5 of them."""
        size, buf, unpack_from = self.size, self.buf, _U64.unpack_from
        if count * 8 > size - pos:
            raise _Truncated
        for _ in range(count):
            if pos + 8 > size:
                raise _Truncated
            pos += 8 + unpack_from(buf, pos)[0]
            if pos > size:
                raise _Truncated
        return pos

    def alignment(self, meta: dict[str, Any], types: bytearray) -> int:
        """``general.alignment`` (a uint32 power of 2) or the default."""
        alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if "general.alignment" in meta and types[list(meta).index("general.alignment")] != UINT32:
            raise self.bad("general.alignment is not a uint32")
        if alignment <= 0 or alignment & (alignment - 1):
            raise self.bad(f"alignment {alignment} is not a power of 2")
        return alignment

    def tensor_infos(self, pos: int) -> tuple[list, int]:
        """The tensor infos from ``pos``: ([(name, shape, type, relative offset, elements, bytes)...], position
        after them)."""
        if self.n_tensors * _MIN_TENSOR_BYTES > self.size - pos:
            raise _Truncated
        infos: list = []
        names: set[str] = set()
        bad, charge, string, unpack = self.bad, self.charge, self.string, self.unpack
        for i in range(self.n_tensors):
            charge(_TENSOR_COST, "its tensor infos")
            name, pos = string(pos)
            if len(name.encode("utf-8", "surrogateescape")) >= MAX_NAME:
                raise bad(f"tensor {i} has a name of {len(name)} characters (llama.cpp allows {MAX_NAME - 1})")
            if name in names:
                raise bad(f"duplicate tensor name {name!r}")
            names.add(name)
            n_dims, pos = unpack(_U32, pos)
            if n_dims > MAX_DIMS:
                raise bad(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
            charge(_DIM_COST * n_dims, None)
            shape = []
            for _ in range(n_dims):
                ne, pos = unpack(_I64, pos)
                if ne < 0:
                    raise bad(f"tensor {name!r} has a negative dimension {ne}")
                shape.append(ne)
            gtype, pos = unpack(_U32, pos)
            if gtype not in GGML_TYPES:
                raise bad(f"tensor {name!r} has ggml type {gtype}, unknown to llama.cpp b11312")
            tname, blck, _ = GGML_TYPES[gtype]
            if shape and shape[0] % blck:
                raise bad(f"tensor {name!r} of type {tname} has {shape[0]} elements per row, not a multiple of {blck}")
            n_el = 1
            for ne in shape:
                n_el *= ne
            rel, pos = unpack(_U64, pos)
            infos.append((name, tuple(shape), gtype, rel, n_el, tensor_nbytes(gtype, tuple(shape))))
        return infos, pos

    def place_tensors(self, infos: list, pos: int, alignment: int) -> int:
        """The data section's start (``pos`` aligned); checks each tensor's offset and that its data lies in the
        file, and turns ``infos`` into TensorInfo with absolute offsets, in place (one list at a time)."""
        data_offset = pos
        if infos and pos % alignment:
            data_offset += alignment - pos % alignment
        expected = 0
        for i, (name, shape, gtype, rel, n_el, n_bytes) in enumerate(infos):
            if rel != expected:
                raise self.bad(f"tensor {name!r} has offset {rel}, expected {expected}")
            end = data_offset + rel + n_bytes
            if end > self.size:
                raise PipelineError(f"{self.path}: truncated GGUF: tensor data ends at byte {end}, file has {self.size}")
            infos[i] = TensorInfo(name, shape, gtype, data_offset + rel, n_el, n_bytes)
            expected += -(-n_bytes // alignment) * alignment
        return data_offset


# --------------------------------------------------------------------------- what callers read of a GGUF

# The keys that make a file's tokenizer and chat template: every published file must carry the base's byte for byte.
TOKENIZER_PREFIXES = ("tokenizer.",)


def tokenizer_sha256(path: str | os.PathLike) -> str:
    """SHA256 of the bytes of every ``tokenizer.*`` key-value entry (chat templates included), in file order."""
    header = read_header(path)
    digest = hashlib.sha256()
    try:
        with open(header.path, "rb") as fh:
            for key, (start, end) in header.kv_spans.items():
                if key.startswith(TOKENIZER_PREFIXES):
                    fh.seek(start)
                    digest.update(fh.read(end - start))
    except OSError as exc:
        raise PipelineError(f"{header.path}: cannot read: {exc.strerror or exc}") from None
    return digest.hexdigest()


def read_facts(path: str | os.PathLike, with_sha256: bool = True) -> GGUFFacts:
    """What the manifest records of a GGUF (gguf-py's GGUFReader, which decodes every vocabulary entry into
    numpy views, took 4 s per file on the demo's 49k-token vocabulary); tests/integration/test_device.py checks
    that both give the same facts on real files."""
    path = Path(path)
    return read_header(path).facts(sha256_file(path) if with_sha256 else "")


def general_metadata(path: str | os.PathLike) -> dict:
    """The ``general.*`` scalar and string keys of a GGUF (name, quantized_by, source url, license...)."""
    return {k: v for k, v in read_header(path).metadata.items()
            if k.startswith("general.") and k not in ("general.file_type", "general.quantization_version")
            and isinstance(v, (str, int, float))}
