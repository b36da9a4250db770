"""Recipe ``mtp: keep | strip | separate``: what the pinned converter does with multi-token-prediction
heads, on a tiny generated GLM-4.5-style checkpoint (``Glm4MoeForCausalLM``: the canonical MTP model,
one of the architectures whose converter class supports ``--mtp`` / ``--no-mtp``).

The checkpoint has 2 decoder layers and 1 NextN/MTP layer (HF ``model.layers.2.{eh_proj, enorm, hnorm,
shared_head.norm}`` plus an ordinary decoder block, as GLM-4.5 ships it). Its tokenizer is the demo's
SmolLM2 one plus the four special tokens the GLM converter looks up: a freshly trained BPE vocabulary
would be refused, because the converter identifies BPE pre-tokenizers by a hash of the token ids of a
test string and knows only published tokenizers' hashes.
"""

from __future__ import annotations

import functools
import json
import re

import pytest
from helpers import mtp_recipe
from helpers.hf_factory import tiny_glm4_moe

from pipeline.errors import PipelineError, RecipeError, ToolError
from pipeline.gguf import read_header
from pipeline.recipe import load_recipe
from pipeline.stages.convert import convert, convert_mtp
from pipeline.stages.mtp import mtp_facts
from pipeline.tools import run_tool

MTP_NAMES = [f"blk.2.nextn.{k}.weight" for k in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]


@pytest.fixture(scope="module")
def glm_hf(tmp_path_factory, demo_snapshot):
    return tiny_glm4_moe(tmp_path_factory.mktemp("glm") / "hf", demo_snapshot)


@functools.cache
def gguf_info(path) -> tuple[set[str], dict, int]:
    """(tensor names, pipeline.stages.mtp.mtp_facts, block count) of a GGUF, read once."""
    r = read_header(path)
    return {t.name for t in r.tensors}, mtp_facts(r), r.get("glm4moe.block_count")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, glm_hf, toolchain):
    """The tiny checkpoint converted once per mode: keep, strip, separate (model file + MTP draft)."""
    root = tmp_path_factory.mktemp("modes")
    out = {}
    for mode in ("keep", "strip", "separate"):
        r = load_recipe(mtp_recipe(root / mode, glm_hf, mode))
        d = root / mode
        out[mode] = {"gguf": d / r.base_file, "record": convert(r, glm_hf, d / r.base_file, d / "convert.json",
                                                                 log=d / "convert.log", tc=toolchain)}
        if mode == "separate":
            out["draft"] = {"gguf": d / r.mtp_file, "record": convert_mtp(r, glm_hf, d / r.mtp_file, d / "mtp.json",
                                                                          log=d / "mtp.log", tc=toolchain)}
    return out


# ------------------------------------------------------------------ recipe field


def test_recipe_mtp_field(tmp_path, glm_hf):
    assert load_recipe(mtp_recipe(tmp_path, glm_hf, None)).mtp == "keep"
    r = load_recipe(mtp_recipe(tmp_path, glm_hf, "separate"))
    assert r.mtp == "separate" and r.mtp_file == "glm-mtp-F16_MTP.gguf"
    for bad, shown in (("both", "'both'"), (True, "True")):
        path = mtp_recipe(tmp_path, glm_hf, bad)
        with pytest.raises(RecipeError) as exc:
            load_recipe(path)
        assert (exc.value.field, exc.value.message) == ("mtp", f"{shown} is not one of keep, strip, separate")


# ------------------------------------------------------------------ the convert stage per mode


def test_keep_converts_with_heads(converted):
    _, f, blocks = gguf_info(converted["keep"]["gguf"])
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], f["names"], blocks) == (4, [2], 1, MTP_NAMES, 3)
    assert "mtp" not in converted["keep"]["record"]


def test_strip_converts_without_heads(converted):
    names, f, blocks = gguf_info(converted["strip"]["gguf"])
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], blocks) == (0, [], None, 2)
    # exactly the MTP layer's block is gone, nothing of the model itself
    keep_names = gguf_info(converted["keep"]["gguf"])[0]
    assert names < keep_names and {n.split(".")[1] for n in keep_names - names if n.startswith("blk.")} == {"2"}
    assert all(n.startswith("blk.2.") for n in keep_names - names)
    assert converted["strip"]["record"]["mtp"] == {"mode": "strip", "converter_args": ["--no-mtp"]}


def test_separate_exports_heads_as_a_draft(converted):
    main, draft = converted["separate"]["gguf"], converted["draft"]["gguf"]
    assert main.read_bytes() == converted["strip"]["gguf"].read_bytes()  # the model file is the stripped one
    assert converted["separate"]["record"]["mtp"] == {"mode": "separate", "converter_args": ["--no-mtp"]}
    names, f, blocks = gguf_info(draft)
    assert (f["tensors"], f["layers"], f["nextn_predict_layers"], f["names"], blocks) == (4, [2], 1, MTP_NAMES, 3)
    # the MTP layer's block plus the embedding, output norm and output matrix it uses; no trunk layer
    keep_names = gguf_info(converted["keep"]["gguf"])[0]
    assert names == {n for n in keep_names if n.startswith("blk.2.")} | {
        "token_embd.weight", "output_norm.weight", "output.weight"}
    rec = converted["draft"]["record"]
    assert rec["converter_args"] == ["--mtp"] and rec["mtp"] == {"tensors": 4, "layers": [2], "nextn_predict_layers": 1}
    assert not list(draft.parent.glob(".*tmp*"))


