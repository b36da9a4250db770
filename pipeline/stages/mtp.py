"""Multi-token-prediction (nextn / MTP) heads in a GGUF: which layers carry them and how many tensors.

llama.cpp names these tensors ``blk.<layer>.nextn.*`` (gguf-py MODEL_TENSOR.NEXTN_*) and records
their layer count in ``<arch>.nextn_predict_layers``. A quant must keep every one its F16 file had.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.gguf import GGUFHeader, read_header

_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.")
# The facts the manifest records per file.
MTP_KEYS = ("tensors", "layers", "nextn_predict_layers")


def mtp_facts(source: str | Path | GGUFHeader) -> dict:
    """MTP facts of a GGUF: ``source`` is its path or its parsed header (:func:`pipeline.gguf.read_header`)."""
    r = source if isinstance(source, GGUFHeader) else read_header(source)
    get = r.metadata.get
    arch = get("general.architecture", "")
    names = sorted(t.name for t in r.tensors if _NEXTN.match(t.name))
    layers = sorted({int(_NEXTN.match(n).group(1)) for n in names})
    return {"tensors": len(names), "layers": layers, "names": names,
            "nextn_predict_layers": get(f"{arch}.nextn_predict_layers")}


def lost_heads(base: dict, quant: dict) -> list[str]:
    """Names of MTP tensors the base file has and the quant lacks."""
    return sorted(set(base["names"]) - set(quant["names"]))
