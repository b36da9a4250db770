"""Draft models end to end: the demo's draft is built, checked and measured; an incompatible draft fails the
build with the rule named, and llama.cpp agrees."""

from __future__ import annotations

import json
import re
import subprocess

from helpers import DEMO_TEST_PROMPTS, GATES_NAME

from pipeline.distribution.verify import verify

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
        assert a["eval_text"] == "botchan.txt" and len(a["text_sha256"]) == 64 and a["prompts"] == DEMO_TEST_PROMPTS
        assert set(a["by_n_max"]) == {"4", "8"} and a["best_n_max"] in (4, 8)
        assert 0 < a["acceptance_rate"] < 1 and 0 < a["accepted"] < a["drafted"]
        assert a["acceptance_rate"] >= d["min_acceptance"] == 0.3
        assert p["deploy"] == (f"llama-server -m {p['main']} -md {p['draft']} --spec-type draft-simple "
                               f"--spec-draft-n-max {a['best_n_max']}")
        # the deploy line itself, served by llama-server on the pair: it drafted, and accepted some (trained models)
        s = a["served"]
        assert s["command"].startswith(p["deploy"] + " -c 2048 -np 1 -t "), s
        assert 0 < s["predicted_n"] <= a["n_predict"] and 0 < s["draft_n_accepted"] <= s["draft_n"], s
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
    assert re.search(r"draft tiny-bpe\.gguf is incompatible with tiny-gates-Q8_0\.gguf \(llama\.cpp rule "
                     r"vocab_type\): vocab type differs: main spm, draft bpe", out), out[-3000:]
    pair = m["draft"]["pairs"][0]
    assert pair["compatible"] is False and pair["rule"] == "vocab_type" and "acceptance" not in pair
    assert m["draft"]["gguf"]["file"] == "tiny-bpe.gguf" and len(m["draft"]["gguf"]["sha256"]) == 64
    assert any(f["check"] == "draft_vocab" for f in m["failures"])
    assert [e["quant_type"] for e in m["artifacts"]] == ["F16", "Q8_0"]  # passing quants still published


def test_llama_cpp_agrees_the_pair_is_incompatible(failing_build, toolchain, tmp_path):
    work, draft = failing_build.work, failing_build.draft
    prompt = tmp_path / "p.txt"
    prompt.write_text("Once upon a time")
    main = work / "work" / GATES_NAME / "quants" / f"{GATES_NAME}-Q8_0.gguf"
    res = subprocess.run([str(toolchain.tool("llama-speculative-simple")), "-m", str(main), "-md", str(draft),
                          "--spec-type", "draft-simple", "-f", str(prompt), "-n", "8", "-t", "1", "-c", "256"],
                         capture_output=True, text=True, env={"GGML_NO_BACKTRACE": "1", "PATH": "/usr/bin:/bin"})
    assert res.returncode != 0
    assert "draft model vocab type must match target model" in res.stdout + res.stderr
