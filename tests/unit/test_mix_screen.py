"""The screened search of the sensitivity stage (pipeline/stages/mix/screen.py, issue #32) on generated inputs: the
screened error on GGUFs written with gguf-py, the segments and their adaptive split, and the search itself with a
measurement that follows a known additive truth (so what it predicts can be checked exactly). The real search on the
rotated demo is measured in bench/RESULTS.md; tests/e2e/test_mix.py builds a mix with it."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.stages.mix.groups import group_tensors
from pipeline.stages.mix.screen import (
    UNSEEN,
    Segment,
    column_importance,
    disagreement,
    exhaustive_runs,
    first_segments,
    probe_for,
    screened_search,
    split,
    weight_errors,
)


def _gguf(path, tensors: dict, qtype=None):
    import gguf
    from gguf.quants import quantize

    w = gguf.GGUFWriter(str(path), "llama")
    for name, a in tensors.items():
        if qtype is None or name.endswith((".in_sum2", ".counts")):
            w.add_tensor(name, a)
        else:
            t = getattr(gguf.GGMLQuantizationType, qtype)
            w.add_tensor(name, quantize(a, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_screened_error_orders_types_and_weighs_columns_by_their_inputs(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    base = _gguf(tmp_path / "base.gguf", {"blk.0.attn_q.weight": w.astype(np.float16), "token_embd.weight": w})
    errs = {q: weight_errors(base, _gguf(tmp_path / f"{q}.gguf", {"blk.0.attn_q.weight": w, "token_embd.weight": w}, q),
                             ["blk.0.attn_q.weight", "token_embd.weight"], {})
            for q in ("Q4_0", "Q5_0", "Q8_0")}
    for n in ("blk.0.attn_q.weight", "token_embd.weight"):
        assert errs["Q4_0"][n] > errs["Q5_0"][n] > errs["Q8_0"][n] > 0
    # relative to the tensor's own output, columns weighted by their mean squared input: a column no input reaches
    # adds nothing
    a = np.zeros(64)
    a[:32] = 1.0
    half = weight_errors(base, tmp_path / "Q4_0.gguf", ["blk.0.attn_q.weight"], {"blk.0.attn_q.weight": a})
    w = np.asarray(_dequant(base, "blk.0.attn_q.weight"), dtype=np.float32)
    d = np.asarray(_dequant(tmp_path / "Q4_0.gguf", "blk.0.attn_q.weight")) - w
    want = float((d[:, :32] ** 2).sum() / (w[:, :32] ** 2).sum())
    assert half["blk.0.attn_q.weight"] == pytest.approx(want, rel=1e-5)
    # no importance: columns alike; a tensor scaled 10x (activations growing with depth) has the same relative error
    e = _dequant(tmp_path / "Q4_0.gguf", "token_embd.weight") - _dequant(base, "token_embd.weight")
    assert errs["Q4_0"]["token_embd.weight"] == pytest.approx(float((e ** 2).sum() / (w ** 2).sum()), rel=1e-4)
    _gguf(tmp_path / "base10.gguf", {"blk.0.attn_q.weight": (10 * w).astype(np.float16)})
    q10 = _gguf(tmp_path / "q10.gguf", {"blk.0.attn_q.weight": 10 * w}, "Q4_0")
    assert weight_errors(tmp_path / "base10.gguf", q10, ["blk.0.attn_q.weight"], {})["blk.0.attn_q.weight"] == \
        pytest.approx(errs["Q4_0"]["blk.0.attn_q.weight"], rel=0.05)


def _dequant(path, name):
    from gguf import GGUFReader
    from gguf.quants import dequantize

    t = next(t for t in GGUFReader(str(path)).tensors if t.name == name)
    return dequantize(t.data, t.tensor_type)


def test_column_importance_is_in_sum2_over_counts(tmp_path):
    s = np.arange(1, 5, dtype=np.float32).reshape(1, 4)
    path = _gguf(tmp_path / "im.gguf", {"blk.0.attn_q.weight.in_sum2": s,
                                        "blk.0.attn_q.weight.counts": np.array([[2.0]], dtype=np.float32)})
    got = column_importance(path)
    assert list(got) == ["blk.0.attn_q.weight"] and got["blk.0.attn_q.weight"].tolist() == [0.5, 1.0, 1.5, 2.0]


NAMES = [f"blk.{i}.{r}.weight" for i in range(8) for r in ("attn_q", "ffn_down")] + ["token_embd.weight"]


def test_segments_split_and_disagree():
    groups = group_tensors(NAMES, 4)
    assert [(s.role, s.groups) for s in first_segments(groups)] == [
        ("attn_q", ("attn_q.0-1", "attn_q.2-3", "attn_q.4-5", "attn_q.6-7")),
        ("ffn_down", ("ffn_down.0-1", "ffn_down.2-3", "ffn_down.4-5", "ffn_down.6-7")), ("token_embd", ("token_embd",))]
    segs = first_segments(groups, 2)
    assert [(s.role, s.groups) for s in segs] == [
        ("attn_q", ("attn_q.0-1", "attn_q.2-3")), ("attn_q", ("attn_q.4-5", "attn_q.6-7")),
        ("ffn_down", ("ffn_down.0-1", "ffn_down.2-3")), ("ffn_down", ("ffn_down.4-5", "ffn_down.6-7")),
        ("token_embd", ("token_embd",))]
    assert split(segs[0])[0].groups == ("attn_q.0-1",) and split(segs[0])[1].groups == ("attn_q.2-3",)
    for s, k in zip(segs, (1.0, 1.2, 1.0, 3.0, 50.0), strict=True):
        s.scale = k
    assert disagreement(segs, 0) == pytest.approx(1.2)
    assert disagreement(segs, 3) == pytest.approx(3.0)  # not compared with token_embd, another role
    assert disagreement(segs, 4) == UNSEEN  # a role of one segment: nothing to compare with


def test_exhaustive_runs_count_each_written_form_once():
    groups = group_tensors(["blk.0.attn_q.weight", "blk.1.attn_q.weight", "token_embd.weight"], 1)
    types = {"Q8_0": dict.fromkeys(NAMES, "q8_0"),
             "Q4_K": {"blk.0.attn_q.weight": "q5_0", "blk.1.attn_q.weight": "q5_0", "token_embd.weight": "q4_k"},
             "Q5_K": {"blk.0.attn_q.weight": "q5_1", "blk.1.attn_q.weight": "q5_1", "token_embd.weight": "q5_k"},
             "Q6_K": {"blk.0.attn_q.weight": "q8_0", "blk.1.attn_q.weight": "q8_0", "token_embd.weight": "q5_k"}}
    types = {c: {n: t.get(n, "q8_0") for n in NAMES} for c, t in types.items()}
    # attn_q: Q4_K, Q5_K (Q6_K written as the floor); token_embd: Q4_K, Q5_K (Q6_K written as Q5_K)
    assert exhaustive_runs(groups, types, "Q8_0", ("Q4_K", "Q5_K", "Q6_K")) == 1 + 2 + 2


def _search(scale_of_layer, cap: int, type_factor: dict | None = None):
    """The screened search on NAMES at 4 bands, measured by an additive truth: each tensor adds
    scale_of_layer(layer or None) x type_factor[type] (1 by default) x its screened error over the floor's."""
    quantized = [n for n in NAMES if n != "token_embd.weight"] + ["token_embd.weight"]
    groups = group_tensors(quantized, 4)
    cands = ("Q3_K", "Q4_K")
    errors = {"Q8_0": dict.fromkeys(quantized, 0.0)}  # errors proportional across types: a probe's ratio is exact
    for c, e in (("Q3_K", 1.0), ("Q4_K", 0.4)):
        errors[c] = {n: e * (1 + i % 3) for i, n in enumerate(quantized)}

    def layer(n):
        return int(n.split(".")[1]) if n.startswith("blk.") else None

    def truth(assign):
        return 0.001 + sum(scale_of_layer(layer(n)) * (type_factor or {}).get(c, 1.0) * (errors[c][n] - errors["Q8_0"][n])
                           for n, c in assign.items() if c != "Q8_0")

    calls = []

    def measure(label, assign):
        calls.append(label)
        return {"kld_mean": truth(assign), "kld_p99": 0.0, "same_top_p": 1.0, "ppl_ratio": 1.0}

    plan = SimpleNamespace(quantized=quantized, groups=groups, group_bytes=lambda g, c: len(g.tensors))
    floor, out, segs, probes = screened_search(measure, plan, "Q8_0", cands, "plain", errors, cap)
    expected = {g["group"]: {c: truth({**dict.fromkeys(quantized, "Q8_0"),
                                       **dict.fromkeys(g["tensors"], c)}) for c in cands} for g in out}
    return calls, out, segs, expected, probes


