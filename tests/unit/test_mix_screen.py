"""The screened search of the sensitivity stage (pipeline/stages/mix/screen.py, issue #32) on generated inputs: the
screened error on GGUFs written with gguf-py, the segments, their anchor and their cuts, and the search itself with a
measurement that follows a known additive truth (so what it predicts can be checked exactly). The real search on the
rotated demo is measured in bench/RESULTS.md; tests/e2e/test_mix.py builds a mix with it."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from pipeline.errors import PipelineError
from pipeline.stages.mix.groups import group_tensors
from pipeline.stages.mix.screen import (
    Segment,
    anchor_of,
    band_scales,
    column_importance,
    exhaustive_runs,
    first_segments,
    probe_for,
    screened_cap,
    screened_search,
    split,
    tensor_reader,
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


def test_fisher_error_is_half_the_fisher_weighted_squared_change(tmp_path):
    """``search: fisher``'s error: 1/2 sum F_ij dW_ij^2 per tensor, F in the file's row-major shape; a weight with
    no Fisher adds nothing, and a row's F scales its share."""
    rng = np.random.default_rng(1)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    base = _gguf(tmp_path / "base.gguf", {"blk.0.attn_q.weight": w.astype(np.float16)})
    q = _gguf(tmp_path / "q.gguf", {"blk.0.attn_q.weight": w}, "Q4_0")
    d = np.asarray(_dequant(q, "blk.0.attn_q.weight")) - np.asarray(_dequant(base, "blk.0.attn_q.weight"))
    f = rng.random((8, 64)).astype(np.float32)
    f[3] = 0.0
    got = weight_errors(base, q, ["blk.0.attn_q.weight"], {}, fisher={"blk.0.attn_q.weight": f})
    assert got["blk.0.attn_q.weight"] == pytest.approx(0.5 * float((f * d ** 2).sum()), rel=1e-6)
    f2 = f.copy()
    f2[5] *= 4
    more = weight_errors(base, q, ["blk.0.attn_q.weight"], {}, fisher={"blk.0.attn_q.weight": f2})
    assert more["blk.0.attn_q.weight"] - got["blk.0.attn_q.weight"] == pytest.approx(1.5 * float((f[5] * d[5] ** 2)
                                                                                               .sum()), rel=1e-5)


def test_tensor_reader_reads_what_gguf_py_reads(tmp_path):
    """The screen's reader (our header parser, the data mapped) against gguf-py's GGUFReader: the same values for
    float, block-quantized and 3-D tensors; a missing tensor names the file."""
    rng = np.random.default_rng(2)
    w2, w3 = rng.standard_normal((4, 256)).astype(np.float32), rng.standard_normal((2, 3, 256)).astype(np.float32)
    for qtype in (None, "Q4_0", "Q8_0"):
        path = _gguf(tmp_path / f"{qtype}.gguf", {"a.weight": w2, "blk.0.ffn_up_exps.weight": w3}, qtype)
        read = tensor_reader(path)
        for name in ("a.weight", "blk.0.ffn_up_exps.weight"):
            want = np.asarray(_dequant(path, name), dtype=np.float32).reshape(-1, 256)
            assert np.array_equal(read(name), want), (qtype, name)
        with pytest.raises(PipelineError, match=f"tensor b.weight is missing from {qtype}.gguf"):
            read("b.weight")


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


def test_segments_split_in_band_order():
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


def test_the_anchor_is_the_second_largest_written_error():
    cands = ("Q3_K", "Q4_K", "Q5_K", "Q6_K")

    def anchor(errors: dict) -> str:
        return anchor_of(("g",), cands, lambda groups, c: errors[c])

    assert anchor({"Q3_K": 3.0, "Q4_K": 2.0, "Q5_K": 1.0, "Q6_K": 0.5}) == "Q4_K"
    # Q3_K and Q4_K written alike (one form): the next form down
    assert anchor({"Q3_K": 3.0, "Q4_K": 3.0, "Q5_K": 1.0, "Q6_K": 0.0}) == "Q5_K"
    # one form other than the floor's (Q6_K, Q5_K written as the floor): that one
    assert anchor({"Q3_K": 0.0, "Q4_K": 2.0, "Q5_K": 0.0, "Q6_K": 0.0}) == "Q4_K"


