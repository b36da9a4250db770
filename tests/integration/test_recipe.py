"""Recipe schema against the real llama-quantize: its type list, the demo recipe, `ggufpipe validate`.
(Every other bad input: tests/unit/test_recipe.py.)"""

from __future__ import annotations

import pytest
from helpers import GOOD_RECIPE, write_recipe_text

from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe


def test_good_recipe_loads(tmp_path, quantize_exe):
    """The valid recipe of tests/unit/test_recipe.py loads as well against llama-quantize's own type list."""
    path = write_recipe_text(tmp_path, GOOD_RECIPE)
    r = load_recipe(path, quantize_exe)
    assert r == load_recipe(path) and [q.key for q in r.quants] == ["Q8_0", "Q4_K_M_EMBQ", "Q4_K_M"]


def test_demo_recipe_is_valid(quantize_exe):
    from helpers import DEMO_RECIPE

    r = load_recipe(DEMO_RECIPE, quantize_exe)
    assert [q.type for q in r.quants] == ["Q8_0", "Q5_K_M", "Q4_K_M"]
    assert r.source.revision and len(r.source.revision) == 40


def test_unknown_quant_type_names_what_llama_quantize_accepts(tmp_path, quantize_exe):
    path = write_recipe_text(tmp_path, GOOD_RECIPE.replace("- Q8_0", "- Q4_Z"))
    with pytest.raises(RecipeError) as exc:
        load_recipe(path, quantize_exe)
    msg = exc.value.message
    assert exc.value.field == "quants[0]" and msg.startswith("unknown quant type 'Q4_Z' (llama-quantize b"), exc.value
    assert "Q4_K_M" in msg and "Q8_0" in msg, msg


def test_cli_validate_exit_code(tmp_path, capsys):
    from pipeline.cli import main

    good = write_recipe_text(tmp_path, GOOD_RECIPE, "good.yaml")
    assert main(["validate", str(good)]) == 0
    assert "ok" in capsys.readouterr().out
    bad = write_recipe_text(tmp_path, GOOD_RECIPE.replace("- Q8_0", "- Q4_Z"), "bad.yaml")
    assert main(["validate", str(bad)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "bad.yaml: quants[0]" in err and "\n" not in err
