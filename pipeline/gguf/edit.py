"""The recipe's fix path: tokenizer keys written into a GGUF with gguf-py (the pinned tree's), tensors copied.

``chat_template_override``, ``eos_token_ids`` and ``add_bos`` (pipeline/recipe/) are written into the base GGUF
by the convert stage before it is renamed into place, so every quant made from it carries them. The rewrite
follows what gguf-py's own ``gguf_new_metadata.py`` does (GGUFReader -> GGUFWriter, every other key and every
tensor copied as it is): llama.cpp reads the result like any converter output.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pipeline.errors import PipelineError

CHAT_TEMPLATE = "tokenizer.chat_template"
# llama.cpp puts each of these ids into its end-of-generation set (src/llama-vocab.cpp:2944-2958 of b11312)
END_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
ADD_BOS = "tokenizer.ggml.add_bos_token"
PRE = "tokenizer.ggml.pre"


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


def rewrite_metadata(path: str | os.PathLike, changes: dict[str, tuple[Any, str]],
                     tensor_data: dict[str, Any] | None = None) -> None:
    """Rewrite the GGUF at ``path`` in place (a sibling file, then a rename) with the keys of ``changes`` set
    to ``(value, GGUFValueType name)``, replacing or adding them; every other key and tensor is copied, except
    the tensors named in ``tensor_data``, whose data (same shape and type) is written instead."""
    # gguf-py (numpy): only a rewrite needs it; convert imports this module at every start-up
    from gguf import GGUFReader, GGUFValueType, GGUFWriter

    path = Path(path)
    reader = GGUFReader(path)
    arch_field = reader.get_field("general.architecture")
    if arch_field is None:
        raise PipelineError(f"{path}: no general.architecture: not a model GGUF")
    out = path.with_name(path.name + ".edit")
    try:
        writer = GGUFWriter(out, arch=arch_field.contents(), endianess=reader.endianess)
        pending = dict(changes)
        for field in reader.fields.values():
            if field.name == "general.architecture" or field.name.startswith("GGUF."):
                continue  # written by GGUFWriter itself, or virtual
            if field.name in pending:
                value, vtype = pending.pop(field.name)
                writer.add_key_value(field.name, value, GGUFValueType[vtype])
                continue
            val_type = field.types[0]
            sub_type = field.types[-1] if val_type == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), val_type, sub_type=sub_type)
        for key, (value, vtype) in pending.items():
            writer.add_key_value(key, value, GGUFValueType[vtype])
        for t in reader.tensors:
            writer.add_tensor_info(t.name, t.data.shape, t.data.dtype, t.data.nbytes, t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for t in reader.tensors:
            writer.write_tensor_data((tensor_data or {}).get(t.name, t.data), tensor_endianess=reader.endianess)
        writer.close()
        del reader  # its memory map, before the rename
        os.replace(out, path)
    except BaseException:
        out.unlink(missing_ok=True)
        raise
