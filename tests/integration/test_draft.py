"""MTP heads: counted in the header, kept by llama-quantize and lost by pruning, and a quant that lost them is
rejected at publish; the min_acceptance gate of a measured pair."""

from __future__ import annotations

import json
import shutil

import pytest
from helpers.gguf_factory import tiny_llama

from pipeline.errors import GateFailure
from pipeline.stages.mtp import lost_heads, mtp_facts
from pipeline.tools import run_tool

NAME = "smollm2-135m"


# ------------------------------------------------------------------ MTP heads


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory, source_gguf):
    path = tmp_path_factory.mktemp("mtp") / "mtp-f32.gguf"
    return tiny_llama(path, tokenizer_from=source_gguf, n_layer=2, nextn_layers=1)


def test_mtp_heads_counted(mtp_model):
    f = mtp_facts(mtp_model)
    assert f["layers"] == [2] and f["nextn_predict_layers"] == 1
    assert f["tensors"] == len(f["names"]) >= 4 and all(n.startswith("blk.2.nextn.") for n in f["names"])


def test_mtp_kept_by_quantize_and_lost_by_pruning(mtp_model, toolchain, tmp_path):
    base = mtp_facts(mtp_model)
    kept = tmp_path / "q8.gguf"
    run_tool(toolchain, "llama-quantize", [mtp_model, kept, "Q8_0", "1"], tmp_path / "q.log")
    assert lost_heads(base, mtp_facts(kept)) == []
    pruned = tmp_path / "pruned.gguf"
    run_tool(toolchain, "llama-quantize", ["--prune-layers", "2", mtp_model, pruned, "Q8_0", "1"], tmp_path / "p.log")
    lost = lost_heads(base, mtp_facts(pruned))
    assert lost == base["names"]


def test_publish_rejects_quant_that_lost_mtp_heads(mtp_model, toolchain, tmp_path):
    """The publish stage itself: a quant without the base file's MTP heads is rejected."""
    from pipeline.layout import Layout
    from pipeline.recipe import load_recipe
    from pipeline.stages.publish import check_gates, publish

    # (not "mtp": llama.cpp's -hf takes every file named mtp-... for an MTP sidecar, and the recipe is refused)
    recipe_file = tmp_path / "recipes" / "nextn.yaml"
    recipe_file.parent.mkdir()
    recipe_file.write_text("name: nextn\nsource: {path: /nonexistent}\nbench: false\nconformance: false\nquants: [Q8_0, {type: Q8_0, variant: pruned}]\n")
    r = load_recipe(recipe_file)
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    L.base_gguf(r).parent.mkdir(parents=True)
    # the F16 base: the MTP model converted by llama-quantize (F16 keeps every tensor)
    run_tool(toolchain, "llama-quantize", [mtp_model, L.base_gguf(r), "F16", "1"], None)
    L.quant(r, "Q8_0").parent.mkdir(parents=True, exist_ok=True)
    run_tool(toolchain, "llama-quantize", [L.base_gguf(r), L.quant(r, "Q8_0"), "Q8_0", "1"], None)
    run_tool(toolchain, "llama-quantize", ["--prune-layers", "2", L.base_gguf(r), L.quant(r, "Q8_0_PRUNED"), "Q8_0", "1"],
             None)
    L.fetch_record(r.name).parent.mkdir(parents=True)
    L.fetch_record(r.name).write_text(json.dumps({"source": {"path": "/nonexistent"}, "files": {}}))
    L.convert_record(r).write_text(json.dumps({"toolchain": toolchain.describe(), "python": {}}))
    for q in r.quants:
        L.quant_record(r.name, q.key).write_text(json.dumps({"quant": q.describe()}))
    manifest = publish(r, L)
    assert manifest["artifacts"][0]["mtp"]["tensors"] == mtp_facts(mtp_model)["tensors"]
    assert [e["file"] for e in manifest["artifacts"]] == ["nextn-F16.gguf", "nextn-Q8_0.gguf"]
    assert [e["file"] for e in manifest["rejected"]] == ["nextn-Q8_0_PRUNED.gguf"]
    msg = manifest["rejected"][0]["failures"][0]["message"]
    assert msg.startswith("MTP heads lost: recipe nextn, quant Q8_0_PRUNED lacks") and "blk.2.nextn." in msg
    from pipeline.fsutil import write_json_atomic

    write_json_atomic(L.manifest(r.name), manifest)
    with pytest.raises(GateFailure) as exc:
        check_gates(L.manifest(r.name), tmp_path / "ok")
    assert [(c["check"], c["file"]) for c in exc.value.checks] == [("mtp", "nextn-Q8_0_PRUNED.gguf")]
    assert exc.value.messages == [msg] and exc.value.published == 1