def test_llama_cpp_runs_the_mtp_draft(converted, toolchain, tmp_path):
    """llama.cpp b11312 takes the exported pair for MTP speculative decoding and drafts with the head."""
    prompt = tmp_path / "p.txt"
    prompt.write_text("The quick brown fox jumps over the lazy dog. Once upon a time")
    res = run_tool(toolchain, "llama-speculative-simple", [
        "-m", converted["separate"]["gguf"], "-md", converted["draft"]["gguf"], "--spec-type", "draft-mtp",
        "-f", prompt, "-n", "8", "--spec-draft-n-max", "2", "--temp", "0", "--seed", "1", "-t", "2", "-c", "256"],
        tmp_path / "spec.log")
    assert "loading draft model" in res.output and "glm-mtp-F16_MTP.gguf" in res.output
    assert int(re.search(r"n_drafted\s*=\s*(\d+)", res.output).group(1)) > 0


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("stage,mode", [(convert, "strip"), (convert_mtp, "separate")], ids=["strip", "separate"])
def test_unsupported_architecture_one_clear_line(tmp_path, demo_snapshot, toolchain, stage, mode):
    """The demo model (LlamaForCausalLM): its converter class cannot split MTP heads off."""
    path = mtp_recipe(tmp_path, demo_snapshot, mode)
    out = tmp_path / "art" / "out.gguf"
    with pytest.raises(ToolError) as exc:
        stage(load_recipe(path), demo_snapshot, out, tmp_path / "rec.json", log=tmp_path / "c.log", tc=toolchain)
    assert (exc.value.tool, exc.value.log) == ("convert_hf_to_gguf.py", tmp_path / "c.log")
    assert str(exc.value) == (
        f"{path}: convert: mtp: {mode}: llama.cpp b11312's converter cannot split multi-token-prediction heads off "
        "LlamaForCausalLM models (--mtp / --no-mtp are refused for that architecture); set `mtp: keep` "
        f"[log: {tmp_path / 'c.log'}]")
    assert not out.exists() and not list(out.parent.glob(".*tmp*")) and not (tmp_path / "rec.json").exists()


def test_model_without_heads_gives_no_draft(tmp_path, demo_snapshot, toolchain):
    """A supported architecture whose checkpoint has no MTP layer: the converter would write an empty draft."""
    src = tiny_glm4_moe(tmp_path / "hf", demo_snapshot, nextn_layers=0)
    path = mtp_recipe(tmp_path, src, "separate")
    out = tmp_path / "art" / "glm-mtp-F16_MTP.gguf"
    with pytest.raises(PipelineError) as exc:
        convert_mtp(load_recipe(path), src, out, tmp_path / "rec.json", tc=toolchain)
    assert str(exc.value) == (f"{path}: convert: mtp: separate: the model has no multi-token-prediction heads (the "
                              "converter's --mtp export holds no nextn tensors); set `mtp: keep`")
    assert not out.exists() and not list(out.parent.glob(".*tmp*"))


def test_convert_mtp_only_for_separate(tmp_path, glm_hf):
    path = mtp_recipe(tmp_path, glm_hf, "strip")
    with pytest.raises(PipelineError, match=r"glm\.yaml: mtp: strip: the MTP draft is exported only with `mtp: separate`"):
        convert_mtp(load_recipe(path), glm_hf, tmp_path / "x.gguf", tmp_path / "x.json")


def test_heads_left_despite_no_mtp_are_caught(tmp_path, glm_hf, toolchain, monkeypatch):
    """A converter that ignores --no-mtp (an architecture class that opts in but does not filter) is caught."""
    import pipeline.stages.convert as conv

    real = conv.run_converter
    monkeypatch.setattr(conv, "run_converter", lambda tc, args, log: real(tc, [a for a in args if a != "--no-mtp"], log))
    path = mtp_recipe(tmp_path, glm_hf, "strip")
    out = tmp_path / "art" / "glm-F16.gguf"
    with pytest.raises(PipelineError, match=r"mtp: strip: the converter left 4 nextn tensors in glm-F16\.gguf despite --no-mtp"):
        convert(load_recipe(path), glm_hf, out, tmp_path / "rec.json", tc=toolchain)
    assert not out.exists()


# ------------------------------------------------------------------ the workflow


def test_convert_trigger_holds_the_mode(tmp_path, glm_hf):
    from pipeline.workflow import Workflow

    files = [mtp_recipe(tmp_path, glm_hf, mode, name=f"m-{mode}") for mode in ("keep", "strip", "separate")]
    W = Workflow({"recipes": ",".join(map(str, files))})
    params = {mode: W.trigger("convert", f"m-{mode}", outtype="F16") for mode in ("keep", "strip", "separate")}
    assert len(set(params.values())) == 3
    assert all(json.loads(params[m])["mtp"] == m for m in params)
    sep = W.recipe("m-separate")
    assert W.layout.publish_inputs(sep)["mtp"] == [str(W.layout.mtp_gguf(sep)), str(W.layout.mtp_record(sep))]
    assert "mtp" not in W.layout.publish_inputs(W.recipe("m-strip"))


