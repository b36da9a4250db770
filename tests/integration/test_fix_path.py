"""The recipe's fix path: `chat_template_override`, `eos_token_ids` and `add_bos` written into the base GGUF by
the real convert stage (gguf-py, every other key and tensor copied), carried by a real llama-quantize output,
recorded in the convert record, and then checked by the conformance stage like any file: the override template
renders identically in both engines, and an `add_bos` that HF does not share is caught as a BOS/EOS policy
difference."""

from __future__ import annotations

import json

import pytest
import yaml

from pipeline.gguf import read_header, tokenizer_sha256
from pipeline.recipe import load_recipe
from pipeline.stages import conformance
from pipeline.stages.convert import convert
from pipeline.tools import run_tool

# A ChatML variant the demo's HF template is not: a fixed system line when the conversation has none
TEMPLATE = ("{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a test.<|im_end|>\n{% endif %}"
            "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def fixed(tmp_path_factory, demo_snapshot, toolchain):
    """The demo converted with every fix-path key, and its Q8_0: (recipe, base, quant, convert record)."""
    work = tmp_path_factory.mktemp("fix-path")
    (work / "template.jinja").write_text(TEMPLATE)
    rfile = work / "fixed.yaml"
    rfile.write_text(yaml.safe_dump({"name": "fixed", "source": {"path": str(demo_snapshot)}, "quants": ["Q8_0"],
                                     "chat_template_override": "template.jinja", "eos_token_ids": [2, 0],
                                     "add_bos": True}))
    recipe = load_recipe(rfile)
    base, record = work / "fixed-F16.gguf", work / "convert.json"
    convert(recipe, demo_snapshot, base, record, work / "convert.log", tc=toolchain)
    quant = work / "fixed-Q8_0.gguf"
    run_tool(toolchain, "llama-quantize", [base, quant, "Q8_0", "2"], None)
    return recipe, base, quant, json.loads(record.read_text())


def test_keys_written_into_the_base_and_carried_by_quants(fixed):
    recipe, base, quant, record = fixed
    meta = read_header(base).metadata
    assert meta["tokenizer.chat_template"] == TEMPLATE
    assert (meta["tokenizer.ggml.eos_token_id"], meta["tokenizer.ggml.eot_token_id"]) == (2, 0)
    assert "tokenizer.ggml.eom_token_id" not in meta and meta["tokenizer.ggml.add_bos_token"] is True
    assert record["vocab_overrides"] == {"chat_template": TEMPLATE, "eos_token_ids": [2, 0], "add_bos": True}
    assert read_header(quant).metadata["tokenizer.chat_template"] == TEMPLATE
    assert tokenizer_sha256(quant) == tokenizer_sha256(base)  # byte for byte: what publish checks per file
    assert len(read_header(base).tensors) == len(read_header(quant).tensors) > 0


def test_conformance_checks_the_fixed_file(fixed, demo_snapshot, toolchain, tmp_path):
    recipe, base, _, _ = fixed
    rec = conformance.run(recipe, base, demo_snapshot, None, None, tmp_path / "conformance.json",
                          tmp_path / "conformance.log", toolchain)
    checks = rec["checks"]
    assert checks["chat_template"]["passed"] and checks["chat_template"]["identical"] >= 5, checks["chat_template"]
    assert checks["eog"]["passed"] and {0, 2} <= set(checks["eog"]["eog"]), checks["eog"]
    # add_bos true in the GGUF, while SmolLM2's HF tokenizer adds none: the defaults differ, nothing else
    assert not checks["tokenizer"]["passed"] and checks["tokenizer"]["mismatches"]["a"] == 0, checks["tokenizer"]
    assert any("BOS/EOS policy differs" in f for f in rec["failures"]), rec["failures"]
    assert checks["logits"]["not_run"] and rec["passed"] is False
