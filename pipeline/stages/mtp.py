"""Multi-token-prediction (nextn / MTP) heads in a GGUF: which layers carry them and how many tensors.

llama.cpp names these tensors ``blk.<layer>.nextn.*`` (gguf-py MODEL_TENSOR.NEXTN_*) and records
their layer count in ``<arch>.nextn_predict_layers``. A quant must keep every one its F16 file had.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipeline.gguf import GGUFHeader, read_header

_NEXTN = re.compile(r"^blk\.(\d+)\.nextn\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
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


def mtp_step_bytes(source: str | Path | GGUFHeader) -> int:
    """Bytes of the tensors one MTP draft step runs, in a file holding the heads (a model file of ``mtp: keep`` or
    the ``--mtp`` export): every tensor of the MTP blocks (``blk.<L>.*`` of the layers with nextn tensors: the
    nextn projection and norms plus the block's attention and FFN, e.g. src/models/qwen35.cpp:93-116 of b11312)
    and the output matrix the head projects with (its own ``nextn.shared_head_head``, else ``output.weight``, else
    the tied ``token_embd.weight``: src/models/qwen35.cpp:636-638)."""
    r = source if isinstance(source, GGUFHeader) else read_header(source)
    layers = {int(m.group(1)) for t in r.tensors if (m := _NEXTN.match(t.name))}
    size = {t.name: t.n_bytes for t in r.tensors}
    block = sum(t.n_bytes for t in r.tensors if (m := _BLOCK.match(t.name)) and int(m.group(1)) in layers)
    if any(".nextn.shared_head_head." in n for n in size):
        return block
    return block + size.get("output.weight", size.get("token_embd.weight", 0))
