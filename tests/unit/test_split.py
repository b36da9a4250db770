"""Recipe ``split:`` fields: parsed sizes, per-quant overrides, and every bad value in one line naming the field."""

from __future__ import annotations

import pytest
from helpers import SPLIT_NAME, recipe_error, write_split_recipe

from pipeline.recipe import load_recipe


def test_split_recipe_fields(tmp_path):
    r = load_recipe(write_split_recipe(tmp_path, tmp_path, """\
        split: {max_size: 2G}
        quants:
          - Q8_0
          - {type: Q4_0, split: {max_size: 500M}}
          - {type: Q4_K_M, split: false}
        """))
    assert r.split.max_size == "2G" and r.split.max_bytes == 2 * 10**9
    assert [(k, r.split_for(k) and r.split_for(k).max_size) for k in r.model_keys] == [
        ("F16", "2G"), ("Q8_0", "2G"), ("Q4_0", "500M"), ("Q4_K_M", None)]
    assert r.split_for("Q4_0").args() == ["--split", "--split-max-size", "500M"]
    assert [r.artifact_for(k) for k in r.model_keys] == [f"{SPLIT_NAME}-F16", f"{SPLIT_NAME}-Q8_0", f"{SPLIT_NAME}-Q4_0",
                                                         f"{SPLIT_NAME}-Q4_K_M.gguf"]
    r = load_recipe(write_split_recipe(tmp_path, tmp_path, "quants: [{type: Q8_0, split: {max_size: 3M}}]\n"))
    assert r.split is None and r.artifact_for("F16") == f"{SPLIT_NAME}-F16.gguf" and r.artifact_for("Q8_0") == f"{SPLIT_NAME}-Q8_0"


BAD = [
    ("split: {max_size: 2.5G}\nquants: [Q8_0]", "split.max_size", "'2.5G' is not a size llama-gguf-split takes"),
    ("split: {max_size: 0M}\nquants: [Q8_0]", "split.max_size", "'0M' is not a size"),
    ("split: {max_size: 500K}\nquants: [Q8_0]", "split.max_size", "'500K' is not a size"),
    ("split: {max_size: 2000}\nquants: [Q8_0]", "split.max_size", "2000 is not a size"),
    ("split: {max_size: -1G}\nquants: [Q8_0]", "split.max_size", "'-1G' is not a size"),
    ("split: {}\nquants: [Q8_0]", "split.max_size", "missing"),
    ("split: {max_size: 1G, max_tensors: 3}\nquants: [Q8_0]", "split.max_tensors", "unknown key"),
    ("split: true\nquants: [Q8_0]", "split", "must be a mapping {max_size: N(M|G)}, got True"),
    ("split: false\nquants: [Q8_0]", "split", "must be a mapping"),  # false only opts one quant out
    ("quants: [{type: Q8_0, split: 2G}]", "quants[0].split", "must be a mapping {max_size: N(M|G)} or false"),
    ("quants: [{type: Q8_0, split: {max_size: 1T}}]", "quants[0].split.max_size", "'1T' is not a size"),
    ("quants: [Q8_0]\ndraft: {source: {path: /x}, quants: [{type: Q4_0, split: {max_size: 1G}}]}",
     "draft.quants[0].split", "not supported: draft models are published whole"),
]


@pytest.mark.parametrize("body,field,what", BAD, ids=[b[1] + str(i) for i, b in enumerate(BAD)])
def test_bad_split_is_one_line(tmp_path, body, field, what):
    exc = recipe_error(write_split_recipe(tmp_path, tmp_path, body + "\n"))
    assert exc.field == field and what in exc.message, exc
