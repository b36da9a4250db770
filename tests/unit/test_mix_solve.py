"""Measured mixes without llama.cpp (issue #19 part 2, docs/mixes.md): the recipe's refusals, the grouping, the
solver against brute force on generated sensitivities, and its deterministic tie-breaking."""

from __future__ import annotations

import itertools
import random

import pytest
from helpers import recipe_error

from pipeline.errors import PipelineError
from pipeline.recipe import load_recipe
from pipeline.recipe.mix import Flavour
from pipeline.recipe.tensor_map import read_map
from pipeline.stages.mix.groups import bands, group_tensors
from pipeline.stages.mix.plan import map_text
from pipeline.stages.mix.solve import choose

GATE = "gate.txt"
SENS = "sens.txt"


def _recipe(tmp_path, quants: str, extra: str = "sensitivity: {text: sens.txt}\n"):
    (tmp_path / GATE).write_text("the gates' text. " * 500)
    (tmp_path / SENS).write_text("the sensitivity text. " * 200)
    p = tmp_path / "r.yaml"
    p.write_text(f"""name: r
source: {{repo: a/b, revision: "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"}}
quants: {quants}
gates: [{{name: g, text: {GATE}, ctx: 512, chunks: 16}}]
{extra}""")
    return p


def _refused(tmp_path, quants: str, extra: str = "sensitivity: {text: sens.txt}\n"):
    return recipe_error(_recipe(tmp_path, quants, extra))


def test_flavour_names_round_trip():
    """A flavour's name (wildcards, file names, records) is its base and whether the importance matrix is used."""
    assert [str(f) for f in Flavour.every()] == ["plain", "plain-imatrix", "awq", "awq-imatrix"]
    assert all(Flavour.parse(str(f)) == f for f in Flavour.every())
    assert Flavour.parse("awq-imatrix") == Flavour("awq", True) and sorted(map(str, Flavour.every())) == [
        str(f) for f in sorted(Flavour.every())]
    for bad in ("", "imatrix", "-imatrix", "awq-imatrix-imatrix", "Plain"):
        with pytest.raises(PipelineError, match="is not a mix flavour"):
            Flavour.parse(bad)


def test_mix_recipe_loads_with_defaults(tmp_path):
    r = load_recipe(_recipe(tmp_path, "[Q4_K_M, {type: mix, label: q4_k_m_mix, budget: {size_of: Q4_K_M}}, "
                                      "{type: mix, label: Q4_K_S_KLD, target: {max_kld_mean: 0.03}}]"))
    mix = r.quant("Q4_K_M_MIX")
    assert (mix.type, mix.variant, mix.mix.candidates) == ("Q4_K_M", "MIX", ("Q3_K", "Q4_K", "Q5_K", "Q6_K"))
    assert mix.mix.budget == ("size_of", "Q4_K_M") and r.mix_flavours == ["plain"]
    assert r.sensitivity.floor == "Q8_0" and (r.sensitivity.ctx, r.sensitivity.chunks, r.sensitivity.bands) == (512, 4, 8)
    assert r.sensitivity.search == "exhaustive"
    # a target is also the mix's gate
    assert r.thresholds("Q4_K_S_KLD", "g")["max_kld_mean"] == 0.03


@pytest.mark.parametrize("quant,field,words", [
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 1}}", "quants[0].budget.bpw", "must be a number > 1 and <= 16, got 1"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 16.5}}", "quants[0].budget.bpw",
     "must be a number > 1 and <= 16, got 16.5"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 4}, candidates: [IQ4_XS, Q5_K]}", "quants[0].candidates[0]",
     "only with an importance matrix"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {size_of: Q2_K}}", "quants[0].budget.size_of", "outside what these"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {size_of: Q4_K_M}, candidates: [Q5_K, Q8_0]}", "quants[0].candidates[1]",
     "not below the floor"),
    ("{type: mix, label: Q4_K_M, budget: {bpw: 4}}", "quants[0].label", "not `<TYPE>_<VARIANT>`"),
    ("{type: mix, label: Q4_K_M_X1, budget: {bpw: 4}}", "quants[0].label", "not `<TYPE>_<VARIANT>`"),
    ("{type: mix, label: Q4_K_M_MIX}", "quants[0]", "exactly one of `budget`"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 4}, target: {max_kld_mean: 0.1}}", "quants[0]", "exactly one"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 4}, variant: x}", "quants[0].variant", "not with `type: mix`"),
    ("{type: mix, label: Q4_K_M_MIX, budget: {bpw: 4}, token_embedding_type: q8_0}", "quants[0].token_embedding_type",
     "not with `type: mix`"),
    ("{type: Q4_K_M, budget: {bpw: 4}}", "quants[0].budget", "only for a mix"),
])
def test_mix_refusals(tmp_path, quant, field, words):
    exc = _refused(tmp_path, f"[{quant}]")
    assert exc.field == field and words in exc.message, exc


def test_sensitivity_refusals(tmp_path):
    mix = "[{type: mix, label: Q4_K_M_MIX, budget: {bpw: 4}}]"
    exc = _refused(tmp_path, mix, extra="")
    assert exc.field == "quants[0].type" and exc.message.startswith("a mix needs a top-level `sensitivity:`"), exc
    exc = _refused(tmp_path, "[Q4_K_M]")
    assert exc.field == "sensitivity" and exc.message.startswith("no quant is a mix"), exc
    exc = _refused(tmp_path, mix, extra="sensitivity: {text: sens.txt, search: greedy}\n")
    assert exc.field == "sensitivity.search" and exc.message == "'greedy' is not one of exhaustive, screened, fisher", exc
    exc = _refused(tmp_path, mix, extra=f"sensitivity: {{text: {GATE}}}\n")
    assert exc.field == "sensitivity.text" and exc.message.startswith("gate.txt is the eval text of gates 'g'"), exc


