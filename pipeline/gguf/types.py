"""The one type table of GGUF files, as the pinned llama.cpp (b11312) defines it: standard library only.

- GGUF value types (``enum gguf_type``, ``ggml/include/gguf.h``): metadata keys and array elements;
- ggml tensor types (``enum ggml_type``) with elements per block and bytes per block (``ggml_blck_size`` /
  ``ggml_type_size``), so that a tensor's bytes follow from its shape;
- llama_ftype (``include/llama.h``): the value of ``general.file_type``, named as llama-quantize names it.

These are the pinned tree's, not those of whichever ``gguf`` release PyPI has (0.19.0 cannot name Q1_0 or
Q2_0); tests/integration/test_device.py checks them against the pinned tree's gguf-py (``LlamaFileType``,
``GGMLQuantizationType``, ``GGML_QUANT_SIZES`` in gguf/constants.py).
"""

from __future__ import annotations

import struct

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32  # GGUF_DEFAULT_ALIGNMENT
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME (a tensor name must be shorter)

# ---------------------------------------------------------------- GGUF value types (enum gguf_type)
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
# short names as llama.cpp's messages write them (gguf_type_name)
VALUE_TYPE_NAMES = ("u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64")
# the fixed-size value types and their little-endian layout
SCALARS: dict[int, struct.Struct] = {
    UINT8: struct.Struct("<B"), INT8: struct.Struct("<b"), UINT16: struct.Struct("<H"), INT16: struct.Struct("<h"),
    UINT32: struct.Struct("<I"), INT32: struct.Struct("<i"), FLOAT32: struct.Struct("<f"), BOOL: struct.Struct("<?"),
    UINT64: struct.Struct("<Q"), INT64: struct.Struct("<q"), FLOAT64: struct.Struct("<d"),
}

# ---------------------------------------------------------------- llama_ftype (general.file_type)
# enum llama_ftype (include/llama.h) = gguf-py LlamaFileType of b11312, named as llama-quantize names the
# types (MOSTLY_ dropped, ALL_F32 -> F32).
FILE_TYPES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S",
    12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K",
    19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL",
    26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0",
    37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4", 40: "Q1_0", 41: "Q2_0", 1024: "GUESSED",
}

# ---------------------------------------------------------------- ggml tensor types (enum ggml_type)
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


def file_type_name(value: object) -> str:
    """``general.file_type`` number -> llama-quantize type name (15 -> Q4_K_M); ``UNKNOWN`` when absent,
    ``UNKNOWN(<value>)`` for a number (or a value of another type) llama.cpp does not define."""
    if value is None:
        return "UNKNOWN"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"UNKNOWN({value!r})"
    return FILE_TYPES.get(value, f"UNKNOWN({value})")


def ggml_type_name(ggml_type: int) -> str:
    entry = GGML_TYPES.get(ggml_type)
    return entry[0] if entry else f"UNKNOWN({ggml_type})"


def tensor_nbytes(ggml_type: int, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor's data (``ggml_nbytes`` of a contiguous tensor): rows of whole blocks."""
    _, blck, tsize = GGML_TYPES[ggml_type]
    n = 1
    for ne in shape:
        n *= ne
    return n // blck * tsize


# ggml type name -> enum value (``Q4_K`` -> 12): the one lookup by name
GGML_TYPE_CODES: dict[str, int] = {name: code for code, (name, _, _) in GGML_TYPES.items()}


def padded_nbytes(type_name: str, shape: tuple[int, ...] | list[int], alignment: int) -> int:
    """A tensor's bytes in a GGUF's data section as ``type_name``: its data (:func:`tensor_nbytes`) padded to the
    file's alignment, as llama-quantize writes each tensor (src/llama-quant.cpp:1368)."""
    n = tensor_nbytes(GGML_TYPE_CODES[type_name], tuple(shape))
    return (n + alignment - 1) // alignment * alignment


def type_bpw(name: str) -> float:
    """Bits per weight of a ggml tensor type by name (``Q4_K``: 4.5), from its block size and bytes."""
    _, blck, tsize = GGML_TYPES[GGML_TYPE_CODES[name.upper()]]
    return tsize * 8 / blck
