"""Multi-token-prediction (nextn / MTP) heads in a GGUF: which layers carry them and how many tensors.

llama.cpp names these tensors ``blk.<layer>.nextn.*`` (gguf-py MODEL_TENSOR.NEXTN_*) and records
their layer count in ``<arch>.nextn_predict_layers``. A quant must keep every one its F16 file had.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .ggufheader import GGUFHeader, read_header
from .ggufinfo import field

if TYPE_CHECKING:
    from gguf import GGUFReader

_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.")
# The facts the manifest records per file.
MTP_KEYS = ("tensors", "layers", "nextn_predict_layers")


def mtp_facts(source: str | Path | GGUFHeader | GGUFReader) -> dict:
    """MTP facts of a GGUF: ``source`` is its path (parsed by the stdlib header reader), a parsed header or
    an open GGUFReader."""
    r = read_header(source) if isinstance(source, (str, Path)) else source
    if isinstance(r, GGUFHeader):
        def get(key, default=None):
            return r.metadata.get(key, default)
    else:
        def get(key, default=None):
            return field(r, key, default)
    arch = get("general.architecture", "")
    names = sorted(t.name for t in r.tensors if _NEXTN.match(t.name))
    layers = sorted({int(_NEXTN.match(n).group(1)) for n in names})
    return {"tensors": len(names), "layers": layers, "names": names,
            "nextn_predict_layers": get(f"{arch}.nextn_predict_layers")}


def lost_heads(base: dict, quant: dict) -> list[str]:
    """Names of MTP tensors the base file has and the quant lacks."""
    return sorted(set(base["names"]) - set(quant["names"]))
