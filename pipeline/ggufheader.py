"""A GGUF header reader with the Python standard library only: what ``ggufpipe verify`` needs on a device.

It reads what llama.cpp's ``gguf_init_from_file`` reads before the tensor data (``ggml/src/gguf.cpp`` of the
pinned build b11312) and refuses a file where that function would: magic, version (2 or 3), tensor and
key/value counts, the key/value section (scalars and strings kept, arrays measured and skipped),
``general.alignment``, and every tensor info (name, shape, ggml type, offset). From them it derives the data
section's start, each tensor's size in bytes (block size and bytes per block of its type) and checks that the
offsets are the ones llama.cpp expects and that the data lies inside the file.

No numpy, no ``gguf`` package: a device install stays small, and the type tables below are those of the
pinned llama.cpp rather than of whichever ``gguf`` release PyPI has (0.19.0 cannot name Q1_0 or Q2_0). A
build-box test (tests/integration/test_device.py) checks that both tables equal the pinned tree's gguf-py
(``LlamaFileType``, ``GGMLQuantizationType`` and ``GGML_QUANT_SIZES`` in gguf/constants.py), and that the
facts derived here (what :func:`pipeline.ggufinfo.read_facts` returns) equal gguf-py's ``GGUFReader``'s on real files.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import PipelineError
from .fsutil import file_identity

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME (a tensor name must be shorter)

# enum llama_ftype (include/llama.h) = gguf-py LlamaFileType of b11312, named as llama-quantize names the
# types (MOSTLY_ dropped, ALL_F32 -> F32): the value of ``general.file_type``.
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0", 1024: "GUESSED",
}

_QK_K = 256
# enum ggml_type -> (name, elements per block, bytes per block) = gguf-py GGMLQuantizationType and
# GGML_QUANT_SIZES of b11312 (ggml_blck_size / ggml_type_size).
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 2 + 16),
    3: ("Q4_1", 32, 2 + 2 + 16),
    6: ("Q5_0", 32, 2 + 4 + 16),
    7: ("Q5_1", 32, 2 + 2 + 4 + 16),
    8: ("Q8_0", 32, 2 + 32),
    9: ("Q8_1", 32, 2 + 2 + 32),
    10: ("Q2_K", 256, 2 + 2 + _QK_K // 16 + _QK_K // 4),
    11: ("Q3_K", 256, 2 + _QK_K // 4 + _QK_K // 8 + 12),
    12: ("Q4_K", 256, 2 + 2 + _QK_K // 2 + 12),
    13: ("Q5_K", 256, 2 + 2 + _QK_K // 2 + _QK_K // 8 + 12),
    14: ("Q6_K", 256, 2 + _QK_K // 2 + _QK_K // 4 + _QK_K // 16),
    15: ("Q8_K", 256, 4 + _QK_K + _QK_K // 8),
    16: ("IQ2_XXS", 256, 2 + _QK_K // 4),
    17: ("IQ2_XS", 256, 2 + _QK_K // 4 + _QK_K // 32),
    18: ("IQ3_XXS", 256, 2 + _QK_K // 4 + _QK_K // 8),
    19: ("IQ1_S", 256, 2 + _QK_K // 8 + _QK_K // 16),
    20: ("IQ4_NL", 32, 2 + 16),
    21: ("IQ3_S", 256, 2 + _QK_K // 4 + _QK_K // 8 + _QK_K // 32 + 4),
    22: ("IQ2_S", 256, 2 + _QK_K // 4 + _QK_K // 16),
    23: ("IQ4_XS", 256, 2 + 2 + _QK_K // 2 + _QK_K // 64),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, _QK_K // 8 + _QK_K // 16 + _QK_K // 32),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 2 + 4 * 13),
    35: ("TQ2_0", 256, 2 + 64),
    39: ("MXFP4", 32, 1 + 16),
    40: ("NVFP4", 64, 4 + 32),
    41: ("Q1_0", 128, 2 + 16),
    42: ("Q2_0", 64, 2 + 16),
}

# GGUF value types (enum gguf_type, ggml/include/gguf.h)
_UINT8, _INT8, _UINT16, _INT16, _UINT32, _INT32, _FLOAT32, _BOOL, _STRING, _ARRAY, _UINT64, _INT64, _FLOAT64 = range(13)
_SCALARS = {_UINT8: struct.Struct("<B"), _INT8: struct.Struct("<b"), _UINT16: struct.Struct("<H"),
            _INT16: struct.Struct("<h"), _UINT32: struct.Struct("<I"), _INT32: struct.Struct("<i"),
            _FLOAT32: struct.Struct("<f"), _BOOL: struct.Struct("<?"), _UINT64: struct.Struct("<Q"),
            _INT64: struct.Struct("<q"), _FLOAT64: struct.Struct("<d")}
_U32, _U64, _I64 = struct.Struct("<I"), struct.Struct("<Q"), struct.Struct("<q")


def file_type_name(value: int | None) -> str:
    """``general.file_type`` number -> llama-quantize type name (15 -> Q4_K_M); as ggufinfo.file_type_name."""
    if value is None:
        return "UNKNOWN"
    return FILE_TYPES.get(int(value), f"UNKNOWN({int(value)})")


@dataclass(frozen=True)
class ArrayValue:
    """A metadata array, measured but not decoded: element type and count."""

    elem_type: int
    count: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # GGML ne[0..n_dims)
    ggml_type: int
    offset: int  # absolute: from the start of the file
    n_elements: int
    n_bytes: int


@dataclass(frozen=True)
class GGUFHeader:
    path: Path
    version: int
    metadata: dict[str, Any]  # scalars as Python numbers/bools, strings as str, arrays as ArrayValue
    alignment: int
    data_offset: int  # where the tensor data section starts
    tensors: tuple[TensorInfo, ...]
    file_size: int
    kv_spans: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False)  # key -> bytes [start, end)

    @property
    def file_type(self) -> str:
        return file_type_name(self.metadata.get("general.file_type"))

    @property
    def parameter_count(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def data_end(self) -> int:
        return max((t.offset + t.n_bytes for t in self.tensors), default=self.data_offset)

    def facts(self, sha256: str = ""):
        """The :class:`pipeline.ggufinfo.GGUFFacts` of this file (what the manifest records)."""
        from .ggufinfo import GGUFFacts

        n_params, n_bytes = self.parameter_count, sum(t.n_bytes for t in self.tensors)
        arch = self.metadata.get("general.architecture", "")
        return GGUFFacts(
            file=self.path.name, quant_type=self.file_type, sha256=sha256, size_bytes=self.file_size,
            bits_per_weight=round(n_bytes * 8 / n_params, 4) if n_params else 0.0, gguf_version=self.version,
            tensor_count=len(self.tensors), parameter_count=n_params,
            architecture=arch if isinstance(arch, str) else str(arch),
        )


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
    except OSError:
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
                return _parse(buf, path, size)
    except OSError as exc:
        raise PipelineError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except _Truncated:
        raise PipelineError(f"{path}: truncated GGUF: the header ends past the end of the file "
                            f"({size} bytes)") from None


def _parse(buf: Any, path: Path, size: int) -> GGUFHeader:
    def bad(msg: str) -> PipelineError:
        return PipelineError(f"{path}: unreadable GGUF header: {msg}")

    def unpack(st: struct.Struct, pos: int) -> tuple[Any, int]:
        end = pos + st.size
        if end > size:
            raise _Truncated
        return st.unpack_from(buf, pos)[0], end

    def string(pos: int) -> tuple[str, int]:
        n, pos = unpack(_U64, pos)
        end = pos + n
        if end > size:
            raise _Truncated
        return bytes(buf[pos:end]).decode("utf-8", "surrogateescape"), end

    if size < 24:
        raise _Truncated
    version, pos = unpack(_U32, 4)
    if version & 0xFFFF == 0:
        raise bad(f"version {version:#x}: a big-endian GGUF file?")
    if version not in (2, 3):
        raise bad(f"unsupported GGUF version {version} (llama.cpp b11312 reads 2 and 3)")
    n_tensors, pos = unpack(_I64, pos)
    n_kv, pos = unpack(_I64, pos)
    if n_tensors < 0 or n_kv < 0:
        raise bad(f"negative tensor or key count ({n_tensors}, {n_kv})")

    meta: dict[str, Any] = {}
    spans: dict[str, tuple[int, int]] = {}
    for _ in range(n_kv):
        start = pos
        key, pos = string(pos)
        if not key or key in meta:
            raise bad(f"{'empty' if not key else 'duplicate'} key {key!r}")
        vtype, pos = unpack(_U32, pos)
        if vtype == _STRING:
            meta[key], pos = string(pos)
        elif vtype in _SCALARS:
            meta[key], pos = unpack(_SCALARS[vtype], pos)
        elif vtype == _ARRAY:
            elem_type, pos = unpack(_U32, pos)
            count, pos = unpack(_U64, pos)
            if elem_type == _STRING:
                for _ in range(count):
                    n, pos = unpack(_U64, pos)
                    pos += n
            elif elem_type in _SCALARS:
                pos += _SCALARS[elem_type].size * count
            else:
                raise bad(f"key {key!r} is an array of invalid GGUF type {elem_type}")
            if pos > size:
                raise _Truncated
            meta[key] = ArrayValue(elem_type, count)
        else:
            raise bad(f"key {key!r} has invalid GGUF type {vtype}")
        spans[key] = (start, pos)

    alignment = meta.get("general.alignment", DEFAULT_ALIGNMENT)
    if "general.alignment" in meta and not isinstance(alignment, int):
        raise bad("general.alignment is not a uint32")
    if isinstance(alignment, bool) or alignment <= 0 or alignment & (alignment - 1):
        raise bad(f"alignment {alignment} is not a power of 2")

    infos: list[tuple[str, tuple[int, ...], int, int, int, int]] = []
    names: set[str] = set()
    for i in range(n_tensors):
        name, pos = string(pos)
        if len(name.encode("utf-8", "surrogateescape")) >= MAX_NAME:
            raise bad(f"tensor {i} has a name of {len(name)} characters (llama.cpp allows {MAX_NAME - 1})")
        if name in names:
            raise bad(f"duplicate tensor name {name!r}")
        names.add(name)
        n_dims, pos = unpack(_U32, pos)
        if n_dims > MAX_DIMS:
            raise bad(f"tensor {name!r} has {n_dims} dimensions (at most {MAX_DIMS})")
        shape = []
        for _ in range(n_dims):
            ne, pos = unpack(_I64, pos)
            if ne < 0:
                raise bad(f"tensor {name!r} has a negative dimension {ne}")
            shape.append(ne)
        gtype, pos = unpack(_U32, pos)
        if gtype not in GGML_TYPES:
            raise bad(f"tensor {name!r} has ggml type {gtype}, unknown to llama.cpp b11312")
        tname, blck, tsize = GGML_TYPES[gtype]
        if shape and shape[0] % blck:
            raise bad(f"tensor {name!r} of type {tname} has {shape[0]} elements per row, not a multiple of {blck}")
        n_el = 1
        for ne in shape:
            n_el *= ne
        rel, pos = unpack(_U64, pos)
        infos.append((name, tuple(shape), gtype, rel, n_el, n_el // blck * tsize))

    data_offset = pos
    if infos and pos % alignment:
        data_offset += alignment - pos % alignment
    tensors, expected = [], 0
    for name, shape, gtype, rel, n_el, n_bytes in infos:
        if rel != expected:
            raise bad(f"tensor {name!r} has offset {rel}, expected {expected}")
        end = data_offset + rel + n_bytes
        if end > size:
            raise PipelineError(f"{path}: truncated GGUF: tensor data ends at byte {end}, file has {size}")
        tensors.append(TensorInfo(name, shape, gtype, data_offset + rel, n_el, n_bytes))
        expected += -(-n_bytes // alignment) * alignment
    return GGUFHeader(path, version, meta, alignment, data_offset, tuple(tensors), size, spans)


# The keys that make a file's tokenizer and chat template: every published file must carry the base's byte for byte.
TOKENIZER_PREFIXES = ("tokenizer.",)


def tokenizer_sha256(path: str | os.PathLike) -> str:
    """SHA256 of the bytes of every ``tokenizer.*`` key-value entry (chat templates included), in file order."""
    import hashlib

    header = read_header(path)
    digest = hashlib.sha256()
    with open(header.path, "rb") as fh:
        for key, (start, end) in header.kv_spans.items():
            if key.startswith(TOKENIZER_PREFIXES):
                fh.seek(start)
                digest.update(fh.read(end - start))
    return digest.hexdigest()