def test_screened_search_predicts_a_role_of_one_scale_from_two_evaluations_per_role():
    calls, out, segs, expected, probes = _search(lambda i: 0.02 if i is None else 0.005, cap=40)
    # the floor, each role whole and token_embd, each at its other type (a probe), then one cut per role, whose
    # halves agree: no further cut
    assert len(calls) == 1 + 3 + 3 + 2 and [len(s.groups) for s in segs] == [2, 2, 2, 2, 1]
    assert [(p["role"], p["type"], p["ratio"]) for p in probes] == [
        ("attn_q", "Q4_K", pytest.approx(1.0)), ("ffn_down", "Q4_K", pytest.approx(1.0)),
        ("token_embd", "Q4_K", pytest.approx(1.0))]
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    # token_embd, a role of one group: measured at its anchor and at its probe; a group of a larger role, screened
    assert out[-1]["kld"]["Q3_K"]["source"] == out[-1]["kld"]["Q4_K"]["source"] == "measured"
    assert out[0]["kld"]["Q4_K"]["source"] == "screened"


def test_screened_search_splits_where_depth_changes_the_scale_within_its_cap():
    steep = lambda i: 0.02 if i is None else (0.001 if i < 2 else 0.004 if i < 6 else 0.016)  # noqa: E731
    calls, out, segs, expected, _ = _search(steep, cap=40)
    # each role's halves disagree 0.004+ vs 0.016 (and 0.001 vs 0.004): cut until every group is its own segment
    assert [len(s.groups) for s in segs] == [1, 1, 1, 1, 1, 1, 1, 1, 1]
    assert len(calls) == 1 + 3 + 3 + 6  # the probes, then one evaluation per cut: the second half by subtraction
    assert sum(s.derived for s in segs) == 4 and not segs[-1].derived
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    # a tighter cap: the floor and the first three segments, half of what is left for probes (2 of 4, the roles
    # with the most bytes first: attn_q and ffn_down tie at 8 tensors, token_embd has 1), then two cuts
    calls, _, segs, _, probes = _search(steep, cap=8)
    assert len(calls) == 8 and len(segs) == 5 and [p["role"] for p in probes] == ["attn_q", "ffn_down"]


