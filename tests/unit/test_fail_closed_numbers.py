"""Numbers fail closed (issue #50): every numeric recipe field has a finite range declared once in the schema
(pipeline/recipe/schema.py, pipeline/bounds.py), the parser checks it, and a gate decides nothing on a number that is
not finite. Defects of 1506cb4 proven here: a NaN threshold switched a gate off and a NaN metric passed every gate
(1), duplicate YAML keys were taken silently (8), numbers had no upper bound (9)."""

from __future__ import annotations

import math

import pytest
import yaml

from pipeline.bounds import INT32_MAX, Range, above, below
from pipeline.errors import RecipeError
from pipeline.recipe.schema import SECTIONS
from pipeline.stages.evaluate import METRICS, failure_message, verdict
from unit import test_recipe_docs as docs_tests
from unit.test_recipe_docs import minimal_mapping, recipe_with, write_and_load

recipes_dir = docs_tests.recipes_dir  # the fixture: tmp/recipes/ holding every file the schema's examples name

# Keys that only go with others (pipeline/recipe/parse.py): set together
COMPANIONS = {("gates[]", "max_ctx"): {"ctx": "long", "chunks": 1}}
# What the schema-driven test gives every numeric field (issue #50: NaN, +-inf, a negative, zero and 10^18), and a bool
VALUES = [math.nan, math.inf, -math.inf, -1, 0, 10**18, True]

NUMERIC = [(s, f) for s in SECTIONS for f in s.fields if f.range is not None]


def _cases():
    for s, f in NUMERIC:
        subs = f.range.items() if isinstance(f.range, dict) else [(None, f.range)]
        for sub, rng in subs:
            for v in VALUES:
                yield pytest.param(s.path, f.key, sub, rng, v, id=f"{s.path or 'top'}:{f.key}{'.' + sub if sub else ''}={v!r}")


def _placed(sub: str | None, value, is_list: bool):
    if sub is not None:
        return {sub: value}
    return [value] if is_list else value


LIST_FIELDS = {("", "eos_token_ids"), ("draft", "n_max"), ("draft.speedup", "p_min"), ("draft.speedup", "n_min")}


def _where(path: str, key: str, sub: str | None) -> str:
    """Where the parser names a field: ``gates[0].ctx``, ``quants[0].budget.bpw``, ``eos_token_ids[0]``."""
    prefix = ".".join(p.replace("[]", "[0]") for p in path.split(".")) if path else ""
    field = f"{prefix}.{key}" if prefix else key
    if sub is not None:
        field += f".{sub}"
    if (path, key) == ("", "eos_token_ids"):
        field += "[0]"
    return field


def test_every_numeric_field_declares_a_finite_range():
    """A key the reference types as a number has a range, and every range is finite at both ends."""
    for s in SECTIONS:
        for f in s.fields:
            numeric = f.type.startswith(("int", "number", "list of int", "list of numbers", "list of 1 to 3 int")) \
                or f.type.startswith("`2`") or f.type.startswith("`32`") or "bpw: <number>" in f.type \
                or "max_kld_mean: <number>" in f.type or f.key == "memory"
            if numeric:
                assert f.range is not None, f"{s.path}.{f.key}: a numeric field without a range"
            ranges = f.range.values() if isinstance(f.range, dict) else [f.range] if f.range else []
            for r in ranges:
                assert math.isfinite(r.lo) and math.isfinite(r.hi) and r.lo <= r.hi, (s.path, f.key, r)


@pytest.mark.parametrize("path,key,sub,rng,value", list(_cases()))
def test_numeric_field_out_of_range_is_one_line_naming_it(recipes_dir, path, key, sub, rng, value):
    """The schema-driven property: NaN, +-inf, a negative, zero, 10^18 and a bool in every numeric field. Outside the
    declared range: one line naming the file and the field. Inside: the recipe loads, or (a set of choices within the
    range, e.g. awq.w_bit 0) is refused naming the same field."""
    mapping = {**minimal_mapping(path), **COMPANIONS.get((path, key), {}),
               key: _placed(sub, value, (path, key) in LIST_FIELDS)}
    recipe = recipe_with(path, mapping)
    where = _where(path, key, sub)
    if rng.contains(value):
        try:
            write_and_load(recipes_dir, recipe)
        except RecipeError as exc:
            assert exc.field == where, exc
        return
    with pytest.raises(RecipeError) as e:
        write_and_load(recipes_dir, recipe)
    exc = e.value
    assert exc.field == where, exc
    assert "\n" not in str(exc) and str(exc).startswith(str(recipes_dir / "r.yaml")), exc


