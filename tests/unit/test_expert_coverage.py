"""Expert coverage of an importance matrix (pipeline/stages/imatrix_coverage.py, issue #31 item 2) on generated
imatrix GGUFs laid out as llama-imatrix writes them (``<weight>.in_sum2`` [ne0, n_expert], ``<weight>.counts``
[1, n_expert], F32: tools/imatrix/imatrix.cpp:614-629), and the recipe keys' one-line refusals. A real llama-imatrix
run on a generated MoE checkpoint is the e2e part of #31, still to come."""

from __future__ import annotations

import numpy as np
import pytest
import yaml
from helpers import BOTCHAN, recipe_error

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe
from pipeline.stages.imatrix_coverage import coverage, coverage_failures, expert_counts

SHA = "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"


def write_imatrix(path, layers: dict[int, list[int]], dense: int = 1, ne0: int = 16):
    """An imatrix GGUF: per MoE layer the gate, up and down experts with ``counts``; ``dense`` plain attention
    weights with one count each (a dense tensor is one matrix)."""
    import gguf

    w = gguf.GGUFWriter(str(path), arch="imatrix")
    w.add_string("imatrix.datasets", "calib.txt")
    for il in range(dense):
        w.add_tensor(f"blk.{il}.attn_q.weight.in_sum2", np.ones((1, ne0), dtype=np.float32))
        w.add_tensor(f"blk.{il}.attn_q.weight.counts", np.full((1, 1), 512, dtype=np.float32))
    for il, counts in layers.items():
        for role in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"):
            w.add_tensor(f"blk.{il}.{role}.weight.in_sum2", np.ones((len(counts), ne0), dtype=np.float32))
            w.add_tensor(f"blk.{il}.{role}.weight.counts", np.array(counts, dtype=np.float32).reshape(len(counts), 1))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_counts_per_layer_and_the_cold_experts(tmp_path):
    f = write_imatrix(tmp_path / "moe.gguf", {0: [40, 0, 12, 3, 0, 9, 1, 7], 1: [5] * 8})
    counts = expert_counts(f)
    assert counts == {0: [40, 0, 12, 3, 0, 9, 1, 7], 1: [5] * 8}
    table = coverage(counts, min_tokens=1)
    assert table[0] == {"layer": 0, "experts": 8, "covered": 6, "fraction": 0.75, "cold": [1, 4], "min_tokens": 0,
                        "max_tokens": 40}
    assert coverage(counts, min_tokens=4)[0]["cold"] == [1, 3, 4, 6]  # fewer than 4 routed tokens
    assert expert_counts(write_imatrix(tmp_path / "dense.gguf", {})) == {}  # a dense model: nothing to cover


def test_the_gate_names_the_layer_and_its_experts(tmp_path):
    table = coverage({0: [40, 0, 12, 3, 0, 9, 1, 7], 1: [5] * 8, 2: [0] * 6 + [2, 2]})
    assert coverage_failures(table, None, 1, "r.yaml: imatrix (F16, calib.txt)") == []  # not gated
    assert coverage_failures(table, 0.75, 1, "r.yaml: imatrix (F16, calib.txt)") == [
        "r.yaml: imatrix (F16, calib.txt): layer 2 covers 2/8 experts (0.250 < imatrix.min_expert_coverage 0.75); "
        "cold experts (fewer than 1 routed tokens): 0, 1, 2, 3, 4, 5"]
    assert [f.split(":")[2] for f in coverage_failures(table, 1.0, 1, "r.yaml: imatrix")] == [
        " layer 0 covers 6/8 experts (0.750 < imatrix.min_expert_coverage 1); cold experts (fewer than 1 routed tokens)",
        " layer 2 covers 2/8 experts (0.250 < imatrix.min_expert_coverage 1); cold experts (fewer than 1 routed tokens)"]


def test_counts_of_another_layout_are_refused(tmp_path):
    import gguf

    w = gguf.GGUFWriter(str(tmp_path / "odd.gguf"), arch="imatrix")
    w.add_tensor("blk.0.ffn_up_exps.weight.counts", np.ones((4, 2), dtype=np.float32))  # not [1, n_expert]
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(PipelineError, match=r"blk.0.ffn_up_exps.weight.counts: not llama-imatrix's \[1, n_expert\]"):
        expert_counts(tmp_path / "odd.gguf")


def _recipe(tmp_path, **imatrix):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "source": {"repo": "org/m", "revision": SHA}, "quants": ["Q4_K_M"],
                                    "imatrix": {"calibration": str(BOTCHAN), **imatrix}}))
    return path


def test_recipe_keys(tmp_path):
    cfg = load_recipe(_recipe(tmp_path)).imatrix
    assert (cfg.min_expert_coverage, cfg.min_expert_tokens) == (None, 1)
    assert "min_expert_coverage" not in cfg.describe()  # older recipes keep their rerun trigger
    cfg = load_recipe(_recipe(tmp_path, min_expert_coverage=1, min_expert_tokens=4)).imatrix
    assert cfg.describe()["min_expert_coverage"] == 1.0 and cfg.min_expert_tokens == 4


@pytest.mark.parametrize("keys,field,what", [
    ({"min_expert_coverage": 1.5}, "imatrix.min_expert_coverage", "must be a number 0..1, got 1.5"),
    ({"min_expert_coverage": -0.1}, "imatrix.min_expert_coverage", "got -0.1"),
    ({"min_expert_tokens": 0}, "imatrix.min_expert_tokens", "must be an integer 1..2147483647, got 0"),
    ({"min_expert_tokens": True}, "imatrix.min_expert_tokens", "got True"),
])
def test_bad_coverage_keys_one_line(tmp_path, keys, field, what):
    exc = recipe_error(_recipe(tmp_path, **keys))
    assert exc.field == field and what in exc.message, exc
