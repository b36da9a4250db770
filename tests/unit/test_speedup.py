"""The speed-up's recipe keys, its arithmetic and its decision (pipeline/stages/speedup.py, pipeline/recipe/speedup.py),
on given numbers: the measurements themselves run in tests/e2e/test_speedup.py."""

from __future__ import annotations

import pytest
import yaml
from helpers import recipe_error

from pipeline.recipe import load_recipe
from pipeline.recipe.speedup import Speedup
from pipeline.stages.speedup import server_args, summarize, verdict


def _recipe(folder, **draft):
    text = folder / "text.txt"
    text.write_text("prose\n" * 100)
    path = folder / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "m", "source": {"repo": "org/m", "revision": "a" * 40}, "quants": ["Q8_0"],
                                    "draft": {"source": {"repo": "org/d", "revision": "b" * 40}, "quants": ["Q4_0"],
                                              "eval_text": str(text), **draft}}))
    return path


def test_defaults_and_keys(tmp_path):
    assert load_recipe(_recipe(tmp_path)).draft.speedup == Speedup(rounds=3, temperature=0.8, seed=1, parallel=4)
    d = load_recipe(_recipe(tmp_path, speedup={"rounds": 5, "temperature": 0, "parallel": 1}, min_speedup=1.2)).draft
    assert d.speedup == Speedup(rounds=5, temperature=0.0, seed=1, parallel=1) and d.min_speedup == 1.2
    assert load_recipe(_recipe(tmp_path, speedup=False)).draft.speedup is None


@pytest.mark.parametrize("draft,field,what", [
    ({"min_speedup": 0}, "draft.min_speedup", "must be a number > 0 (a speed-up, 1 = as fast as without), got 0"),
    ({"min_speedup": -1.5}, "draft.min_speedup", "must be a number > 0"),
    ({"min_speedup": 1.2, "speedup": False}, "draft.min_speedup", "needs the speed-up measured"),
    ({"speedup": {"temperature": -0.1}}, "draft.speedup.temperature", "must be a number >= 0, got -0.1"),
    ({"speedup": {"parallel": 0}}, "draft.speedup.parallel", "must be an integer >= 1, got 0"),
    ({"speedup": {"rounds": 2}}, "draft.speedup.rounds", "must be an integer >= 3, got 2"),
    ({"speedup": {"warmup": 1}}, "draft.speedup.warmup", "unknown key"),
])
def test_bad_speedup_keys_one_line(tmp_path, draft, field, what):
    exc = recipe_error(_recipe(tmp_path, **draft))
    assert exc.field == field and what in exc.message, exc


def test_rounds_pair_with_their_own_baseline():
    s = summarize([30.0, 20.0, 36.0], [20.0, 20.0, 24.0])
    assert s["speedup_by_round"] == [1.5, 1.0, 1.5] and s["speedup"] == 1.5 and s["interval"] == [1.0, 1.5]


@pytest.mark.parametrize("median,interval,helps", [(1.8, [1.6, 2.0], True), (1.3, [1.0, 1.6], False),
                                                   (0.62, [0.6, 0.65], False)])
def test_a_line_only_when_the_whole_interval_is_above_one(median, interval, helps):
    got, line = verdict(median, interval, 4, "box X, 2 cores")
    assert got is helps
    assert line == (f"speed-up {median:.2f}x ({interval[0]:.2f}-{interval[1]:.2f}) at n_max 4 on box X, 2 cores" if helps
                    else f"no speed-up on box X, 2 cores: measured {median:.2f}x ({interval[0]:.2f}-{interval[1]:.2f}) "
                         "at n_max 4")


def test_baseline_removes_every_speculative_argument():
    """The baseline is the deploy line without -md, --spec-type and --spec-draft-*, plus --spec-type none: a kept -md
    still loads the draft, and without a type the server infers one from the draft file (common/arg.cpp:566-573)."""
    with_draft = server_args("m.gguf", "d.gguf", "draft-simple", 4, 2, 4)
    base = server_args("m.gguf", "d.gguf", "draft-simple", None, 2, 4)
    assert with_draft == ["-m", "m.gguf", "-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
                          "-c", "4096", "-t", "2", "-np", "4"]
    assert base == ["-m", "m.gguf", "--spec-type", "none", "-c", "4096", "-t", "2", "-np", "4"]
    assert server_args("m.gguf", None, "draft-mtp", 2, 2, 1)[:6] == ["-m", "m.gguf", "--spec-type", "draft-mtp",
                                                                      "--spec-draft-n-max", "2"]