def test_range_refuses_every_non_finite_value_and_names_its_bound():
    r = Range(0, 1)
    for v in (math.nan, math.inf, -math.inf, True, "0.5", None, [0.5]):
        assert r.problem(v) == f"must be a number 0..1, got {v!r}", v
    assert r.problem(0) is None and r.problem(1.0) is None and r.problem(0.5) is None
    ctx = Range(16, INT32_MAX, integer=True, note="llama.cpp's n_ctx is an int32")
    assert ctx.problem(2**31) == "must be an integer 16..2147483647 (llama.cpp's n_ctx is an int32), got 2147483648"
    assert ctx.problem(512.0) is not None  # an integer field takes no float, even a whole one
    assert Range(0, 65, lo_open=True).problem(0) == "must be a number > 0 and <= 65, got 0"


# --------------------------------------------------------------------------- defect 1: NaN thresholds and metrics


def _gated(recipes_dir, **thresholds):
    return recipe_with("gates[]", {**minimal_mapping("gates[]"), **thresholds})


@pytest.mark.parametrize("threshold", ["max_kld_mean", "max_ppl_ratio", "max_kld_p99", "min_same_top_p"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_threshold_is_refused(recipes_dir, threshold, value):
    """Defect 1 (1506cb4: `validate` said ok for `max_kld_mean: .nan`, and the gate passed a mean KLD of 5.0)."""
    path = recipes_dir / "r.yaml"
    text = yaml.safe_dump(_gated(recipes_dir), sort_keys=False)
    text = text.replace("  ctx: 512\n", f"  ctx: 512\n  {threshold}: {'.nan' if math.isnan(value) else ('.inf' if value > 0 else '-.inf')}\n", 1)
    path.write_text(text)
    from pipeline.recipe import load_recipe

    with pytest.raises(RecipeError) as e:
        load_recipe(path)
    assert e.value.field == f"gates[0].{threshold}" and "got " in e.value.message, e.value


@pytest.mark.parametrize("name", sorted(METRICS))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, None, "0.01"])
def test_a_metric_that_is_not_a_finite_number_fails_its_gate(name, bad):
    """Defect 1, the metric side: `nan` from a run that went wrong failed no gate on 1506cb4 (NaN > limit is false)."""
    metric = METRICS[name][0]
    good = {"ppl_ratio": 1.01, "kld_mean": 0.01, "kld_p99": 0.1, "same_top_p": 0.95}
    limit = {"max_ppl_ratio": 1.05, "max_kld_mean": 0.05, "max_kld_p99": 0.5, "min_same_top_p": 0.9}[name]
    assert verdict(good, {name: limit}) == []  # the same gate passes a finite, good value
    metrics = {**good, metric: bad} if bad is not None else {k: v for k, v in good.items() if k != metric}
    failures = verdict(metrics, {name: limit})
    assert len(failures) == 1 and failures[0]["threshold"] == name and failures[0]["value"] is None, failures
    line = failure_message("r", "Q4_K_M", "botchan", failures[0])
    assert line.startswith("gate failed: recipe r, quant Q4_K_M, eval set botchan: ") and "not a finite number" in line
    assert ("missing" if bad is None else repr(bad)) in line


def test_a_non_finite_limit_fails_the_gate_even_when_it_reached_the_stage():
    """Defence in depth: a threshold that bypassed the recipe check (NaN) fails its gate instead of passing 5.0."""
    failures = verdict({"kld_mean": 5.0}, {"max_kld_mean": math.nan})
    assert failures and failures[0]["limit"] is None and "max_kld_mean is nan" in failures[0]["unreadable"]


def test_above_and_below_fail_closed():
    for v, lim in ((math.nan, 1.0), (1.0, math.nan), (None, 1.0), (math.inf, 1.0), (True, 1.0)):
        assert above(v, lim) and below(v, lim), (v, lim)
    assert not above(0.5, 1.0) and not below(1.5, 1.0) and above(2.0, 1.0) and below(0.5, 1.0)


