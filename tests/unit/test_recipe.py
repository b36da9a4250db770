"""Recipe schema without llama-quantize: valid recipes load; every bad input gives one line naming file and field.
(tests/integration/test_recipe.py checks the quant types against the real llama-quantize.)"""

from __future__ import annotations

import pytest
from helpers import GOOD_RECIPE, RECIPE_SHA, recipe_error, write_recipe_text

from pipeline.recipe import load_recipe


def test_good_recipe_loads(tmp_path):
    r = load_recipe(write_recipe_text(tmp_path, GOOD_RECIPE))
    assert r.name == "demo-a"
    assert r.source.repo == "org/model" and r.source.revision == RECIPE_SHA
    assert [q.key for q in r.quants] == ["Q8_0", "Q4_K_M_EMBQ", "Q4_K_M"]  # alias Q4_K resolved
    assert r.file_for("Q4_K_M_EMBQ") == "demo-a-Q4_K_M_EMBQ.gguf"
    assert r.base_file == "demo-a-F16.gguf" and r.base_key == "F16" and r.model_keys[0] == r.base_key
    assert r.eval_sets == () and r.first_eval_set is None
    assert r.quants[1].quantize_args() == [
        "--output-tensor-type", "q8_0", "--token-embedding-type", "q8_0", "--tensor-type", "attn_v=q8_0"]
    assert len(r.sha256) == 64


BAD = [
    ("unknown top key", GOOD_RECIPE + "colour: red\n", "colour", "unknown key"),
    ("uppercase name", GOOD_RECIPE.replace("name: demo-a", "name: Demo"), "name", "'Demo' is not a valid name"),
    ("name with space", GOOD_RECIPE.replace("name: demo-a", "name: 'demo a'"), "name", "'demo a' is not a valid name"),
    ("path traversal name", GOOD_RECIPE.replace("name: demo-a", "name: ../etc"), "name", "'../etc' is not a valid name"),
    ("dots name", GOOD_RECIPE.replace("name: demo-a", "name: a..b"), "name", "'a..b' must not contain '..'"),
    ("missing revision", GOOD_RECIPE.replace(f'  revision: "{RECIPE_SHA}"\n', ""), "source.revision", "missing"),
    ("numeric revision", GOOD_RECIPE.replace(f'"{RECIPE_SHA}"', "1234567"), "source.revision", "must be a string"),
    ("repo and path", GOOD_RECIPE.replace("  repo: org/model", "  repo: org/model\n  path: /x"), "source", "give exactly one"),
    ("bad repo id", GOOD_RECIPE.replace("org/model", "not a repo"), "source.repo", "'not a repo' is not"),
    ("bad outtype", GOOD_RECIPE.replace("outtype: f16", "outtype: q8"), "outtype", "'q8' is not one of"),
    ("bad mtp mode", GOOD_RECIPE + "mtp: both\n", "mtp", "'both' is not one of keep, strip, separate"),
    ("empty quants", GOOD_RECIPE.split("quants:")[0] + "quants: []\n", "quants", "must be a non-empty list"),
    ("duplicate quant", GOOD_RECIPE + "  - Q8_0\n", "quants[3]", "Q8_0 repeats quants[0]"),
    ("F16 as quant", GOOD_RECIPE.replace("- Q8_0", "- F16"), "quants[0]", "F16 is not a quantization"),
    ("bad variant", GOOD_RECIPE.replace("variant: embq", "variant: Emb-Q8"), "quants[1].variant", "'Emb-Q8' is not"),
    ("unknown quant key", GOOD_RECIPE.replace("variant: embq", "variant: embq\n    colour: red"),
     "quants[1].colour", "unknown key"),
    ("bool as string", GOOD_RECIPE.replace("variant: embq", "variant: embq\n    pure: 'yes'"), "quants[1].pure", "must be true"),
    ("needs imatrix", GOOD_RECIPE.replace("- Q8_0", "- IQ2_XXS"), "quants[0].type", "IQ2_XXS needs an importance matrix"),
    ("malformed yaml", "name: [unclosed\n", "line 2", "malformed YAML"),
    ("not a mapping", "- just\n- a list\n", "", "must be a mapping"),
    ("empty file", "", "recipe", "file is empty"),
    ("missing source", "name: x\nquants: [Q8_0]\n", "source", "missing"),
    ("pickle flag type", GOOD_RECIPE.replace("  repo: org/model", "  repo: org/model\n  allow_pickle: 1"),
     "source.allow_pickle", "must be true or false"),
    ("unknown conformance cause", GOOD_RECIPE + "conformance: {accept: [nfx]}\n",
     "conformance.accept", "unknown cause 'nfx' (known: bert, byte-level, ignore-merges, lowercase, nfd, nfkc,"),
    ("nfc is no defect", GOOD_RECIPE + "conformance: {accept: [nfc]}\n",
     "conformance.accept", "nfc is a known llama.cpp limitation"),
    ("accept not a list", GOOD_RECIPE + "conformance: {accept: nfkc}\n", "conformance.accept", "must be a list"),
    ("strict with conformance off", GOOD_RECIPE + "conformance: {enabled: false, strict: true}\n",
     "conformance.strict", "has no effect with conformance off"),
    ("accept with conformance off", GOOD_RECIPE + "conformance: {enabled: false, accept: [nfkc]}\n",
     "conformance.accept", "has no effect with conformance off"),
    ("strict not a bool", GOOD_RECIPE + "conformance: {strict: 1}\n", "conformance.strict", "must be true or false"),
]


@pytest.mark.parametrize("label,text,field,what", BAD, ids=[b[0] for b in BAD])
def test_bad_recipe_one_clear_line(tmp_path, label, text, field, what):
    exc = recipe_error(write_recipe_text(tmp_path, text))
    assert exc.field == field and what in exc.message, exc


def test_recipe_error_line_is_unchanged(tmp_path):
    """The one line `ggufpipe` prints (``error: <line>``) is the one it printed before RecipeError had fields."""
    path = write_recipe_text(tmp_path, GOOD_RECIPE.replace("- Q8_0", "- IQ2_XXS"))
    assert str(recipe_error(path)) == (f"{path}: quants[0].type: IQ2_XXS needs an importance matrix, and this recipe "
                                       "has no `imatrix:` section")


def test_conformance_accept_and_strict(tmp_path):
    r = load_recipe(write_recipe_text(tmp_path, GOOD_RECIPE + "conformance: {accept: [nfkc, nfd, nfkc], strict: true}\n"))
    assert r.conformance.accept == ("nfd", "nfkc") and r.conformance.strict and r.conformance.enabled
    assert r.conformance.describe() == {"enabled": True, "chunks": 4, "accept": ["nfd", "nfkc"], "strict": True}
    plain = load_recipe(write_recipe_text(tmp_path, GOOD_RECIPE))
    assert plain.conformance.describe() == {"enabled": True, "chunks": 4}  # the trigger of older recipes
    off = load_recipe(write_recipe_text(tmp_path, GOOD_RECIPE + "conformance: {enabled: false}\n"))
    assert not off.conformance.enabled