def test_exhaustive_runs_count_each_written_form_once():
    groups = group_tensors(["blk.0.attn_q.weight", "blk.1.attn_q.weight", "token_embd.weight"], 1)
    types = {"Q8_0": dict.fromkeys(NAMES, "q8_0"),
             "Q4_K": {"blk.0.attn_q.weight": "q5_0", "blk.1.attn_q.weight": "q5_0", "token_embd.weight": "q4_k"},
             "Q5_K": {"blk.0.attn_q.weight": "q5_1", "blk.1.attn_q.weight": "q5_1", "token_embd.weight": "q5_k"},
             "Q6_K": {"blk.0.attn_q.weight": "q8_0", "blk.1.attn_q.weight": "q8_0", "token_embd.weight": "q5_k"}}
    types = {c: {n: t.get(n, "q8_0") for n in NAMES} for c, t in types.items()}
    # attn_q: Q4_K, Q5_K (Q6_K written as the floor); token_embd: Q4_K, Q5_K (Q6_K written as Q5_K)
    assert exhaustive_runs(groups, types, "Q8_0", ("Q4_K", "Q5_K", "Q6_K")) == 1 + 2 + 2


def _search(scale_of_layer, cap: int, type_factor: dict | None = None, probe_all: bool = False):
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
    floor, out, segs, probes = screened_search(measure, plan, "Q8_0", cands, "plain", errors, cap, probe_all)
    expected = {g["group"]: {c: truth({**dict.fromkeys(quantized, "Q8_0"),
                                       **dict.fromkeys(g["tensors"], c)}) for c in cands} for g in out}
    return calls, out, segs, expected, probes


def test_screened_search_is_exact_on_an_additive_truth_and_cuts_to_single_groups():
    calls, out, segs, expected, probes = _search(lambda i: 0.02 if i is None else 0.005, cap=40)
    # the floor, each role whole and token_embd, each at its anchor (Q4_K: the second-largest error), token_embd at
    # its other form (the one probe: attn_q and ffn_down have several groups, cuts resolve them), then cuts, the
    # most KLD measured first, until every segment is one group: three per role of four groups
    assert len(calls) == 1 + 3 + 1 + 6 and [len(s.groups) for s in segs] == [1] * 9
    assert {s.anchor for s in segs} == {"Q4_K"}
    assert [(p["role"], p["type"], p["ratio"]) for p in probes] == [("token_embd", "Q3_K", pytest.approx(1.0))]
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    # token_embd, a role of one group: measured at its anchor and at its probe; a group of a larger role at its
    # anchor measured (a cut's first half) or derived, at the other candidate screened
    assert out[-1]["kld"]["Q3_K"]["source"] == out[-1]["kld"]["Q4_K"]["source"] == "measured"
    assert out[0]["kld"]["Q4_K"]["source"] == "measured" and out[0]["kld"]["Q3_K"]["source"] == "screened"


def test_screened_search_cuts_the_most_kld_first_within_its_cap():
    steep = lambda i: 0.02 if i is None else (0.001 if i < 2 else 0.004 if i < 6 else 0.016)  # noqa: E731
    calls, out, segs, expected, _ = _search(steep, cap=40)
    assert [len(s.groups) for s in segs] == [1] * 9
    assert len(calls) == 1 + 3 + 1 + 6  # one evaluation per cut: the second half by subtraction
    assert sum(s.derived for s in segs) == 4 and not segs[-1].derived
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    # a tighter cap: the floor, the first three segments and token_embd's probe, then three cuts, each of the segment
    # that measured the most: attn_q whole (0.040 over the floor), ffn_down whole (0.035), then attn_q's later half
    # (layers 4-7, the steeper: 0.026 by subtraction; ffn_down's later half ties, the earlier segment goes first)
    calls, _, segs, _, probes = _search(steep, cap=8)
    assert len(calls) == 8 and [p["role"] for p in probes] == ["token_embd"]
    assert calls[-3:] == ["attn_q.0-1+attn_q.2-3 at Q4_K", "ffn_down.0-1+ffn_down.2-3 at Q4_K", "attn_q.4-5 at Q4_K"]
    assert [s.groups for s in segs if len(s.groups) > 1] == [("attn_q.0-1", "attn_q.2-3"),
                                                             ("ffn_down.0-1", "ffn_down.2-3"),
                                                             ("ffn_down.4-5", "ffn_down.6-7")]


