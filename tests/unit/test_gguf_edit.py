"""The fix path's metadata rewrite (pipeline/gguf/edit.py) against gguf-py's own way of doing it (GGUFReader ->
GGUFWriter, every other key and tensor copied: what the pinned tree's gguf_new_metadata.py does), byte for byte,
on the generated seeds (a tiny model, a 3000-token vocabulary), and against the source file where nothing changes
(also on a seed with every value type, ``general.alignment`` 64 and several block layouts, which gguf-py's way
gets wrong)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter
from helpers.gguf_mutate import seed_files

from pipeline.errors import PipelineError
from pipeline.gguf.edit import override_changes, rewrite_metadata
from pipeline.gguf.reader import read_header


def gguf_py_rewrite(src, dst, changes: dict, tensor_data: dict | None = None) -> None:
    """The reference: gguf-py reads every field and tensor and writes them again."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch=reader.get_field("general.architecture").contents(), endianess=reader.endianess)
    pending = dict(changes)
    for f in reader.fields.values():
        if f.name == "general.architecture" or f.name.startswith("GGUF."):
            continue
        if f.name in pending:
            value, vtype = pending.pop(f.name)
            writer.add_key_value(f.name, value, GGUFValueType[vtype])
            continue
        sub = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None
        writer.add_key_value(f.name, f.contents(), f.types[0], sub_type=sub)
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


@pytest.fixture(scope="module")
def seeds(tmp_path_factory):
    return seed_files(tmp_path_factory.mktemp("edit-seeds"))


CHANGES = {
    "replace a string, add the fix path's keys": {
        **override_changes({"tokenizer_pre": "minicpm5", "add_bos": True, "eos_token_ids": [2, 1],
                            "chat_template": "{{ messages[0]['content'] }} é"}, 300, "r.yaml")},
    "replace a key with another type": {"general.name": (7, "UINT64")},
    "nothing": {},
}


@pytest.mark.parametrize("what", list(CHANGES))
@pytest.mark.parametrize("seed", ["tiny", "vocab"])
def test_rewrite_equals_gguf_py_byte_for_byte(seeds, tmp_path, seed, what):
    src = seeds[seed]
    ours = tmp_path / "ours.gguf"
    shutil.copyfile(src, ours)
    rewrite_metadata(ours, CHANGES[what])
    gguf_py_rewrite(src, tmp_path / "ref.gguf", CHANGES[what])
    assert ours.read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    h = read_header(ours)
    for key, (value, _) in CHANGES[what].items():
        assert h.metadata[key] == value
    assert list(tmp_path.iterdir()) and not list(tmp_path.glob("*.edit"))


@pytest.mark.parametrize("seed", ["tiny", "kinds", "vocab"])
def test_no_change_is_the_same_file(seeds, tmp_path, seed):
    ours = tmp_path / "ours.gguf"
    shutil.copyfile(seeds[seed], ours)
    rewrite_metadata(ours, {})
    assert ours.read_bytes() == seeds[seed].read_bytes()


def test_gguf_py_way_misplaces_tensors_at_alignment_64(seeds, tmp_path):
    """Why the rewrite copies tensor infos as they are: GGUFWriter lays out offsets at its own alignment (32)
    while the copied ``general.alignment`` says 64, a file llama.cpp's gguf.cpp and the project's reader refuse."""
    gguf_py_rewrite(seeds["kinds"], tmp_path / "ref.gguf", {})
    with pytest.raises(PipelineError, match="has offset 160, expected 192"):
        read_header(tmp_path / "ref.gguf")


def test_tensor_data_swapped_like_gguf_py(seeds, tmp_path):
    src = seeds["tiny"]
    a = {t.name: t for t in GGUFReader(src).tensors}["token_embd.weight"].data
    data = {"token_embd.weight": np.flip(a).copy()}
    ours = tmp_path / "ours.gguf"
    shutil.copyfile(src, ours)
    rewrite_metadata(ours, {"general.name": ("swapped", "STRING")}, data)
    gguf_py_rewrite(src, tmp_path / "ref.gguf", {"general.name": ("swapped", "STRING")}, data)
    assert ours.read_bytes() == (tmp_path / "ref.gguf").read_bytes()
    written = {t.name: t for t in GGUFReader(ours).tensors}["token_embd.weight"].data
    assert np.array_equal(written, np.flip(a)) and not np.array_equal(written, a)


def test_refusals_keep_the_file(seeds, tmp_path):
    ours = tmp_path / "ours.gguf"
    shutil.copyfile(seeds["tiny"], ours)
    before = ours.read_bytes()
    with pytest.raises(PipelineError, match="tensor 'token_embd.weight': no tensor of 4 bytes to replace"):
        rewrite_metadata(ours, {}, {"token_embd.weight": np.zeros(1, dtype=np.float32)})
    with pytest.raises(PipelineError, match="cannot write a value of type 'ARRAY'"):
        rewrite_metadata(ours, {"x": ([1], "ARRAY")})
    assert ours.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["ours.gguf"]
