"""Tensor-type map files (recipe key ``quants[].tensor_types_file``), read as llama-quantize reads them.

What the pinned llama.cpp (b11312) does with ``--tensor-type-file FILE`` (docs/quantization.md#tensor-type-maps):

- tools/quantize/quantize.cpp:349-364 (``parse_tensor_type_file``): the file is read as whitespace-separated
  tokens (``file >> arg``), each one ``pattern=type`` parsed like a ``--tensor-type`` argument; no comments.
- tools/quantize/quantize.cpp:317-346 (``parse_tensor_type``): the pattern (left of the first ``=``) is
  lower-cased; the type is matched case-insensitively against ``ggml_type_name``.
- src/llama-quant.cpp:194-197: each pattern is compiled as a ``std::regex`` (ECMAScript); src/llama-quant.cpp:744-758:
  ``std::regex_search`` (unanchored: a match anywhere in the name), in file order, the first match wins.

So a pattern is refused here when llama-quantize would read it otherwise than it is written: upper-case letters
(lower-casing turns ``\\D`` into ``\\d``), ``#`` comments (read as patterns), or a token without ``=``.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.gguf.types import GGML_TYPES

# the ggml types a tensor may be quantized to by a map (llama-quantize accepts any ggml_type_name)
GGML_TYPE_NAMES = {name.lower(): name for name, _, _ in GGML_TYPES.values()}


def read_map(path: Path) -> tuple[tuple[str, str, int], ...]:
    """``(pattern, TYPE, line)`` per entry of a map file, in file order; ``ValueError`` (one line, naming the
    line) for an entry llama-quantize would refuse or read differently."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from exc
    out: list[tuple[str, str, int]] = []
    for lineno, line in enumerate(text.splitlines(), 1):
        for tok in line.split():
            where = f"{path.name} line {lineno}: {tok!r}"
            if tok.startswith("#"):
                raise ValueError(f"{where}: llama-quantize has no comments (it would read this as a pattern)")
            pattern, sep, qtype = tok.partition("=")
            if not sep or not pattern or not qtype:
                raise ValueError(f"{where}: not 'pattern=type'")
            if pattern != pattern.lower():
                raise ValueError(f"{where}: upper-case in the pattern (llama-quantize lower-cases it, which changes "
                                 "what it matches)")
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"{where}: not a regular expression ({exc})") from exc
            if qtype.lower() not in GGML_TYPE_NAMES:
                raise ValueError(f"{where}: unknown ggml type {qtype!r}")
            out.append((pattern, GGML_TYPE_NAMES[qtype.lower()], lineno))
    if not out:
        raise ValueError(f"{path.name} holds no 'pattern=type' entry")
    return tuple(out)
