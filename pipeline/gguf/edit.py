"""The recipe's fix path: tokenizer keys written into a GGUF, every other byte copied.

``chat_template_override``, ``eos_token_ids``, ``add_bos`` and ``tokenizer_pre`` (pipeline/recipe/) are written
into the base GGUF by the convert stage before it is renamed into place, so every quant made from it carries them.
The rewrite splices the key/value section (the project's reader gives every entry's bytes) and copies the tensor
infos and the data section as they are: the bytes gguf-py's ``gguf_new_metadata.py`` way (GGUFReader ->
GGUFWriter) writes, without decoding a 150k-token vocabulary into Python objects (tests/unit/test_gguf_edit.py
compares the two byte for byte).
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError
from pipeline.gguf.reader import read_header
from pipeline.gguf.types import SCALARS, STRING

CHAT_TEMPLATE = "tokenizer.chat_template"
# llama.cpp puts each of these ids into its end-of-generation set (src/llama-vocab.cpp:2944-2958 of b11312)
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
ADD_BOS = "tokenizer.ggml.add_bos_token"
PRE = "tokenizer.ggml.pre"
# GGUFValueType names (gguf-py) -> enum gguf_type; arrays are never written by the fix path
VALUE_TYPES = {"UINT8": 0, "INT8": 1, "UINT16": 2, "INT16": 3, "UINT32": 4, "INT32": 5, "FLOAT32": 6, "BOOL": 7,
               "STRING": 8, "UINT64": 10, "INT64": 11, "FLOAT64": 12}
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")


def override_changes(overrides: dict, n_tokens: int, where: str) -> dict[str, tuple[Any, str]]:
    """GGUF keys -> (value, GGUF value type name) for the recipe's fix-path keys; ids must be in the vocab."""
    changes: dict[str, tuple[Any, str]] = {}
    if "chat_template" in overrides:
        changes[CHAT_TEMPLATE] = (overrides["chat_template"], "STRING")
    if "eos_token_ids" in overrides:
        bad = [i for i in overrides["eos_token_ids"] if i >= n_tokens]
        if bad:
            raise PipelineError(f"{where}: eos_token_ids: {bad[0]} is not a token id of this vocabulary "
                                f"({n_tokens} tokens)")
        for key, token in zip(END_KEYS, overrides["eos_token_ids"], strict=False):  # 1 to 3 ids
            changes[key] = (token, "UINT32")
    if "add_bos" in overrides:
        changes[ADD_BOS] = (bool(overrides["add_bos"]), "BOOL")
    if "tokenizer_pre" in overrides:
        changes[PRE] = (overrides["tokenizer_pre"], "STRING")
    return changes


def _string(s: str) -> bytes:
    raw = s.encode("utf-8", "surrogateescape")
    return _U64.pack(len(raw)) + raw


def _entry(key: str, value: Any, vtype: str) -> bytes:
    """One key/value entry as gguf.cpp reads it: key, value type, value."""
    t = VALUE_TYPES.get(vtype)
    if t is None:
        raise PipelineError(f"GGUF key {key!r}: cannot write a value of type {vtype!r}")
    body = _string(str(value)) if t == STRING else SCALARS[t].pack(value)
    return _string(key) + _U32.pack(t) + body


def rewrite_metadata(path: str | os.PathLike, changes: dict[str, tuple[Any, str]],
                     tensor_data: dict[str, Any] | None = None) -> None:
    """Rewrite the GGUF at ``path`` in place (a sibling file, then a rename) with the keys of ``changes`` set
    to ``(value, GGUFValueType name)``, replacing or adding them; every other key and tensor is copied, except
    the tensors named in ``tensor_data`` (buffers of the same size: same shape and type), whose bytes are
    written instead."""
    path = Path(path)
    h = read_header(path)
    if "general.architecture" not in h.metadata:
        raise PipelineError(f"{path}: no general.architecture: not a model GGUF")
    tensors = {t.name: t for t in h.tensors}
    patches = []
    for name, data in (tensor_data or {}).items():
        raw = memoryview(data).cast("B")
        if name not in tensors or raw.nbytes != tensors[name].n_bytes:
            raise PipelineError(f"{path}: tensor {name!r}: no tensor of {raw.nbytes} bytes to replace")
        patches.append((tensors[name].offset - h.data_offset, raw))
    with open(path, "rb") as fh:
        old = fh.read(h.data_offset)
    if len(old) != h.data_offset:
        raise PipelineError(f"{path}: the file changed while it was rewritten")
    spans = h.kv_spans
    pending = dict(changes)
    kv = bytearray()
    for key, (start, end) in spans.items():
        kv += _entry(key, *pending.pop(key)) if key in pending else old[start:end]
    for key, (value, vtype) in pending.items():
        kv += _entry(key, value, vtype)
    # the tensor infos follow the last key: name, n_dims, dims, type, offset (relative to the data section)
    ti_start = max((e for _, e in spans.values()), default=24)
    ti_len = sum(8 + len(t.name.encode("utf-8", "surrogateescape")) + 4 + 8 * len(t.shape) + 4 + 8 for t in h.tensors)
    head = old[:8] + _U64.pack(len(h.tensors)) + _U64.pack(len(spans) + len(pending)) + kv + old[ti_start:ti_start + ti_len]
    if h.tensors:  # the data section starts aligned; gguf-py writes no padding where no tensor follows
        head += b"\0" * (-len(head) % h.alignment)
    out = path.with_name(path.name + ".edit")
    try:
        with open(path, "rb") as src, open(out, "wb") as dst:
            dst.write(head)
            src.seek(h.data_offset)
            shutil.copyfileobj(src, dst, 16 << 20)
            for rel, raw in patches:
                dst.seek(len(head) + rel)
                dst.write(raw)
        os.replace(out, path)
    except BaseException:
        out.unlink(missing_ok=True)
        raise

