"""MiniCPM5 through the real Snakefile (issue #29): a main and a same-vocabulary draft in the layout OpenBMB publishes
(tests/helpers/hf_minicpm5.py: ``LlamaForCausalLM``, explicit ``head_dim``, two EOS ids, a byte-level BPE
``tokenizer.json`` with MiniCPM5's pre-tokenizer, the pinned tree's MiniCPM5 template), built with conformance and
its logit check against transformers' class for ``model_type: llama``; and ``source.convert_as`` on the same weights
repackaged under a class name the pinned converter does not register.

One Snakemake run (``--keep-going``) builds three recipes:

* ``m5`` with its draft ``m5-draft``: ``tokenizer_pre: minicpm5``, because the substitute vocabulary (Qwen2's, the
  real one is not available offline) hashes to ``qwen2`` in the converter; the control below shows that conformance
  fails the file without it. The main's weights are repackaged as ``architectures: [MiniCPM5ForCausalLM]``, a class
  the pinned converter does not register, with ``convert_as: LlamaForCausalLM``; the draft keeps the published
  ``LlamaForCausalLM``. Both pass conformance;
* ``m5-wrong``: the main's folder with ``convert_as: SmolLM3ForCausalLM``, a registered class whose llama.cpp graph
  skips rope on every fourth layer (src/models/smollm3.cpp:5, 69): converts and loads, and fails the logit check.

Random weights: the acceptance rate means nothing; the logit check compares two implementations of one function,
which random weights exercise as well as trained ones."""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN, snakemake, write_yaml
from helpers.hf_minicpm5 import DRAFT, tiny_minicpm5

from pipeline.gguf import read_header

N_MAX = 2


def recipe(src, name: str, **extra) -> dict:
    """A recipe without gates: conformance's logit check on 1 chunk of botchan at ctx 512 (255 positions)."""
    return {"name": name, "source": {"path": str(src), **extra.pop("source", {})}, "quants": ["Q8_0"],
            "bench": False, "conformance": {"text": str(BOTCHAN), "chunks": 1}, **extra}


@pytest.fixture(scope="module")
def m5_build(tmp_path_factory, toolchain):
    root = tmp_path_factory.mktemp("minicpm5")
    vocab = toolchain.root / "vocab" / "ggml-vocab-qwen2.gguf"
    renamed = tiny_minicpm5(root / "hf" / "main", vocab, architectures=["MiniCPM5ForCausalLM"])
    draft = tiny_minicpm5(root / "hf" / "draft", vocab, DRAFT, seed=1)
    recipes = root / "recipes"
    paths = [
        write_yaml(recipes / "m5.yaml", recipe(renamed, "m5", tokenizer_pre="minicpm5", quants=["Q4_0"],
                                               source={"convert_as": "LlamaForCausalLM"}, draft={
            "source": {"path": str(draft)}, "quants": ["Q8_0"], "pairs": [["Q4_0", "Q8_0"]], "n_max": [N_MAX],
            "prompts": 1, "n_predict": 16, "eval_text": str(BOTCHAN), "speedup": False})),
        write_yaml(recipes / "m5-wrong.yaml", recipe(renamed, "m5-wrong", tokenizer_pre="minicpm5",
                                                     source={"convert_as": "SmolLM3ForCausalLM"})),
    ]
    res = snakemake(root, paths, extra=["--keep-going"])
    return root, res


def manifest(root, name: str) -> dict:
    return json.loads((root / "artifacts" / name / "manifest.json").read_text())


def test_pair_builds_with_a_logit_check_that_ran(m5_build):
    root, res = m5_build
    for name, arch in (("m5", "llama"), ("m5-draft", "llama")):
        m = manifest(root, name)
        c = m["conformance"]
        assert c["passed"] and not c.get("failures"), c
        lg = c["checks"]["logits"]
        assert lg["passed"] and lg["positions"] == 255 and lg["top1"] >= 0.99, lg
        assert lg["hf_class"] == "transformers.models.llama.modeling_llama.LlamaForCausalLM"
        assert "outside" not in lg
        assert c["checks"]["tokenizer"]["mismatches"] == {"a": 0, "b": 0, "c": 0}
        assert m["vocab_overrides"] == {"tokenizer_pre": "minicpm5"}
        base = read_header(root / "artifacts" / name / f"{name}-F16.gguf").metadata
        assert base["general.architecture"] == arch and base["tokenizer.ggml.pre"] == "minicpm5"
    main = manifest(root, "m5")
    # the template is MiniCPM5's (XML tool calls), rendered alike by both engines; both EOS ids end generation
    assert main["conformance"]["checks"]["chat_template"]["passed"]
    eog = main["conformance"]["checks"]["eog"]
    assert eog["passed"] and "<|im_end|>" in eog["summary"]
    (pair,) = main["draft"]["pairs"]
    assert pair["compatible"] and pair["deploy"] == (f"llama-server -m m5-Q4_0.gguf -md m5-draft-Q8_0.gguf "
                                                     f"--spec-type draft-simple --spec-draft-n-max {N_MAX}")
    assert "head_dim" in json.loads((root / "work" / "m5" / "hf" / "config.json").read_text())