def test_gates_of_acceptance_speedup_coverage_and_conformance_fail_closed():
    """The other comparisons that decide publish or refuse: expert coverage and conformance's logit thresholds fail on
    NaN (1506cb4 passed them: `NaN < limit` and `NaN > limit` are both false)."""
    from pipeline.stages.conformance.common import THRESHOLDS
    from pipeline.stages.conformance.logits import _logit_failures
    from pipeline.stages.imatrix_coverage import coverage_failures

    row = {"layer": 0, "covered": 4, "experts": 4, "fraction": math.nan, "cold": []}
    assert coverage_failures([row], 1.0, 1, "m") and not coverage_failures([{**row, "fraction": 1.0}], 1.0, 1, "m")
    good = {"positions": 100, "top1": 1.0, "kld_mean": 0.0, "kld_p99": 0.0, "ln_ppl_ratio": 0.0, "ppl_other": 2.0,
            "ppl_base": 2.0}
    assert _logit_failures("r", "logit fidelity", good, 2) == []
    for key in ("top1", "kld_mean", "kld_p99", "ln_ppl_ratio"):
        bad = _logit_failures("r", "logit fidelity", {**good, key: math.nan}, 2)
        assert len(bad) == 1, (key, bad)
    assert THRESHOLDS["max_kld_mean"] > 0  # the thresholds themselves are finite constants


# --------------------------------------------------------------------------- defect 8: duplicate YAML keys


@pytest.mark.parametrize("text,line,key", [
    ("quants: [Q8_0]\nquants: [Q4_K_M]\n", 4, "quants"),
    ("quants: [Q8_0]\nbench: false\nbench: true\n", 5, "bench"),
    ("quants: [{type: Q8_0, pure: true, pure: false}]\n", 3, "pure"),
])
def test_a_duplicate_key_is_refused_with_its_line(recipes_dir, text, line, key):
    """Defect 8 (1506cb4: PyYAML kept the last `quants:`, so only the second list was built)."""
    from pipeline.recipe import load_recipe

    head = "name: m\nsource: {repo: org/m, revision: \"6b5982a638c6ed4e3da15711b6a5a1328c34a53e\"}\n"
    (recipes_dir / "d.yaml").write_text(head + text)
    with pytest.raises(RecipeError) as e:
        load_recipe(recipes_dir / "d.yaml")
    assert e.value.field == f"line {line}" and e.value.message.startswith(f"duplicate key {key!r} (first given on line")


def test_anchors_are_bounded_and_merge_keys_still_work(recipes_dir):
    from pipeline.recipe import load_recipe

    head = "name: m\nsource: {repo: org/m, revision: \"6b5982a638c6ed4e3da15711b6a5a1328c34a53e\"}\n"
    bomb = "".join(f"x{i}: &x{i} [" + ", ".join([f"*x{i - 1}"] * 10 if i else ["1"] * 10) + "]\n" for i in range(6))
    (recipes_dir / "b.yaml").write_text(head + "quants: [Q8_0]\n" + bomb)
    with pytest.raises(RecipeError) as e:
        load_recipe(recipes_dir / "b.yaml")
    assert "expands to more than 100000 nodes" in e.value.message and e.value.field.startswith("line ")
    (recipes_dir / "r.yaml").write_text(head + "quants: [Q8_0]\nbench: false\n" + "a: &a {x: 1}\n")
    with pytest.raises(RecipeError, match="a: unknown key"):
        load_recipe(recipes_dir / "r.yaml")  # an anchor alone is fine; the key itself is unknown
    ok = head + "quants:\n  - &q {type: Q8_0, pure: true}\n  - {<<: *q, type: Q4_0}\n"
    (recipes_dir / "m.yaml").write_text(ok)
    r = load_recipe(recipes_dir / "m.yaml")
    assert [(q.type, q.pure) for q in r.quants] == [("Q8_0", True), ("Q4_0", True)]


def test_a_fifo_or_a_deep_recipe_is_one_line(recipes_dir, tmp_path):
    import os

    from pipeline.recipe import load_recipe

    fifo = tmp_path / "f.yaml"
    os.mkfifo(fifo)
    with pytest.raises(RecipeError, match="not a regular file"):
        load_recipe(fifo)  # without blocking on the open
    (tmp_path / "deep.yaml").write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    with pytest.raises(RecipeError, match="nested too deeply"):
        load_recipe(tmp_path / "deep.yaml")


