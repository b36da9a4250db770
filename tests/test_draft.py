"""Draft models end to end: the demo's draft is built, checked and measured; an incompatible draft
fails the build with the rule named (and llama.cpp agrees); MTP heads are counted and a quant that
lost them is caught."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest
from gguf_factory import tiny_llama

from pipeline.errors import PipelineError
from pipeline.mtp import lost_heads, mtp_facts
from pipeline.tools import run_tool
from pipeline.verify import verify

NAME = "smollm2-135m"


def test_demo_draft_checked_and_measured(demo_build):
    m = json.loads((demo_build / "artifacts" / NAME / "manifest.json").read_text())
    d = m["draft"]
    assert m["failures"] == []
    assert d["recipe"] == f"{NAME}-draft" and [f["quant_type"] for f in d["files"]] == ["F16", "Q4_0"]
    assert [(p["main"], p["draft"]) for p in d["pairs"]] == [
        (f"{NAME}-Q8_0.gguf", f"{NAME}-draft-Q4_0.gguf"), (f"{NAME}-Q4_K_M.gguf", f"{NAME}-draft-Q4_0.gguf")]
    for p in d["pairs"]:
        assert p["compatible"] is True and p["rule"] is None and p["warnings"] == []
        a = p["acceptance"]
        assert a["eval_text"] == "botchan.txt" and len(a["text_sha256"]) == 64 and a["prompts"] == 2
        assert set(a["by_n_max"]) == {"4", "8"} and a["best_n_max"] in (4, 8)
        assert 0 < a["acceptance_rate"] < 1 and 0 < a["accepted"] < a["drafted"]
        assert a["acceptance_rate"] >= d["min_acceptance"] == 0.3
        assert p["deploy"] == (f"llama-server -m {p['main']} -md {p['draft']} --spec-type draft-simple "
                               f"--spec-draft-n-max {a['best_n_max']}")
    agree = d["top1_agreement"][f"{NAME}-draft-Q4_0.gguf"]
    assert 0.5 < agree["top1_agreement"] < 1 and agree["eval_set"] == "botchan"
    # the draft is published like any recipe: its own folder and manifest, verifiable on a device
    draft_dir = demo_build / "artifacts" / f"{NAME}-draft"
    dm = json.loads((draft_dir / "manifest.json").read_text())
    assert dm["build_id"] == d["build_id"]
    assert verify(draft_dir / f"{NAME}-draft-Q4_0.gguf").startswith("OK")
    assert "## Draft model (speculative decoding)" in (demo_build / "artifacts" / NAME / "report.md").read_text()


def test_incompatible_draft_fails_build(failing_build):
    res, m = failing_build.res, failing_build.manifest
    out = res.stdout + res.stderr
    assert res.returncode != 0
    assert re.search(r"draft tiny-spm\.gguf is incompatible with smollm2-gates-Q8_0\.gguf \(llama\.cpp rule "
                     r"vocab_type\): vocab type differs: main bpe, draft spm", out), out[-3000:]
    pair = m["draft"]["pairs"][0]
    assert pair["compatible"] is False and pair["rule"] == "vocab_type" and "acceptance" not in pair
    assert m["draft"]["gguf"]["file"] == "tiny-spm.gguf" and len(m["draft"]["gguf"]["sha256"]) == 64
    assert any(f["check"] == "draft_vocab" for f in m["failures"])
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0"]  # passing quants still published


def test_llama_cpp_agrees_the_pair_is_incompatible(failing_build, toolchain, tmp_path):
    work, draft = failing_build.work, failing_build.draft
    prompt = tmp_path / "p.txt"
    prompt.write_text("Once upon a time")
    main = work / "work" / "smollm2-gates" / "quants" / "smollm2-gates-Q8_0.gguf"
    res = subprocess.run([str(toolchain.tool("llama-speculative-simple")), "-m", str(main), "-md", str(draft),
                          "--spec-type", "draft-simple", "-f", str(prompt), "-n", "8", "-t", "1", "-c", "256"],
                         capture_output=True, text=True, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode != 0
    assert "draft model vocab type must match target model" in res.stdout + res.stderr


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
    from pipeline.manifest import check_gates, publish
    from pipeline.recipe import load_recipe

    recipe_file = tmp_path / "recipes" / "mtp.yaml"
    recipe_file.parent.mkdir()
    recipe_file.write_text("name: mtp\nsource: {path: /nonexistent}\nbench: false\nquants: [Q8_0, {type: Q8_0, variant: pruned}]\n")
    r = load_recipe(recipe_file)
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    L.base_gguf(r).parent.mkdir(parents=True)
    # the F16 base: the MTP model converted by llama-quantize (F16 keeps every tensor)
    run_tool(toolchain, "llama-quantize", [mtp_model, L.base_gguf(r), "F16", "1"], None)
    L.quant(r, "Q8_0").parent.mkdir(parents=True, exist_ok=True)
    run_tool(toolchain, "llama-quantize", [L.base_gguf(r), L.quant(r, "Q8_0"), "Q8_0", "1"], None)
    run_tool(toolchain, "llama-quantize", ["--prune-layers", "2", L.base_gguf(r), L.quant(r, "Q8_0-pruned"), "Q8_0", "1"],
             None)
    L.fetch_record(r.name).parent.mkdir(parents=True)
    L.fetch_record(r.name).write_text(json.dumps({"source": {"path": "/nonexistent"}, "files": {}}))
    L.convert_record(r).write_text(json.dumps({"toolchain": toolchain.describe(), "python": {}}))
    for q in r.quants:
        L.quant_record(r.name, q.key).write_text(json.dumps({"quant": q.describe()}))
    manifest = publish(r, L)
    assert manifest["artifacts"][0]["mtp"]["tensors"] == mtp_facts(mtp_model)["tensors"]
    assert [e["file"] for e in manifest["artifacts"]] == ["mtp-F16.gguf", "mtp-Q8_0.gguf"]
    assert [e["file"] for e in manifest["rejected"]] == ["mtp-Q8_0-pruned.gguf"]
    msg = manifest["rejected"][0]["failures"][0]["message"]
    assert msg.startswith("MTP heads lost: recipe mtp, quant Q8_0-pruned lacks") and "blk.2.nextn." in msg
    from pipeline.fsutil import write_json_atomic

    write_json_atomic(L.manifest(r.name), manifest)
    with pytest.raises(PipelineError, match="MTP heads lost"):
        check_gates(L.manifest(r.name), tmp_path / "ok")


def test_min_acceptance_gate(tmp_path):
    """The publish stage fails a compatible pair whose measured acceptance is below min_acceptance."""
    import yaml

    from pipeline.layout import Layout
    from pipeline.manifest import _draft_section
    from pipeline.recipe import load_recipe
    from pipeline.tools import find_toolchain

    draft = tmp_path / "draft.gguf"  # a vocab-only GGUF: its header is checked, the records below are judged
    shutil.copyfile(find_toolchain().root / "vocab" / "ggml-vocab-llama-spm.gguf", draft)
    text = tmp_path / "text.txt"
    text.write_text("some prose\n" * 100)
    recipe_file = tmp_path / "r.yaml"
    recipe_file.write_text(yaml.safe_dump({"name": "m", "source": {"path": str(tmp_path)}, "quants": ["Q8_0"],
                                           "draft": {"gguf": str(draft), "eval_text": str(text), "n_max": [4],
                                                     "min_acceptance": 0.6}}))
    r = load_recipe(recipe_file)
    L = Layout(tmp_path / "artifacts", tmp_path / "work")
    L.vocab_record("m", "Q8_0", "gguf").parent.mkdir(parents=True)
    L.vocab_record("m", "Q8_0", "gguf").write_text(json.dumps(
        {"compatible": True, "rule": None, "reason": None, "diff": [], "warnings": []}))
    L.spec_record("m", "Q8_0", "gguf").write_text(json.dumps(
        {"acceptance_rate": 0.5, "best_n_max": 4, "drafted": 100, "accepted": 50, "build_box_decode_tokens_per_s": {}}))
    info, failures, _ = _draft_section(r, L)
    assert info["pairs"][0]["deploy"].endswith("-md draft.gguf --spec-type draft-simple --spec-draft-n-max 4")
    assert [f["message"] for f in failures] == [
        "draft acceptance too low: recipe m, m-Q8_0.gguf + draft.gguf: acceptance 0.5000 < min_acceptance 0.6 (n_max 4)"]