def test_minicpm5_pre_tokenizer_is_what_parity_needs(m5_build, toolchain):
    """Control: the converter's own choice for this substitute vocabulary (``qwen2``: the vendored vocabulary the
    checkpoint's tokenizer is made of, as llama.cpp ships it) splits a run of spaces before a digit where MiniCPM5's
    digit-first split does not; llama.cpp's ``minicpm5`` agrees with the HF tokenizer."""
    from pipeline.tools import run_tool

    root, _ = m5_build
    base = root / "artifacts" / "m5" / "m5-F16.gguf"
    as_qwen2 = toolchain.root / "vocab" / "ggml-vocab-qwen2.gguf"
    assert read_header(as_qwen2).metadata["tokenizer.ggml.pre"] == "qwen2"
    text = "Total  3 items"
    ids = {}
    for name, path in (("minicpm5", base), ("qwen2", as_qwen2)):
        out = run_tool(toolchain, "llama-tokenize", ["-m", str(path), "-p", text, "--ids", "--log-disable",
                                                     "--no-bos"], None).output
        ids[name] = json.loads([ln for ln in out.splitlines() if ln.startswith("[")][-1])
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(root / "work" / "m5" / "hf")(text)["input_ids"]
    assert ids["minicpm5"] == hf and ids["qwen2"] != hf, (ids, hf)


def test_convert_as_converts_an_unregistered_class_and_conformance_proves_it(m5_build):
    root, res = m5_build
    m = manifest(root, "m5")
    assert m["source"]["convert_as"] == {"class": "LlamaForCausalLM", "architectures": ["MiniCPM5ForCausalLM"]}
    assert "convert_as" not in manifest(root, "m5-draft")["source"]  # the draft: the published class
    lg = m["conformance"]["checks"]["logits"]
    assert m["conformance"]["passed"] and lg["passed"], lg
    assert lg["hf_class"] == "transformers.models.llama.modeling_llama.LlamaForCausalLM"


def test_wrong_convert_as_fails_conformance_in_one_line(m5_build):
    root, res = m5_build
    assert res.returncode != 0
    m = manifest(root, "m5-wrong")  # the refusal is published: no file, the reasons
    assert not m["conformance"]["passed"] and m["artifacts"] == [] and not list((root / "artifacts" / "m5-wrong").glob("*.gguf"))
    assert {f["check"] for f in m["failures"]} == {"conformance"}
    assert all(": logit fidelity: " in f["message"] for f in m["failures"])
    lines = [ln for ln in (res.stdout + res.stderr).splitlines()
             if ln.startswith("error: ") and "m5-wrong" in ln]
    assert lines and "logit fidelity" in lines[0], (res.stdout + res.stderr)[-3000:]
    rec = json.loads((root / "work" / "m5-wrong" / "records" / "conformance.json").read_text())
    assert not rec["passed"] and rec["checks"]["tokenizer"]["passed"] and not rec["checks"]["logits"]["passed"]


def test_unregistered_convert_as_is_refused_before_any_job(tmp_path, toolchain):
    path = write_yaml(tmp_path / "recipes" / "bad.yaml", recipe(tmp_path, "bad", source={"convert_as": "MiniCPM5ForCausalLM"}))
    res = snakemake(tmp_path, path)
    assert res.returncode != 0
    err = [ln for ln in (res.stdout + res.stderr).splitlines() if "convert_as" in ln]
    assert err and err[0].endswith(f"{path}: source.convert_as: 'MiniCPM5ForCausalLM' is not a model class the pinned "
                                   "converter (llama.cpp b11312) registers (@ModelBase.register in conversion/)"), err
    assert not (tmp_path / "work").exists()