# --------------------------------------------------------------------------- defect 9: upper bounds


@pytest.mark.parametrize("mapping,where", [
    ({"ctx": 1_000_000_000_000, "chunks": 16}, "gates[0].ctx"),
    ({"ctx": 512, "chunks": 100_000_000}, "gates[0].chunks"),
])
def test_runaway_gate_sizes_are_refused(recipes_dir, mapping, where):
    """Defect 9 (1506cb4 validated these, and `plan` printed "total 824108720.5 GiB"): ctx above llama.cpp's int32
    n_ctx, and more chunks than the eval text can hold tokens (every token is at least one byte of it)."""
    recipe = recipe_with("gates[]", {**minimal_mapping("gates[]"), **mapping})
    with pytest.raises(RecipeError) as e:
        write_and_load(recipes_dir, recipe)
    assert e.value.field == where, e.value
    if where.endswith("chunks"):
        assert "needs 51200000000 tokens" in e.value.message and "every token is at least one byte" in e.value.message


def test_a_device_context_above_int32_is_refused(recipes_dir):
    recipe = recipe_with("devices[]", {**minimal_mapping("devices[]"), "ctx": 10**12})
    with pytest.raises(RecipeError) as e:
        write_and_load(recipes_dir, recipe)
    assert e.value.field == "devices[0].ctx" and "2147483647" in e.value.message


def test_the_demo_recipes_hold_their_texts():
    """The committed recipes load with the text-size bound (their eval, calibration and sensitivity texts are real)."""
    from pathlib import Path

    from pipeline.recipe import load_recipes

    root = Path(__file__).resolve().parents[2] / "recipes"
    assert load_recipes(root) and load_recipes(root / "mix")



def test_the_report_shows_a_metric_that_failed_closed():
    """A rejected quant whose metric was NaN: the report's row says so instead of failing to format None."""
    from pipeline.stages.report import markdown_table

    f = verdict({"kld_mean": math.nan}, {"max_kld_mean": 0.05})[0]
    manifest = {"name": "m", "artifacts": [{"file": "m-F16.gguf", "role": "base", "quant_type": "F16",
                                            "size_bytes": 1, "bits_per_weight": 16.0}],
                "rejected": [{"file": "m-Q4_0.gguf", "role": "quant", "quant_type": "Q4_0", "size_bytes": 1,
                              "bits_per_weight": 4.5, "metrics": {"g": {"kld_mean": None}},
                              "failures": [{**f, "eval_set": "g"}]}]}
    table = markdown_table(manifest, "g", speed=False)
    assert "FAIL: kld_mean is nan (not a finite number)" in table, table


def test_a_speed_up_with_a_nan_round_helps_nowhere():
    """min() and median() of [2.0, nan, 3.0] depend on the list's order; the build box's speed-up fails closed."""
    from pipeline.stages.speedup import summarize
    from pipeline.stages.speedup import verdict as speedup_verdict

    s = summarize([40.0, math.nan, 60.0], [20.0, 20.0, 20.0])
    assert math.isnan(s["speedup"]) and all(math.isnan(x) for x in s["interval"])
    helps, line = speedup_verdict(s["speedup"], s["interval"], 4, "box")
    assert not helps and line.startswith("no speed-up on box")
    assert below(s["speedup"], 1.2)  # a min_speedup gate fails on it too
    assert summarize([40.0, 50.0, 60.0], [20.0, 20.0, 20.0])["interval"] == [2.0, 3.0]


@pytest.mark.parametrize("argv", [["build", "--cores", "nan"], ["build", "--cores", "0"], ["ci", "--cores", "1e9"],
                                  ["rebuild-check", "m.json", "--cores", "-1"], ["install-tools", "-j", "0"],
                                  ["stage", "fetch", "--recipe", "r.yaml", "--threads", "513"]])
def test_count_flags_are_ranged(argv, capsys):
    """Every numeric flag has a range: `--cores` (all or 1..65536), `-j`, `--threads` (ggml's 512)."""
    from pipeline.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.splitlines()
    assert e.value.code == 2 and [ln for ln in err if "error:" in ln] == [err[-1]], err
    assert "must be " in err[-1] and ("1..65536" in err[-1] or "1..512" in err[-1]), err[-1]
