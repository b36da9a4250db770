"""Recipe ``draft: {mtp: true}`` (the model's own MTP heads as the speculative draft) and the ready Qwen3.5-4B recipe
(docs/examples/qwen3.5-4b-mtp.yaml), validated offline: no Hub, no llama.cpp."""

from __future__ import annotations

import pytest
from helpers import ROOT, recipe_error, write_recipe_text

from pipeline.recipe import load_recipe

EXAMPLE = ROOT / "docs" / "examples" / "qwen3.5-4b-mtp.yaml"

MTP_RECIPE = """\
name: m
source: {repo: org/model, revision: main}
mtp: keep
quants: [Q8_0, Q4_0]
draft:
  mtp: true
  eval_text: ../data/botchan.txt
"""


def test_qwen35_example_recipe_validates_offline():
    r = load_recipe(EXAMPLE)
    assert (r.name, r.source.repo, r.source.revision, r.outtype, r.mtp) == (
        "qwen3.5-4b", "Qwen/Qwen3.5-4B", "main", "bf16", "keep")
    assert [q.key for q in r.quants] == ["Q8_0", "Q4_K_M", "Q4_K_M_MTPQ"]
    assert r.quant("Q4_K_M_MTPQ").quantize_args() == ["--tensor-type", r"blk\.32\.=q8_0"]
    assert r.conformance.enabled and r.draft_recipe() is None  # transformers 5.17 has qwen3_5
    d = r.draft
    assert d.mtp and d.source is None and d.gguf is None and d.n_max == (1, 2, 3)
    assert d.pairs == (("BF16", "mtp"), ("Q8_0", "mtp"), ("Q4_K_M", "mtp"), ("Q4_K_M_MTPQ", "mtp"))
    assert d.eval_text == ROOT / "data" / "botchan.txt"  # the gate's text


@pytest.fixture
def recipes(tmp_path):
    """A recipes folder beside data/botchan.txt (the draft eval text the recipes name)."""
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "botchan.txt").write_text("x")
    (tmp_path / "recipes").mkdir()
    return tmp_path / "recipes"


def test_mtp_draft_defaults(recipes):
    r = load_recipe(write_recipe_text(recipes, MTP_RECIPE))
    assert r.draft.mtp and r.draft.pairs == (("Q8_0", "mtp"), ("Q4_0", "mtp"))
    assert r.draft_recipe() is None
    sep = load_recipe(write_recipe_text(recipes, MTP_RECIPE.replace("mtp: keep", "mtp: separate"), "s.yaml"))
    assert sep.draft.mtp and sep.mtp == "separate"


BAD = [
    ("strip has no heads", MTP_RECIPE.replace("mtp: keep", "mtp: strip"),
     "draft.mtp", "the recipe leaves the MTP heads out (mtp: strip): there is no MTP draft; use mtp: keep or separate"),
    ("mtp and source", MTP_RECIPE.replace("  mtp: true", "  mtp: true\n  source: {repo: org/small, revision: main}"),
     "draft", "give exactly one of `source` (built like the main model), `gguf` (an existing file) or `mtp: true`"),
    ("mtp false alone", MTP_RECIPE.replace("  mtp: true", "  mtp: false"),
     "draft", "give exactly one of `source` (built like the main model), `gguf` (an existing file) or `mtp: true`"),
    ("mtp not bool", MTP_RECIPE.replace("  mtp: true", "  mtp: 'yes'"), "draft.mtp", "must be true or false"),
    ("mtp with quants", MTP_RECIPE.replace("  mtp: true", "  mtp: true\n  quants: [Q4_0]"),
     "draft.quants", "only valid with draft.source"),
    ("pair to a draft quant", MTP_RECIPE + "  pairs: [[Q8_0, Q4_0]]\n",
     "draft.pairs[0]", "'Q4_0' is not a draft quant (mtp)"),
]


@pytest.mark.parametrize("label,text,field,what", BAD, ids=[b[0] for b in BAD])
def test_mtp_draft_refusals_one_line(recipes, label, text, field, what):
    exc = recipe_error(write_recipe_text(recipes, text))
    assert exc.field == field and exc.message.startswith(what), exc


def test_deploy_line_is_the_leading_arguments_of_the_run():
    from pipeline.stages.draft import deployment_line, spec_args

    assert deployment_line("m-Q4_0.gguf", None, 3, "draft-mtp") == (
        "llama-server -m m-Q4_0.gguf --spec-type draft-mtp --spec-draft-n-max 3")
    assert deployment_line("m-Q4_0.gguf", "m-mtp-F16_MTP.gguf", 2, "draft-mtp") == (
        "llama-server -m m-Q4_0.gguf -md m-mtp-F16_MTP.gguf --spec-type draft-mtp --spec-draft-n-max 2")
    assert deployment_line("m.gguf", "d.gguf", 4) == "llama-server -m m.gguf -md d.gguf --spec-type draft-simple --spec-draft-n-max 4"
    assert spec_args("m.gguf", None, "draft-mtp", 1) == ["-m", "m.gguf", "--spec-type", "draft-mtp", "--spec-draft-n-max", "1"]


def test_report_shows_measured_mtp_lines():
    from pipeline.stages.report import draft_table, mtp_text

    line = "llama-server -m m-Q4_0.gguf -md m-mtp-F16_MTP.gguf --spec-type draft-mtp --spec-draft-n-max 2"
    run = ("llama-speculative-simple -m m-Q4_0.gguf -md m-mtp-F16_MTP.gguf --spec-type draft-mtp --spec-draft-n-max 2 "
           "-f prompt<i>.txt -n 16 --temp 0 --seed 1 -t 2 -c 2048")
    manifest = {
        "artifacts": [{"file": "m-mtp-F16_MTP.gguf", "role": "mtp-draft", "quant_type": "F16", "size_bytes": 1 << 20,
                       "mtp": {"tensors": 4, "layers": [4], "nextn_predict_layers": 1}}],
        "mtp": {"mode": "separate", "deploy": ["llama-server -m m-Q4_0.gguf -md m-mtp-F16_MTP.gguf --spec-type draft-mtp"]},
        "draft": {"mtp": True, "eval_text": "botchan.txt", "n_max": [2], "pairs": [
            {"main": "m-Q4_0.gguf", "draft": "m-mtp-F16_MTP.gguf", "compatible": True, "warnings": [], "deploy": line,
             "acceptance": {"acceptance_rate": 0.25, "accepted": 8, "drafted": 32, "best_n_max": 2, "command": run}}]}}
    table = draft_table(manifest)
    assert f"`{line}`" in table and run in table and "--spec-type draft-mtp" in table
    text = mtp_text(manifest)
    assert line in text and "--spec-type draft-mtp\n" not in text  # the measured line, not the unmeasured one


def test_ci_summary_names_the_mtp_draft():
    from pipeline.distribution.ci_summary import _draft_rows

    rows = _draft_rows({"mtp": True, "min_acceptance": None, "pairs": [
        {"main": "m-Q4_0.gguf", "draft": "m-Q4_0.gguf", "compatible": True,
         "acceptance": {"acceptance_rate": 0.5, "best_n_max": 2, "by_n_max": {"2": {"est_speedup": 1.2}}}}]})
    assert rows[0] == "Draft: the model's own multi-token-prediction heads (`--spec-type draft-mtp`)"
    assert "| `m-Q4_0.gguf` | `m-Q4_0.gguf` | ✅ compatible | 0.500 | 2 | 1.20 |" in rows
