"""GGUF files: the one type table (:mod:`.types`), the one reader (:mod:`.reader`, standard library only) and
the fix-path rewrite (:mod:`.edit`, gguf-py's GGUFWriter: build box only).

Inside this package ``import gguf`` still means PyPI's gguf-py (absolute imports)."""

from pipeline.gguf.reader import (
    ArrayValue,
    GGUFFacts,
    GGUFHeader,
    TensorInfo,
    general_metadata,
    read_facts,
    read_header,
    tokenizer_sha256,
)
from pipeline.gguf.types import FILE_TYPES, GGML_TYPES, file_type_name

__all__ = ["ArrayValue", "FILE_TYPES", "GGML_TYPES", "GGUFFacts", "GGUFHeader", "TensorInfo", "file_type_name",
           "general_metadata", "read_facts", "read_header", "tokenizer_sha256"]
