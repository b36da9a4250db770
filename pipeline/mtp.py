"""Multi-token-prediction (nextn / MTP) heads in a GGUF: which layers carry them and how many tensors.

llama.cpp names these tensors ``blk.<layer>.nextn.*`` (gguf-py MODEL_TENSOR.NEXTN_*) and records
their layer count in ``<arch>.nextn_predict_layers``. A quant must keep every one its F16 file had.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from .ggufinfo import field, open_reader

if TYPE_CHECKING:
    from gguf import GGUFReader

_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.")
# The facts the manifest records per file.
MTP_KEYS = ("tensors", "layers", "nextn_predict_layers")


def mtp_facts(source: str | Path | GGUFReader) -> dict:
    """MTP facts of a GGUF: ``source`` is its path or an open GGUFReader."""
    r = source if hasattr(source, "tensors") else open_reader(source)
    arch = field(r, "general.architecture", "")
    names = sorted(t.name for t in r.tensors if _NEXTN.match(t.name))
    layers = sorted({int(_NEXTN.match(n).group(1)) for n in names})
    return {"tensors": len(names), "layers": layers, "names": names,
            "nextn_predict_layers": field(r, f"{arch}.nextn_predict_layers")}


def lost_heads(base: dict, quant: dict) -> list[str]:
    """Names of MTP tensors the base file has and the quant lacks."""
    return sorted(set(base["names"]) - set(quant["names"]))