def test_a_type_probe_prices_a_type_whose_kld_per_error_differs():
    """Q4_K adds twice the KLD per unit of screened error that the anchor (Q3_K) does (on the demo: Q5_1 against
    Q5_0 on 576-wide rows): each role's probe at Q4_K measures the ratio, and every group's Q4_K prediction is
    exact; the roles without a probe (the cap spent) keep the anchor's ratio, half the truth."""
    flat = lambda i: 0.02 if i is None else 0.005  # noqa: E731
    calls, out, segs, expected, probes = _search(flat, cap=40, type_factor={"Q4_K": 2.0})
    assert [p["ratio"] for p in probes] == [pytest.approx(2.0)] * 3
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    calls, out, segs, expected, probes = _search(flat, cap=6, type_factor={"Q4_K": 2.0})
    assert [p["role"] for p in probes] == ["attn_q"]
    for g in out:
        added = expected[g["group"]]["Q4_K"] - 0.001
        want = added if g["role"] == "attn_q" else added / 2
        assert g["kld"]["Q4_K"]["kld_mean"] - 0.001 == pytest.approx(want, rel=1e-6), g["group"]


def test_a_probe_prices_its_written_form_only():
    probes = [{"role": "r", "type": "Q5_K", "added_error": 0.25, "ratio": 3.0},
              {"role": "q", "type": "Q4_K", "added_error": 0.5, "ratio": 9.0}]
    assert probe_for(probes, "r", 0.25)["ratio"] == 3.0  # Q5_K, or a candidate written as it
    assert probe_for(probes, "r", 0.5) is None and probe_for(probes, "q", 0.25) is None and not probe_for([], "r", 1)


