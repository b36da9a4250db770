"""Qwen3.5 with its multi-token-prediction (MTP) layer through the real Snakefile (issue #18): a tiny generated
``Qwen3_5ForConditionalGeneration`` checkpoint (llama.cpp architecture ``qwen35``: Gated DeltaNet linear-attention
layers, gated full attention, one MTP layer; helpers.hf_qwen35) built twice in one Snakemake run:

* ``mtp: keep``: the MTP layer inside every file; quants Q4_0 and Q4_0 with the MTP layer at Q8_0 (``Q4_0_MTPQ``,
  ``tensor_types: ['blk\\.4\\.=q8_0']``): the MTP-quantization comparison, both acceptances in one manifest;
* ``mtp: separate``: model files without the layer, plus the ``<name>-mtp-F16_MTP.gguf`` draft.

Both recipes have ``draft: {mtp: true}``: the acceptance stage runs ``llama-speculative-simple --spec-type draft-mtp``
(``-md <sidecar>`` for ``separate``) on every published quant (the F16s are not paired: they run the same path) and
the manifest records drafted / accepted tokens per pair. RANDOM WEIGHTS: the acceptance rates are meaningless (a
random MTP head agrees with a random trunk by chance only; these runs accept nothing); the tests prove that every
stage and llama.cpp accept the architecture and that the measurements run, not how well Qwen3.5's head drafts.
"""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN, snakemake
from helpers.hf_qwen35 import tiny_qwen35

from pipeline.errors import ToolError
from pipeline.gguf import read_header
from pipeline.stages.mtp import lost_heads, mtp_facts
from pipeline.tools import run_tool

HEADS = {"tensors": 4, "layers": [4], "nextn_predict_layers": 1}  # blk.4.nextn.{eh_proj,enorm,hnorm,shared_head_norm}
N_MAX = 2


def write_recipe(folder, src, name: str, mtp: str, quants: list, pairs: list, conformance: bool = False):
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    # conformance on one recipe (the keep build: the heads inside the base GGUF) is enough: the three share the
    # converter path; its logit check runs on its own chunk of botchan (the recipes have no eval sets).
    # tokenizer_pre: the substitute vocabulary hashes to qwen2 (helpers.hf_qwen35); Qwen3.5's own selects qwen35,
    # whose regex keeps combining marks in words (conformance's khmer-thai probe fails under qwen2)
    data = {"name": name, "source": {"path": str(src)}, "mtp": mtp, "quants": quants, "bench": False,
            "tokenizer_pre": "qwen35",
            "conformance": {"text": str(BOTCHAN), "chunks": 1} if conformance else False,
            "draft": {"mtp": True, "n_max": [N_MAX], "prompts": 1, "n_predict": 16, "eval_text": str(BOTCHAN),
                      "pairs": pairs, "speedup": False}}
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def qwen_build(tmp_path_factory, toolchain):
    """One Snakemake run building the ``keep`` and the ``separate`` recipe of the tiny random Qwen3.5 checkpoint, and
    the ``keep`` recipe of its ``echo`` control (helpers.hf_qwen35: a head built to draft what the model repeats)."""
    root = tmp_path_factory.mktemp("qwen35")
    vocab = toolchain.root / "vocab" / "ggml-vocab-qwen35.gguf"
    src = tiny_qwen35(root / "hf", vocab)
    echo = tiny_qwen35(root / "hf-echo", src, echo=True)
    keep_quants = ["Q4_0", {"type": "Q4_0", "variant": "mtpq", "tensor_types": [r"blk\.4\.=q8_0"]}]
    keep_pairs = [["Q4_0", "mtp"], ["Q4_0_MTPQ", "mtp"]]
    recipes = [write_recipe(root / "recipes", src, "q35-keep", "keep", keep_quants, keep_pairs, conformance=True),
               write_recipe(root / "recipes", src, "q35-sep", "separate", ["Q4_0"], [["Q4_0", "mtp"]]),
               write_recipe(root / "recipes", echo, "q35-echo", "keep", ["Q4_0"], [["Q4_0", "mtp"]])]
    res = snakemake(root, recipes)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    return root


def manifest(root, name):
    return json.loads((root / "artifacts" / name / "manifest.json").read_text())


