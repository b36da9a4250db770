"""Stage entry functions on small generated inputs and the demo snapshot: fetch's safety rules, clear errors for
bad inputs, GGUF read-back of vocab-only files."""

from __future__ import annotations

import json
import shutil

import pytest

from pipeline.errors import PipelineError, ToolError
from pipeline.fsutil import sha256_file
from pipeline.gguf import read_facts
from pipeline.recipe import load_recipe
from pipeline.stages.convert import convert
from pipeline.stages.fetch import fetch


def recipe_for(tmp_path, source: str, quants=("Q8_0",)):
    import yaml

    p = tmp_path / "r.yaml"
    p.write_text(yaml.safe_dump({"name": "t", "source": yaml.safe_load(source), "quants": list(quants)}))
    return load_recipe(p)


def local_copy(demo_snapshot, dest):
    """A plain local HF folder copied from the demo snapshot (symlinks resolved)."""
    shutil.copytree(demo_snapshot, dest, symlinks=False)
    return dest


# ------------------------------------------------------------------ fetch


def test_fetch_from_hub_cache_records_commit(tmp_path, demo_hub, monkeypatch):
    from pipeline.demo import DEMO_COMMIT

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = recipe_for(tmp_path, "repo: HuggingFaceTB/SmolLM2-135M-Instruct\nrevision: main")
    rec = fetch(r, tmp_path / "hf", tmp_path / "fetch.json", hub_cache=str(demo_hub))
    assert rec["source"]["commit"] == DEMO_COMMIT and rec["source"]["revision"] == "main"
    assert set(rec["files"]) >= {"config.json", "model.safetensors", "tokenizer.json", "README.md"}
    assert rec["files"]["model.safetensors"]["sha256"] == sha256_file(tmp_path / "hf" / "model.safetensors")
    assert json.loads((tmp_path / "fetch.json").read_text()) == rec


def test_fetch_unknown_revision_offline(tmp_path, demo_hub, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = recipe_for(tmp_path, "repo: HuggingFaceTB/SmolLM2-135M-Instruct\nrevision: " + "f" * 40)
    with pytest.raises(PipelineError, match=r"source: HuggingFaceTB/SmolLM2-135M-Instruct@f{40}: cannot fetch"):
        fetch(r, tmp_path / "hf", tmp_path / "fetch.json", hub_cache=str(demo_hub))
    assert not (tmp_path / "hf").exists() and not (tmp_path / "fetch.json").exists()


def test_fetch_refuses_pickle_unless_opted_in(tmp_path, demo_snapshot):
    src = local_copy(demo_snapshot, tmp_path / "src")
    (src / "model.safetensors").unlink()
    (src / "pytorch_model.bin").write_bytes(b"pickle would go here")
    r = recipe_for(tmp_path, f"path: {src}")
    with pytest.raises(PipelineError, match=r"pytorch_model.bin holds pickled weights.*allow_pickle: true"):
        fetch(r, tmp_path / "hf", tmp_path / "fetch.json")
    r = recipe_for(tmp_path, f"path: {src}\nallow_pickle: true")
    rec = fetch(r, tmp_path / "hf", tmp_path / "fetch.json")
    assert "pytorch_model.bin" in rec["files"]


def test_fetch_refuses_remote_code_unless_opted_in(tmp_path, demo_snapshot):
    src = local_copy(demo_snapshot, tmp_path / "src")
    cfg = json.loads((src / "config.json").read_text())
    cfg["auto_map"] = {"AutoModelForCausalLM": "modeling_x.XForCausalLM"}
    (src / "config.json").write_text(json.dumps(cfg))
    (src / "modeling_x.py").write_text("raise SystemExit('remote code ran')\n")
    r = recipe_for(tmp_path, f"path: {src}")
    with pytest.raises(PipelineError, match=r"needs custom code \(auto_map\); set source.trust_remote_code: true"):
        fetch(r, tmp_path / "hf", tmp_path / "fetch.json")
    r = recipe_for(tmp_path, f"path: {src}\ntrust_remote_code: true")
    assert "modeling_x.py" in fetch(r, tmp_path / "hf", tmp_path / "fetch.json")["files"]


def test_fetch_without_code_opt_in_never_copies_python(tmp_path, demo_snapshot):
    src = local_copy(demo_snapshot, tmp_path / "src")
    (src / "helper.py").write_text("print('x')\n")
    rec = fetch(recipe_for(tmp_path, f"path: {src}"), tmp_path / "hf", tmp_path / "fetch.json")
    assert "helper.py" not in rec["files"] and not (tmp_path / "hf" / "helper.py").exists()


# ------------------------------------------------------------------ convert


def test_convert_corrupt_safetensors(tmp_path, demo_snapshot, toolchain):
    src = local_copy(demo_snapshot, tmp_path / "src")
    with open(src / "model.safetensors", "r+b") as fh:
        fh.write(b"\xff" * 16)  # clobber the header length
    r = recipe_for(tmp_path, f"path: {src}")
    out = tmp_path / "art" / "t-F16.gguf"
    with pytest.raises(ToolError, match="safetensors file is corrupt or truncated") as exc:
        convert(r, src, out, tmp_path / "convert.json", log=tmp_path / "convert.log", tc=toolchain)
    assert (exc.value.tool, exc.value.log) == ("convert_hf_to_gguf.py", tmp_path / "convert.log")
    assert not out.exists()


# ------------------------------------------------------------------ GGUF facts, atomic output


def test_vocab_only_gguf_facts(toolchain):
    facts = read_facts(toolchain.root / "vocab" / "ggml-vocab-llama-bpe.gguf")
    assert facts.tensor_count == 0 and facts.gguf_version == 3 and len(facts.sha256) == 64


def test_header_parsed_once_per_file_and_again_when_it_changes(toolchain, tmp_path):
    """read_header keeps a parse per path and file identity: the same object while the file is unchanged, a new
    parse (here: the truncation refused) once it is rewritten in place."""
    from pipeline.gguf import read_header

    p = tmp_path / "v.gguf"
    shutil.copyfile(toolchain.root / "vocab" / "ggml-vocab-llama-bpe.gguf", p)
    first = read_header(p)
    assert read_header(p) is first
    data = p.read_bytes()
    with open(p, "r+b") as fh:  # same inode, shorter
        fh.truncate(len(data) // 2)
    with pytest.raises(PipelineError, match="truncated"):
        read_header(p)
    p.write_bytes(data)
    again = read_header(p)
    assert again is not first and again.metadata == first.metadata


