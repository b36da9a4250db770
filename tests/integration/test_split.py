"""Recipe ``split:`` against the real tools: the workflow's wiring of split keys (base, quants, MTP draft), and a
tensor larger than ``max_size`` refused by llama-gguf-split in one line."""

from __future__ import annotations

import re

import pytest
from helpers import SPLIT_NAME, write_split_recipe

from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe


def test_tensor_larger_than_max_size_is_refused(tmp_path, quantize_exe, toolchain):
    """A shard holds whole tensors: a tensor over max_size fails the stage in one line naming the recipe
    field, and leaves no folder."""
    from helpers.gguf_factory import tiny_llama

    from pipeline.stages.split import split

    gguf = tiny_llama(tmp_path / f"{SPLIT_NAME}-Q8_0.gguf", tokenizer_from=toolchain.root / "vocab" / "ggml-vocab-llama-spm.gguf")
    r = load_recipe(write_split_recipe(tmp_path, tmp_path, "quants: [{type: Q8_0, split: {max_size: 1M}}]\n"), quantize_exe)
    out = tmp_path / "split" / f"{SPLIT_NAME}-Q8_0"
    with pytest.raises(RecipeError) as exc:
        split(r, "Q8_0", gguf, out)
    assert (exc.value.path, exc.value.field) == (r.path, "quants[0].split.max_size"), exc.value
    assert re.search(r"^1M \(1000000 bytes\) is smaller than tensor token_embd\.weight "
                     rf"of {SPLIT_NAME}-Q8_0\.gguf \(8192000 bytes\).*raise max_size", exc.value.message), exc.value
    assert not out.exists() and not (out.parent.exists() and any(out.parent.iterdir()))


def test_split_wiring_covers_base_quants_and_mtp_draft(tmp_path):
    """Which files the split rule makes, what publish waits for and what DVC tracks; the MTP draft stays whole at
    the repo root (llama.cpp fetches the sidecar only from the model's folder or above)."""
    from pipeline.distribution.dvc import matrix
    from pipeline.workflow import Workflow

    rfile = write_split_recipe(tmp_path / "recipes", tmp_path, """\
        mtp: separate
        split: {max_size: 2G}
        quants: [Q8_0, {type: Q4_0, split: false}]
        """)
    W = Workflow({"recipes": str(rfile)})
    r = W.recipe(SPLIT_NAME)
    assert W.layout.publish_inputs(r)["split"] == [str(W.layout.split_dir(SPLIT_NAME, k)) for k in ("F16", "Q8_0")]
    assert set(W.split_key_regex().split("|")) == {"F16", "Q8_0"}
    assert W.trigger("split", SPLIT_NAME, skey="Q8_0") != W.trigger("split", SPLIT_NAME, skey="Q4_0")  # a changed split re-runs
    assert {k: v["file"] for k, v in matrix([r], tmp_path)["ggufs"].items()} == {
        f"{SPLIT_NAME}-F16": f"{SPLIT_NAME}-F16", f"{SPLIT_NAME}-Q8_0": f"{SPLIT_NAME}-Q8_0", f"{SPLIT_NAME}-Q4_0": f"{SPLIT_NAME}-Q4_0.gguf",
        f"{SPLIT_NAME}-mtp-F16_MTP": f"{SPLIT_NAME}-mtp-F16_MTP.gguf"}