def check_pairs(m: dict, expected: dict[str, str]) -> None:
    """Every pair measured with draft-mtp, recorded like a draft model's, and its deploy line exactly the
    spec arguments of the command that was run."""
    d = m["draft"]
    assert d["mtp"] is True and d["n_max"] == [N_MAX] and "top1_agreement" not in d
    assert {p["main"]: p["deploy"] for p in d["pairs"]} == expected
    for p in d["pairs"]:
        a = p["acceptance"]
        assert p["compatible"] and a["spec_type"] == "draft-mtp" and a["best_n_max"] == N_MAX
        assert a["drafted"] > 0 and 0 <= a["accepted"] <= a["drafted"]
        assert a["acceptance_rate"] == round(a["accepted"] / a["drafted"], 4)
        assert a["by_n_max"][str(N_MAX)]["generated"] >= 16 and a["prompts"] == 1
        run = a["command"].split()
        assert run[0] == "llama-speculative-simple"
        deploy_args = p["deploy"].split()[1:]
        assert " ".join(run[1:1 + len(deploy_args)]) == " ".join(deploy_args)


def test_keep_build_publishes_heads_and_measures_mtp_acceptance_random_weights(qwen_build):
    m = manifest(qwen_build, "q35-keep")
    assert [(e["file"], e["role"]) for e in m["artifacts"]] == [
        ("q35-keep-F16.gguf", "base"), ("q35-keep-Q4_0.gguf", "quant"), ("q35-keep-Q4_0_MTPQ.gguf", "quant")]
    assert all(e["mtp"] == HEADS for e in m["artifacts"]) and "mtp" not in m and not m["failures"]
    # conformance on transformers 5 (models/qwen3_5): every check passed, the logit check ran on the class
    # AutoModelForCausalLM maps qwen3_5 to, and the record says that the MTP layer is outside it
    c = m["conformance"]
    assert c["passed"] and set(c["checks"]) == {"tokenizer", "chat_template", "eog", "hparams", "logits"}, c
    lg = c["checks"]["logits"]
    assert lg["passed"] and lg["positions"] == 255 and "not_run" not in lg, lg
    assert lg["hf_class"] == "transformers.models.qwen3_5.modeling_qwen3_5.Qwen3_5ForCausalLM"
    assert lg["outside"] == ["the MTP layer blk.4 (4 nextn tensors, nextn_predict_layers 1): neither llama.cpp's "
                             "main-model logits nor the HF forward runs them; the acceptance stage measures their "
                             "drafts"]
    assert "conformance" in manifest(qwen_build, "q35-sep") and manifest(qwen_build, "q35-sep")["conformance"] == {
        "skipped": "the recipe opts out (conformance: false)"}
    check_pairs(m, {f: f"llama-server -m {f} --spec-type draft-mtp --spec-draft-n-max {N_MAX}"
                    for f in ("q35-keep-Q4_0.gguf", "q35-keep-Q4_0_MTPQ.gguf")})
    # the comparison: the MTP layer at the quant's type vs at Q8_0, everything else equal
    folder = qwen_build / "artifacts" / "q35-keep"
    types = {f: {t.name: t.type_name for t in read_header(folder / f).tensors if t.name.startswith("blk.4.")}
             for f in ("q35-keep-Q4_0.gguf", "q35-keep-Q4_0_MTPQ.gguf")}
    assert types["q35-keep-Q4_0.gguf"]["blk.4.nextn.eh_proj.weight"] == "Q4_0"
    assert types["q35-keep-Q4_0_MTPQ.gguf"]["blk.4.nextn.eh_proj.weight"] == "Q8_0"
    assert {k for k, v in types["q35-keep-Q4_0_MTPQ.gguf"].items() if v == "Q8_0"} == {
        k for k, v in types["q35-keep-Q4_0.gguf"].items() if v == "Q4_0"}
    card = (folder / "README.md").read_text()
    for p in m["draft"]["pairs"]:
        assert f"`{p['deploy']}`" in card and p["acceptance"]["command"] in card
    assert (qwen_build / "work" / "q35-keep" / "gate.ok").is_file()


def test_separate_build_publishes_sidecar_and_measures_mtp_acceptance_random_weights(qwen_build):
    m = manifest(qwen_build, "q35-sep")
    assert [(e["file"], e["role"]) for e in m["artifacts"]] == [
        ("q35-sep-F16.gguf", "base"), ("q35-sep-mtp-F16_MTP.gguf", "mtp-draft"), ("q35-sep-Q4_0.gguf", "quant")]
    base, side, q4 = m["artifacts"]
    assert "mtp" not in base and "mtp" not in q4 and side["mtp"] == HEADS
    sidecar = "q35-sep-mtp-F16_MTP.gguf"
    lines = {f: f"llama-server -m {f} -md {sidecar} --spec-type draft-mtp --spec-draft-n-max {N_MAX}"
             for f in ("q35-sep-Q4_0.gguf",)}
    check_pairs(m, lines)
    card = (qwen_build / "artifacts" / "q35-sep" / "README.md").read_text()
    assert all(f"`{line}`" in card for line in lines.values())
    assert (qwen_build / "work" / "q35-sep" / "gate.ok").is_file()