def test_bands_and_groups():
    assert bands(30, 8) == [(0, 2), (3, 6), (7, 10), (11, 14), (15, 17), (18, 21), (22, 25), (26, 29)]
    assert bands(2, 8) == [(0, 0), (1, 1)]
    roles = ("attn_q", "ffn_down_exps", "ffn_up_exps", "ffn_down_shexp")
    names = ["token_embd.weight", *(f"blk.{i}.{r}.weight" for i in range(4) for r in roles), "output.weight"]
    groups = {g.name: g.tensors for g in group_tensors(names, 2)}
    assert groups["attn_q.0-1"] == ("blk.0.attn_q.weight", "blk.1.attn_q.weight")
    # experts per role and band (issue #31), the shared expert apart from them
    assert groups["ffn_down_exps.2-3"] == ("blk.2.ffn_down_exps.weight", "blk.3.ffn_down_exps.weight")
    assert groups["ffn_up_exps.0-1"] == ("blk.0.ffn_up_exps.weight", "blk.1.ffn_up_exps.weight")
    assert groups["ffn_down_shexp.0-1"] == ("blk.0.ffn_down_shexp.weight", "blk.1.ffn_down_shexp.weight")
    assert len(groups) == 2 * len(roles) + 2
    assert list(groups) == sorted(groups) and groups["token_embd"] == ("token_embd.weight",)
    assert sum(len(t) for t in groups.values()) == len(names)


def test_map_text_names_each_tensor_exactly(tmp_path):
    text = map_text({"blk.10.attn_q.weight": "Q4_K", "output.weight": "Q8_0"})
    assert text == "^blk\\.10\\.attn_q\\.weight$=q4_k\n^output\\.weight$=q8_0\n"
    (tmp_path / "m.txt").write_text(text)
    assert read_map(tmp_path / "m.txt") == (("^blk\\.10\\.attn_q\\.weight$", "Q4_K", 1),
                                            ("^output\\.weight$", "Q8_0", 2))
    with pytest.raises(PipelineError, match="cannot name exactly"):
        map_text({"blk.0.Attn[q]": "Q4_K"})


def _groups(n: int, seed: int) -> list[dict]:
    rnd = random.Random(seed)
    out = []
    for i in range(n):
        size = rnd.randint(1, 40) * 1000
        out.append({"group": f"g{i:02d}",
                    "bytes": {"Q8_0": size * 2, "Q4_K": size, "Q6_K": size * 3 // 2},
                    "kld": {"Q4_K": {"kld_mean": 0.01 + rnd.random() * 0.05},
                            "Q6_K": {"kld_mean": 0.01 + rnd.random() * 0.01}}})
    return out


def _brute(groups, floor_kld, fixed, budget=None, target=None):
    best = None
    for pick in itertools.product(("Q8_0", "Q4_K", "Q6_K"), repeat=len(groups)):
        b = fixed + sum(g["bytes"][c] for g, c in zip(groups, pick, strict=True))
        k = floor_kld + sum(0 if c == "Q8_0" else g["kld"][c]["kld_mean"] - floor_kld
                            for g, c in zip(groups, pick, strict=True))
        if (budget is not None and b <= budget) or (target is not None and k <= target + 1e-12):
            key = (k, b) if budget is not None else (b, k)
            best = min(best, key) if best else key
    return best


@pytest.mark.parametrize("seed", range(6))
def test_solver_matches_brute_force(seed):
    groups, floor_kld, fixed = _groups(6, seed), 0.01, 5000
    low = fixed + sum(g["bytes"]["Q4_K"] for g in groups)
    high = fixed + sum(g["bytes"]["Q8_0"] for g in groups)
    for budget in (low, (low + high) // 2, high):
        choice, b, k = choose(groups, ("Q4_K", "Q6_K"), "Q8_0", floor_kld, fixed, budget=budget)
        assert b <= budget and b == fixed + sum(g["bytes"][choice[g["group"]]] for g in groups)
        assert k == pytest.approx(_brute(groups, floor_kld, fixed, budget=budget)[0], abs=1e-9)
    target = floor_kld + 0.03
    choice, b, k = choose(groups, ("Q4_K", "Q6_K"), "Q8_0", floor_kld, fixed, target=target)
    assert k <= target + 1e-12 and b == _brute(groups, floor_kld, fixed, target=target)[0]


def test_solver_is_deterministic_and_breaks_ties_by_bytes_then_name():
    same = [{"group": f"g{i}", "bytes": {"Q8_0": 200, "Q4_K": 100, "Q5_K": 100},
             "kld": {"Q4_K": {"kld_mean": 0.02}, "Q5_K": {"kld_mean": 0.02}}} for i in range(3)]
    first = choose(same, ("Q5_K", "Q4_K"), "Q8_0", 0.01, 0, budget=300)
    assert first == choose(list(reversed(same)), ("Q4_K", "Q5_K"), "Q8_0", 0.01, 0, budget=300)
    assert set(first[0].values()) == {"Q4_K"}  # equal bytes and effect: the first name


def test_solver_refusals():
    groups = _groups(3, 0)
    low = sum(g["bytes"]["Q4_K"] for g in groups)
    with pytest.raises(PipelineError, match=r"below the smallest mix"):
        choose(groups, ("Q4_K", "Q6_K"), "Q8_0", 0.01, 0, budget=low - 1)
    with pytest.raises(PipelineError, match=r"no mix of these candidates meets mean KLD 0.005"):
        choose(groups, ("Q4_K", "Q6_K"), "Q8_0", 0.01, 0, target=0.005)