def test_a_type_probe_prices_a_type_whose_kld_per_error_differs():
    """Q3_K adds twice the KLD per unit of screened error that the anchor (Q4_K) does (on the demo: Q5_1 against
    Q5_0 on 576-wide rows): token_embd's probe at Q3_K measures the ratio, and its prediction is exact; the roles of
    several groups get no probe, keep the anchor's ratio, and their Q3_K is predicted at half the truth (the limit
    the cuts leave: docs/mixes.md#the-screened-search)."""
    flat = lambda i: 0.02 if i is None else 0.005  # noqa: E731
    calls, out, segs, expected, probes = _search(flat, cap=40, type_factor={"Q3_K": 2.0})
    assert [(p["role"], p["ratio"]) for p in probes] == [("token_embd", pytest.approx(2.0))]
    for g in out:
        added = expected[g["group"]]["Q3_K"] - 0.001
        want = added if g["role"] == "token_embd" else added / 2
        assert g["kld"]["Q3_K"]["kld_mean"] - 0.001 == pytest.approx(want, rel=1e-6), g["group"]
        assert g["kld"]["Q4_K"]["kld_mean"] == pytest.approx(expected[g["group"]]["Q4_K"], rel=1e-6), g["group"]


def test_the_fisher_search_probes_every_role_the_most_kld_first():
    """``probe_all`` (search: fisher): every role is probed at its other written form, the role that measured the
    most KLD at its anchor first, before any cut. Under the type factor that the screened search leaves at half the
    truth for roles of several groups (test above), every prediction is then exact."""
    flat = lambda i: 0.02 if i is None else 0.005  # noqa: E731
    calls, out, segs, expected, probes = _search(flat, cap=7, type_factor={"Q3_K": 2.0}, probe_all=True)
    # at the anchor (Q4_K) attn_q added 0.032, ffn_down 0.030, token_embd 0.016
    assert [p["role"] for p in probes] == ["attn_q", "ffn_down", "token_embd"] and len(calls) == 7
    assert all(p["ratio"] == pytest.approx(2.0) for p in probes)
    assert [len(s.groups) for s in segs] == [4, 4, 1]  # the cap left no cut
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)
    # the cap: a fifth of the exhaustive search's evaluations less what the weighting pass counts as
    assert screened_cap(95) == 18 and screened_cap(95, 3) == 16


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
    assert "attn_q.2-3 at Q4_K" in calls and "ffn_down.2-3 at Q4_K" in calls
    for g in out:
        for c, want in expected[g["group"]].items():
            assert g["kld"][c]["kld_mean"] == pytest.approx(want, rel=1e-6), (g["group"], c)