@pytest.mark.parametrize("name", ["q35-keep", "q35-sep"])
def test_published_deploy_lines_run_in_llama_server_random_weights(qwen_build, toolchain, tmp_path, name):
    """Each published deploy line, word for word, on the published files (artifacts/, as a device pulls them):
    llama-server loads them and drafts with the MTP heads; the acceptance stage ran the same line (its ``served``
    record, in the manifest)."""
    import shlex

    from pipeline.stages.draft import serve_completion

    folder = qwen_build / "artifacts" / name
    for p in manifest(qwen_build, name)["draft"]["pairs"]:
        argv = shlex.split(p["deploy"])
        assert argv[0] == "llama-server" and p["acceptance"]["served"]["command"].startswith(p["deploy"] + " ")
        assert p["acceptance"]["served"]["draft_n"] > 0, p["acceptance"]
        t = serve_completion(toolchain, [*argv[1:], "-c", "256", "-np", "1", "-t", "2"],
                             "The quick brown fox jumps over the lazy dog.", 8, tmp_path / "serve.log", p["deploy"],
                             cwd=folder)
        assert t["predicted_n"] == 8 and t["draft_n"] > 0, (t, (tmp_path / "serve.log").read_text()[-2000:])
        assert "draft-mtp" in (tmp_path / "serve.log").read_text()


def test_quant_without_heads_is_refused_by_pipeline_and_llama_cpp(qwen_build, toolchain, tmp_path):
    """A Q4_0 made from a base without the MTP layer (the ``separate`` build's F16) as a quant of the ``keep``
    build: the publish stage's check finds the 4 nextn tensors missing, and llama.cpp's draft-mtp cannot run on it
    (common/speculative.cpp:2552-2564: no MTP context); the acceptance stage says so in one line."""
    from pipeline.stages.draft import acceptance

    keep_f16 = qwen_build / "work" / "q35-keep" / "quants" / "q35-keep-F16.gguf"
    lost = tmp_path / "q35-keep-Q4_0.gguf"
    run_tool(toolchain, "llama-quantize", [qwen_build / "work" / "q35-sep" / "quants" / "q35-sep-F16.gguf", lost,
                                           "Q4_0", "2"], tmp_path / "q.log")
    assert lost_heads(mtp_facts(keep_f16), mtp_facts(lost)) == [
        f"blk.4.nextn.{k}.weight" for k in ("eh_proj", "enorm", "hnorm", "shared_head_norm")]
    vocab = tmp_path / "vocab.json"
    vocab.write_text(json.dumps({"compatible": True}))
    with pytest.raises(ToolError) as exc:
        acceptance(lost, None, vocab, BOTCHAN, (N_MAX,), 1, 16, tmp_path / "acc.json", spec_type="draft-mtp",
                   log=tmp_path / "acc.log", tc=toolchain)
    assert (exc.value.tool, exc.value.log) == ("llama-speculative-simple", tmp_path / "acc.log")
    assert exc.value.returncode not in (0, None)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith("llama-speculative-simple --spec-type draft-mtp failed on q35-keep-Q4_0.gguf")
    assert "failed to create MTP context" in msg and not (tmp_path / "acc.json").exists()


def test_mtp_acceptance_control_echo_head_drafts_what_the_model_repeats(qwen_build):
    """Control for the zero acceptance of the random checkpoint: the ``echo`` checkpoint (the model repeats its last
    token, the MTP head predicts the token it is given) built by the same stages: every token its Q4_0 file drafts
    is accepted, so the acceptance stage counts acceptances through llama.cpp's MTP path. Structured, not trained:
    its rate says nothing about a real model's either."""
    m = manifest(qwen_build, "q35-echo")
    assert all(e["mtp"] == HEADS for e in m["artifacts"])
    [pair] = m["draft"]["pairs"]
    a = pair["acceptance"]
    assert pair["main"] == "q35-echo-Q4_0.gguf" and a["drafted"] > 0 and a["accepted"] == a["drafted"], a
    assert a["acceptance_rate"] == 1.0