def test_min_acceptance_gate(tmp_path):
    """The publish stage fails a compatible pair whose measured acceptance is below min_acceptance, or whose measured
    speed-up is below min_speedup; a measured deploy line exists only where the interval is above 1."""
    import yaml

    from pipeline.layout import Layout
    from pipeline.recipe import load_recipe
    from pipeline.stages.publish import _draft_section
    from pipeline.tools import find_toolchain

    draft = tmp_path / "draft.gguf"  # a vocab-only GGUF: its header is checked, the records below are judged
    shutil.copyfile(find_toolchain().root / "vocab" / "ggml-vocab-llama-spm.gguf", draft)
    text = tmp_path / "text.txt"
    text.write_text("some prose\n" * 100)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(yaml.safe_dump({"name": "m", "source": {"path": str(tmp_path)}, "quants": ["Q8_0"],
                                           "draft": {"gguf": str(draft), "eval_text": str(text), "n_max": [4],
                                                     "min_acceptance": 0.6, "speedup": False}}))
    r = load_recipe(recipe_file)
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    L.vocab_record("m", "Q8_0", "gguf").parent.mkdir(parents=True)
    L.vocab_record("m", "Q8_0", "gguf").write_text(json.dumps(
        {"compatible": True, "rule": None, "reason": None, "diff": [], "warnings": []}))
    L.spec_record("m", "Q8_0", "gguf").write_text(json.dumps(
        {"acceptance_rate": 0.5, "best_n_max": 4, "drafted": 100, "accepted": 50, "build_box_decode_tokens_per_s": {}}))
    info, failures, _ = _draft_section(r, L)
    assert info["pairs"][0]["deploy"].endswith("-md draft.gguf --spec-type draft-simple --spec-draft-n-max 4")
    assert info["speedup"].startswith("not measured (draft.speedup: false)")
    assert [f["message"] for f in failures] == [
        "draft acceptance too low: recipe m, m-Q8_0.gguf + draft.gguf: acceptance 0.5000 < min_acceptance 0.6 (n_max 4)"]
    # measured: the line follows the interval, and min_speedup gates the median (records as the stage writes them)
    data = yaml.safe_load(recipe_file.read_text())
    data["draft"].update(speedup={"rounds": 3}, min_speedup=1.2, min_acceptance=None)
    recipe_file.write_text(yaml.safe_dump(data))
    r = load_recipe(recipe_file)
    base = {"eval_text": "text.txt", "text_sha256": "0" * 64, "prompts": 3, "n_predict": 96, "threads": 2,
            "spec_type": "draft-simple", "rounds": 3, "ctx": 4096, "box": "a box, 2 cores", "best_n_max": 4,
            "by_n_max": {}, "sampled": {}, "concurrent": {}, "command": "c", "baseline": "b", "seconds": 1.0}
    for speed, interval, line in ((1.3, [1.1, 1.5], "--spec-draft-n-max 4"), (1.1, [0.9, 1.3], None)):
        L.speedup_record("m", "Q8_0", "gguf").write_text(json.dumps(
            {**base, "speedup": speed, "interval": interval, "helps": interval[0] > 1, "verdict": f"v {speed}"}))
        info, failures, timings = _draft_section(r, L)
        sp = timings["speedup"]["m-Q8_0.gguf + draft.gguf"]
        assert "deploy" not in info["pairs"][0] and "speedup" not in info  # the decision is volatile: build section
        assert (sp["deploy"] or "").endswith(line or "") and (sp["deploy"] is None) == (line is None), sp
        assert [f["message"] for f in failures] == ([] if speed >= 1.2 else [
            "draft speed-up too low: recipe m, m-Q8_0.gguf + draft.gguf: 1.10x (0.90-1.30) < min_speedup 1.2 "
            "(n_max 4, a box, 2 cores)"])