def test_a_cut_whose_rest_is_implausible_measures_it():
    """Halves that interact (the parent measured more than the sum of its parts would give the first alone, so the
    rest by subtraction is near zero): the rest is measured as well."""
    calls, out, segs, expected, _ = _search(lambda i: 0.02 if i is None else (0.016 if i < 2 else 0.0001), cap=40)
    rest = {s.groups: s for s in segs}
    assert not rest[("attn_q.2-3",)].derived and not rest[("ffn_down.2-3",)].derived
    assert "attn_q.2-3 at Q3_K" in calls and "ffn_down.2-3 at Q3_K" in calls
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)


def test_a_segment_describes_itself():
    s = Segment("attn_q", ("attn_q.0-1",), "Q3_K", 2.5, 0.0123456789, 0.00493827)
    assert s.describe() == {"role": "attn_q", "groups": ["attn_q.0-1"], "anchor": "Q3_K", "added_error": 2.5,
                            "added_kld": 0.01234568, "scale": 0.00493827}


def test_exhaustive_search_measures_each_written_form_once():
    """A candidate written as the floor takes the floor's figures (skipped), one written as an earlier candidate
    takes that one's (a duplicate): on 896-wide rows IQ3_S and IQ4_XS both fall back to one type."""
    from pipeline.stages.mix.sensitivity import _measure_all

    names = ["blk.0.attn_q.weight", "blk.0.ffn_down.weight"]
    groups = group_tensors(names, 1)
    types = {"Q8_0": dict.fromkeys(names, "q8_0"),
             "IQ3_S": {"blk.0.attn_q.weight": "iq4_nl", "blk.0.ffn_down.weight": "iq3_s"},
             "IQ4_XS": {"blk.0.attn_q.weight": "iq4_nl", "blk.0.ffn_down.weight": "iq4_xs"},
             "Q6_K": {"blk.0.attn_q.weight": "q8_0", "blk.0.ffn_down.weight": "q6_k"}}
    calls = []

    def measure(label, assign):
        calls.append(label)
        return {"kld_mean": 0.01 * len(calls)}

    measure.cost = {"skipped": 0, "duplicates": 0}
    plan = SimpleNamespace(quantized=names, groups=groups, types=types, group_bytes=lambda g, c: 1)
    floor, out = _measure_all(measure, plan, "Q8_0", ("IQ3_S", "IQ4_XS", "Q6_K"), "plain")
    assert calls == ["floor", "attn_q.0-0 at IQ3_S", "ffn_down.0-0 at IQ3_S", "ffn_down.0-0 at IQ4_XS",
                     "ffn_down.0-0 at Q6_K"]
    assert measure.cost == {"skipped": 1, "duplicates": 1}
    q = out[0]["kld"]
    assert q["IQ4_XS"] == q["IQ3_S"] and q["Q6_K"] == floor
