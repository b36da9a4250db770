"""A MiniCPM main model and a smaller MiniCPM draft through the whole recipe path (issue #18): ``ggufpipe build`` of a
recipe whose source and draft source are local folders; fetch, convert, quantize, gates, the draft built beside the
main, llama.cpp's vocab rule, measured acceptance with ``llama-speculative-simple``, top-1 agreement, publish; then
the published files run by llama.cpp with the published deployment line.

The checkpoints are generated (tests/helpers/hf_minicpm.py): ``MiniCPMForCausalLM`` with MiniCPM's real config keys
scaled down and Mistral 7B v0.1's SentencePiece tokenizer (the LlamaTokenizer family MiniCPM 1/2 ship). Their
weights are random: the two models are unrelated, so the acceptance rate and the top-1 agreement are measured but
mean nothing (the tests' names say so; a control with the main's own quant as the draft shows the measurement
counts accepted tokens). What these tests prove is that every stage and llama.cpp accept the
architecture, that the pair passes llama.cpp's vocab rule, and that the measurements run and are recorded.

The recipe sets ``conformance: false``: transformers 4.56 has no MiniCPM model class (MiniCPM needs the remote code
its repositories ship, which these folders do not have), so the stage's logit check cannot load the HF model. The
checks that need only the tokenizer and config (tokenizer parity, chat template, end of generation,
hyperparameters) are run on the published base file by :func:`test_tokenizer_side_conformance_passes_without_hf_model`."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from helpers import BOTCHAN, FAKE_TOKEN, ROOT, write_yaml
from helpers.hf_minicpm import DRAFT, MAIN, N_VOCAB, make_minicpm_pair

from pipeline.distribution.verify import verify
from pipeline.gguf import read_header

NAME = "tiny-minicpm"
DRAFT_NAME = f"{NAME}-draft"
MAIN_QUANTS = ["Q8_0", "Q4_K_M"]
N_MAX = [2, 4]
N_PREDICT = 32


class PairBuild(NamedTuple):
    root: Path
    recipe: Path
    main_hf: Path
    draft_hf: Path
    res: subprocess.CompletedProcess
    manifest: dict
    draft_manifest: dict


def recipe_data(main_hf: Path, draft_hf: Path) -> dict:
    """The tiny pair's recipe: the shape of docs/examples/minicpm4-8b.yaml on local folders, gates a random model
    passes (the gates run; their thresholds cannot mean anything here), no bench."""
    return {
        "name": NAME,
        "description": "tiny random MiniCPMForCausalLM main with a tiny random MiniCPM draft (test: random weights)",
        "source": {"path": str(main_hf), "trust_remote_code": True},  # its config.json has auto_map, as MiniCPM's do
        "quants": MAIN_QUANTS,
        "bench": False,
        "conformance": False,  # no MiniCPM class in transformers 4.56, no remote code here: see the module doc
        "gates": [{"name": "botchan", "text": str(BOTCHAN), "ctx": 256, "chunks": 17, "max_ppl_ratio": 100,
                   "max_kld_mean": 100, "max_kld_p99": 100, "min_same_top_p": 0}],
        "draft": {"source": {"path": str(draft_hf), "trust_remote_code": True}, "quants": ["Q8_0"],
                  "pairs": [["Q4_K_M", "Q8_0"]], "n_max": N_MAX, "prompts": 1, "n_predict": N_PREDICT},
    }


@pytest.fixture(scope="module")
def pair_build(tmp_path_factory) -> PairBuild:
    """The pair built once by ``ggufpipe build`` in a folder of its own (the user's command, the real Snakefile)."""
    root = tmp_path_factory.mktemp("minicpm")
    main_hf, draft_hf = make_minicpm_pair(root / "hf")
    recipe = write_yaml(root / "recipes" / f"{NAME}.yaml", recipe_data(main_hf, draft_hf))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_TOKEN": FAKE_TOKEN,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "build", "--cores", "2", str(recipe)], cwd=root,
                         env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    read = lambda name: json.loads((root / "artifacts" / name / "manifest.json").read_text())  # noqa: E731
    return PairBuild(root, recipe, main_hf, draft_hf, res, read(NAME), read(DRAFT_NAME))


def test_pair_builds_green_and_publishes_every_file(pair_build):
    """Both recipes pass their gates; every GGUF of the main and of the draft is published, verifiable on a device
    against its manifest, and carries the same tokenizer keys."""
    m, dm, root = pair_build.manifest, pair_build.draft_manifest, pair_build.root
    assert "gates passed: tiny-minicpm" in pair_build.res.stdout + pair_build.res.stderr
    assert m["failures"] == [] and m["rejected"] == [] and not dm.get("failures") and not dm.get("rejected")
    assert [(e["file"], e["role"]) for e in m["artifacts"]] == [
        (f"{NAME}-F16.gguf", "base"), (f"{NAME}-Q8_0.gguf", "quant"), (f"{NAME}-Q4_K_M.gguf", "quant")]
    assert [e["file"] for e in dm["artifacts"]] == [f"{DRAFT_NAME}-F16.gguf", f"{DRAFT_NAME}-Q8_0.gguf"]
    assert {e["architecture"] for e in m["artifacts"] + dm["artifacts"]} == {"minicpm"}
    assert len({e["tokenizer_sha256"] for e in m["artifacts"] + dm["artifacts"]}) == 1
    for name, entries in ((NAME, m["artifacts"]), (DRAFT_NAME, dm["artifacts"])):
        for e in entries:
            assert verify(root / "artifacts" / name / e["file"]).startswith("OK"), e["file"]
    # the gates ran on every quant (KLD against the F16 file over 2159 scored tokens)
    for e in m["artifacts"][1:]:
        assert e["gate"]["passed"] and 0 <= e["metrics"]["botchan"]["kld_mean"] < 1, e
    assert m["conformance"] == {"skipped": "the recipe opts out (conformance: false)"}
    assert (root / "work" / NAME / "gate.ok").is_file() and (root / "work" / DRAFT_NAME / "gate.ok").is_file()


def test_published_files_carry_minicpm_architecture(pair_build):
    """What the converter made of MiniCPM's config keys (conversion/minicpm.py:21-46), read back from the published
    files: the three scales, grouped-query heads, longrope factors in the main, tied embeddings in the draft."""
    art = pair_build.root / "artifacts"
    for folder, file, spec in ((NAME, f"{NAME}-Q4_K_M.gguf", MAIN), (DRAFT_NAME, f"{DRAFT_NAME}-Q8_0.gguf", DRAFT)):
        cfg = json.loads(((pair_build.main_hf if spec is MAIN else pair_build.draft_hf) / "config.json").read_text())
        h = read_header(art / folder / file)
        md, tensors = h.metadata, {t.name: t for t in h.tensors}
        assert md["general.architecture"] == "minicpm"
        assert md["minicpm.embedding_scale"] == cfg["scale_emb"] == 12
        assert math.isclose(md["minicpm.residual_scale"], cfg["scale_depth"] / math.sqrt(cfg["num_hidden_layers"]),
                            rel_tol=1e-6)
        assert md["minicpm.logit_scale"] == cfg["hidden_size"] / cfg["dim_model_base"] == 8
        assert md["minicpm.block_count"] == spec["num_hidden_layers"]
        assert md["minicpm.attention.head_count"] == spec["num_attention_heads"]
        assert md["minicpm.attention.head_count_kv"] == spec["num_key_value_heads"]
        assert md["tokenizer.ggml.model"] == "llama" and md["tokenizer.ggml.tokens"].count == N_VOCAB
        assert ("output.weight" in tensors) is (not spec["tie_word_embeddings"])
        if spec["longrope"]:
            assert md["minicpm.rope.scaling.type"] == "longrope"
            for which in ("long", "short"):
                t = tensors[f"rope_factors_{which}.weight"]
                assert t.shape == (len(cfg["rope_scaling"][f"{which}_factor"]),) == (32,)
        else:
            assert "minicpm.rope.scaling.type" not in md and not any(n.startswith("rope_factors") for n in tensors)


def test_pair_passes_llama_cpp_vocab_rule(pair_build):
    """llama.cpp's own rule (common/speculative.cpp, pipeline/stages/vocab.py) on the declared pair: compatible,
    no diff, no warning (one tokenizer, so nothing beyond the rule differs either)."""
    d = pair_build.manifest["draft"]
    assert d["recipe"] == DRAFT_NAME and d["build_id"] == pair_build.draft_manifest["build_id"]
    [p] = d["pairs"]
    assert (p["main"], p["draft"]) == (f"{NAME}-Q4_K_M.gguf", f"{DRAFT_NAME}-Q8_0.gguf")
    assert p["compatible"] is True and p["rule"] is None and p["diff"] == [] and p["warnings"] == []


def test_random_weights_acceptance_is_measured_not_meaningful(pair_build):
    """Random, unrelated weights: the acceptance rate is whatever it is (0 here); what must hold is that
    llama-speculative-simple drafted at every n_max, the counts add up, and the deployment line names the best
    n_max chosen by the recorded estimate."""
    d = pair_build.manifest["draft"]
    [p] = d["pairs"]
    a = p["acceptance"]
    assert a["eval_text"] == "botchan.txt" and a["prompts"] == 1 and a["n_predict"] == N_PREDICT
    assert sorted(a["by_n_max"]) == [str(n) for n in N_MAX]
    for n, v in a["by_n_max"].items():
        assert v["generated"] >= N_PREDICT and 0 < v["drafted"] <= int(n) * v["generated"], (n, v)
        assert 0 <= v["accepted"] <= v["drafted"] and v["acceptance_rate"] == round(v["accepted"] / v["drafted"], 4)
    best = max(a["by_n_max"], key=lambda k: (a["by_n_max"][k]["est_speedup"], -int(k)))
    assert a["best_n_max"] == int(best) and a["acceptance_rate"] == a["by_n_max"][best]["acceptance_rate"]
    agree = d["top1_agreement"][f"{DRAFT_NAME}-Q8_0.gguf"]
    assert agree["scored_tokens"] == 2159 and 0 <= agree["top1_agreement"] <= 1


def test_zero_acceptance_control_has_no_speedup_and_no_deploy_line(pair_build):
    """The no-speed-up control of the speed-up stage (pipeline/stages/speedup.py): a draft that is never accepted only
    adds work, so every round is slower with it, whatever the clock's noise; the build publishes no deploy line and
    says why in the manifest's volatile build section, the report and the card."""
    [p] = pair_build.manifest["draft"]["pairs"]
    label = f"{NAME}-Q4_K_M.gguf + {DRAFT_NAME}-Q8_0.gguf"
    sp = pair_build.manifest["build"]["draft_speedup"][label]
    assert "deploy" not in p and sp["deploy"] is None and sp["helps"] is False, sp
    assert sorted(sp["by_n_max"]) == [str(n) for n in N_MAX] and sp["rounds"] == 3
    for c in [*sp["by_n_max"].values(), sp["sampled"], sp["concurrent"]]:
        assert c["drafted"] > 0 and c["accepted"] == 0 and len(c["speedup_by_round"]) == 3, c
    assert sp["verdict"].startswith("no speed-up on ") and f"at n_max {sp['best_n_max']}" in sp["verdict"]
    assert sp["baseline"] == f"llama-server -m {NAME}-Q4_K_M.gguf --spec-type none -c 4096 -t 2 -np 1"
    assert sp["concurrent"]["command"].endswith(" -np 4") and sp["prompt_chars"] == 240
    assert sp["command"].startswith(f"llama-server -m {NAME}-Q4_K_M.gguf -md {DRAFT_NAME}-Q8_0.gguf --spec-type "
                                    f"draft-simple --spec-draft-n-max {sp['best_n_max']} ")
    for page in ("README.md", "report.md"):
        text = (pair_build.root / "artifacts" / NAME / page).read_text()
        assert f"| {sp['verdict']} |" in text, page  # the deploy column gives the verdict, not a line


def test_random_weights_control_own_quant_as_draft_is_accepted(pair_build, toolchain, tmp_path):
    """The control for the 0 above: the acceptance stage on the main's F16 file with its own published Q8_0 as the
    draft (the same random weights, quantized) accepts most drafted tokens (0.71 measured), so the 0 of the pair is
    the unrelated random models, not the measurement failing on MiniCPM."""
    from pipeline.stages.draft import acceptance, vocab_check

    folder = pair_build.root / "artifacts" / NAME
    main, draft = folder / f"{NAME}-F16.gguf", folder / f"{NAME}-Q8_0.gguf"
    assert vocab_check(main, draft, tmp_path / "vocab.json")["compatible"]
    a = acceptance(main, draft, tmp_path / "vocab.json", BOTCHAN, (4,), 1, N_PREDICT, tmp_path / "spec.json", tc=toolchain)
    v = a["by_n_max"]["4"]
    assert v["drafted"] > 0 and v["acceptance_rate"] > 0.5 and v["tokens_per_step"] > 2, a


def test_llama_cpp_runs_published_files_with_deploy_line(pair_build, toolchain, tmp_path):
    """The published pair as a device has it (both files downloaded into one folder), served by llama-server with
    the speed-up stage's line (no deploy line is published: it measured slower), word for word: it loads both and
    drafts (random weights: the count of accepted drafts says nothing). The acceptance stage ran the same line (its
    ``served`` record, in the manifest)."""
    from pipeline.stages.draft import serve_completion

    [p] = pair_build.manifest["draft"]["pairs"]
    [sp] = pair_build.manifest["build"]["draft_speedup"].values()
    argv = shlex.split(sp["command"])[:-6]  # the measured line without its -c -t -np
    # the same line but for the draft length: the speed-up stage picks its own by the clock (a zero-acceptance pair
    # is slower at every length, so which one is slowest is noise)
    assert argv[0] == "llama-server" and argv[-2] == "--spec-draft-n-max" and int(argv[-1]) == sp["best_n_max"]
    assert p["acceptance"]["served"]["command"].startswith(" ".join(argv[:-1]) + " ")
    assert p["acceptance"]["served"]["draft_n"] > 0, p["acceptance"]
    device = tmp_path / "device"
    device.mkdir()
    for name, file in ((NAME, p["main"]), (DRAFT_NAME, p["draft"])):
        os.link(pair_build.root / "artifacts" / name / file, device / file)
    t = serve_completion(toolchain, [*argv[1:], "-c", "512", "-np", "1", "-t", "2"],
                         "The quick brown fox jumps over the lazy dog. " * 4, 8, tmp_path / "serve.log", sp["command"],
                         cwd=device)
    log = (tmp_path / "serve.log").read_text()
    assert "vocabs are not compatible" not in log
    assert t["predicted_n"] == 8 and t["draft_n"] > 0, (t, log[-2000:])


def test_tokenizer_side_conformance_passes_without_hf_model(pair_build, toolchain, tmp_path):
    """The conformance checks that need no HF forward, on the published main base file against the fetched HF
    folder: tokenizer parity (every probe, 3 modes), chat template (the MiniCPM 1/2 format, rendered by both
    engines), end of generation, hyperparameters (from config.json: transformers does not know ``minicpm``). The
    logit check is not run (no eval text given), as it could not load the model."""
    from dataclasses import replace

    from pipeline.recipe import load_recipe
    from pipeline.recipe.model import Conformance
    from pipeline.stages import conformance

    recipe = replace(load_recipe(pair_build.recipe), conformance=Conformance())
    base = pair_build.root / "artifacts" / NAME / f"{NAME}-F16.gguf"
    rec = conformance.run(recipe, base, pair_build.root / "work" / NAME / "hf", None, None, tmp_path / "c.json",
                          tmp_path / "c.log", toolchain)
    checks = rec["checks"]
    assert rec["passed"], rec["failures"]
    assert checks["tokenizer"]["mismatches"] == {"a": 0, "b": 0, "c": 0}
    assert checks["tokenizer"]["hf_tokenizer"] == "SentencePieceBackend" and rec["vocab"]["type"] == "spm"
    ct = checks["chat_template"]
    assert ct["passed"] and ct["identical"] == ct["conversations"] - ct["skipped"] > 0, ct
    assert checks["eog"]["eog"] == [2] and checks["eog"]["hf_eos_ids"] == [2]
    hp = checks["hparams"]
    assert hp["source"] == "config.json" and all(hp["compared"].values()), hp
    assert {f"minicpm.{k}" for k in ("rope.freq_base", "attention.head_count", "attention.head_count_kv",
                                     "embedding_length", "embedding_scale", "residual_scale", "logit_scale")
            } <= set(hp["compared"]), hp
    assert checks["logits"]["not_run"].startswith("not run")