def test_a_role_left_whole_takes_its_cut_siblings_profile_per_band():
    """attn_q stayed one segment; attn_v (same input) was cut and measured 1 and 3 per unit of error in its two
    bands: attn_q's groups get scales in that 1:3 ratio, rescaled so that they still add up to what attn_q measured
    at its anchor. ffn_down has no sibling and keeps its one scale."""
    names = [f"blk.{i}.{r}.weight" for i in range(4) for r in ("attn_q", "attn_v", "ffn_down")]
    groups = group_tensors(names, 2)
    by_name = {g.name: g for g in groups}
    err = {"attn_q.0-1": 1.0, "attn_q.2-3": 2.0, "attn_v.0-1": 1.0, "attn_v.2-3": 1.0, "ffn_down.0-1": 1.0,
           "ffn_down.2-3": 1.0}

    def added(names_, c):
        return sum(err[g] for g in names_)

    q = Segment("attn_q", ("attn_q.0-1", "attn_q.2-3"), "Q4_K", 3.0, 0.021, 0.007)
    v0, v1 = Segment("attn_v", ("attn_v.0-1",), "Q4_K", 1.0, 1.0, 1.0), Segment("attn_v", ("attn_v.2-3",), "Q4_K",
                                                                                 1.0, 3.0, 3.0, derived=True)
    d = Segment("ffn_down", ("ffn_down.0-1", "ffn_down.2-3"), "Q4_K", 2.0, 0.5, 0.25)
    scales = band_scales([q, v0, v1, d], by_name, added)
    assert scales["attn_q.2-3"] == pytest.approx(3 * scales["attn_q.0-1"])
    assert scales["attn_q.0-1"] * 1.0 + scales["attn_q.2-3"] * 2.0 == pytest.approx(0.021)  # what attn_q measured
    assert (scales["attn_v.0-1"], scales["attn_v.2-3"]) == (1.0, 3.0)
    assert scales["ffn_down.0-1"] == scales["ffn_down.2-3"] == 0.25
    assert q.describe()["profile_from"] == "attn_v" and "profile_from" not in d.describe()
    # no sibling cut (attn_v whole too): nothing borrowed
    q2 = Segment("attn_q", ("attn_q.0-1", "attn_q.2-3"), "Q4_K", 3.0, 0.021, 0.007)
    v = Segment("attn_v", ("attn_v.0-1", "attn_v.2-3"), "Q4_K", 2.0, 4.0, 2.0)
    assert band_scales([q2, v], by_name, added)["attn_q.2-3"] == 0.007 and not q2.profile_from


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


def test_a_cached_measurement_reads_back_in_the_order_of_a_fresh_one(tmp_path):
    """The cache file is written with sorted keys; what the measurer returns must not depend on it, or a rebuild
    that reads the cache writes another sensitivity file than the first build (found on the demo: same figures,
    `ppl_ratio` and `same_top_p` swapped)."""
    from pipeline.stages.mix.sensitivity import KEPT, _Measurer

    (tmp_path / "runs").mkdir()
    m = _Measurer(SimpleNamespace(build_number=1, commit="c"), SimpleNamespace(ctx=8, chunks=1), tmp_path / "b.gguf",
                  None, tmp_path / "b.logits", tmp_path, 1, None, "here", ("b", "b", None), "t")
    fresh = {"kld_mean": 0.5, "kld_p99": 2.0, "same_top_p": 0.9, "ppl_ratio": 1.1}
    m._run = lambda label, text: dict(fresh)
    first = m("x", {"blk.0.attn_q.weight": "Q4_K"})
    again = m("x", {"blk.0.attn_q.weight": "Q4_K"})
    assert m.cost["reused"] == 1 and list(first) == list(again) == list(KEPT)
    assert json.dumps(first) == json.dumps(again)


def test_fisher_maps_a_weight_only_in_a_row_order_the_converter_writes():
    """The Fisher pass checks each HF weight against the base GGUF's tensor of that name: as is, or in llama's q/k
    row order (conversion/llama.py permute) for the file's head count; another order, a swapped tensor or another
    shape fails naming the weight. Within F16 rounding counts as equal."""
    from pipeline.stages.mix.fisher import _row_order, permute_rows

    rng = np.random.default_rng(3)
    w = rng.standard_normal((16, 8)).astype(np.float32)
    g16 = w.astype(np.float16).astype(np.float32)
    assert _row_order("q", w, g16, (4, 2), "x") is None
    assert _row_order("q", w, permute_rows(w, 4), (4, 2), "x") == 4
    assert _row_order("k", w, permute_rows(w, 2), (4, 2), "x") == 2
    with pytest.raises(PipelineError, match="x: q does not equal the base GGUF's tensor"):
        _row_order("q", w, w[::-1].copy(), (4, 2), "x")
    with pytest.raises(PipelineError, match=r"x: q has shape \[16, 8\], the base GGUF's tensor \[8, 16\]"):
        _row_order("q", w, w.T.copy(), (4, 2), "x")


def test_fisher_refuses_merged_experts_before_loading_anything():
    from pipeline.stages.mix.fisher import diagonal_fisher

    with pytest.raises(PipelineError, match="x: blk.0.ffn_up_exps.weight merges a mixture's experts.*search: screened"):
        diagonal_fisher("no-such-dir", "no-such.gguf", ["blk.0.attn_q.weight", "blk.0.ffn_up_exps.weight"], [], None,
                        512, 4, 1, False, "x")
