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
    assert load_recipe(_recipe(tmp_path)).draft.speedup == Speedup(rounds=3, temperature=0.8, seed=1, parallel=4,
                                                                   prompts=None, n_predict=None)
    d = load_recipe(_recipe(tmp_path, speedup={"rounds": 5, "temperature": 0, "parallel": 1, "prompts": 1,
                                               "n_predict": 32}, min_speedup=1.2)).draft
    assert d.speedup == Speedup(rounds=5, temperature=0.0, seed=1, parallel=1, prompts=1, n_predict=32)
    assert d.min_speedup == 1.2
    assert load_recipe(_recipe(tmp_path, speedup=False)).draft.speedup is None


@pytest.mark.parametrize("draft,field,what", [
    ({"min_speedup": 0}, "draft.min_speedup", "must be a number > 0 and <= 65 (a draft of at most 64 tokens gives at most 65 per step), got 0"),
    ({"min_speedup": -1.5}, "draft.min_speedup", "must be a number > 0"),
    ({"min_speedup": 1.2, "speedup": False}, "draft.min_speedup", "needs the speed-up measured"),
    ({"speedup": {"temperature": -0.1}}, "draft.speedup.temperature", "must be a number 0..100, got -0.1"),
    ({"speedup": {"parallel": 0}}, "draft.speedup.parallel", "must be an integer 1..256 (llama-server -np; llama.cpp's LLAMA_MAX_SEQ), got 0"),
    ({"speedup": {"rounds": 2}}, "draft.speedup.rounds", "must be an integer 3..1000, got 2"),
    ({"speedup": {"warmup": 1}}, "draft.speedup.warmup", "unknown key"),
    ({"speedup": {"prompts": 0}}, "draft.speedup.prompts", "must be an integer 1..1000, got 0"),
    ({"speedup": {"n_predict": 4}}, "draft.speedup.n_predict", "must be an integer 8..2147483647 (llama.cpp's n_predict is an int32), got 4"),
    ({"speedup": {"p_min": [0.5, 1.0]}}, "draft.speedup.p_min", "must be a number > 0 and < 1, got 1.0"),
    ({"speedup": {"p_min": 0.5}}, "draft.speedup.p_min", "must be a non-empty list, got 0.5"),
    ({"speedup": {"n_min": [0]}}, "draft.speedup.n_min", "must be an integer 1..64, got 0"),
    ({"speedup": {"n_min": [2, 2]}}, "draft.speedup.n_min", "repeats a value: [2, 2]"),
])
def test_bad_speedup_keys_one_line(tmp_path, draft, field, what):
    exc = recipe_error(_recipe(tmp_path, **draft))
    assert exc.field == field and what in exc.message, exc


def test_p_min_and_n_min_variants_are_flags_of_the_chosen_length(tmp_path):
    """``draft.speedup.p_min/n_min``: each value a configuration of the chosen length with its flag
    (common/arg.cpp:4150, 4197), named in the verdict when it is the one kept."""
    from pipeline.stages.speedup import variant_flags

    d = load_recipe(_recipe(tmp_path, speedup={"p_min": [0.5, 0.8], "n_min": [2]})).draft
    assert d.speedup.p_min == (0.5, 0.8) and d.speedup.n_min == (2,)
    assert variant_flags(("p_min", 0.5)) == ("--spec-draft-p-min", "0.5") and variant_flags(None) == ()
    assert server_args("m.gguf", "d.gguf", "draft-simple", 4, 2, 1, flags=variant_flags(("n_min", 2)))[:10] == [
        "-m", "m.gguf", "-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "4",
        "--spec-draft-n-min", "2"]
    assert server_args("m.gguf", "d.gguf", "draft-simple", None, 2, 1, flags=("--spec-draft-n-min", "2"))[:4] == [
        "-m", "m.gguf", "--spec-type", "none"]  # the baseline never drafts
    assert verdict(1.4, [1.2, 1.5], 4, "box", ("p_min", 0.5))[1] == "speed-up 1.40x (1.20-1.50) at n_max 4, p_min 0.5 on box"


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


def test_the_plot_draws_each_pair_against_the_draft_length(tmp_path):
    """report's speedup.svg (pipeline/stages/report_speedup.py): one series per measured pair, a point per n_max with
    its min-max bar, the line at 1x; written only when something was measured, and removed when nothing is."""
    import xml.etree.ElementTree as ET

    from pipeline.stages.report_speedup import PLOT_FILE, write_speedup_plot

    def cond(med, lo, hi):
        return {"speedup": med, "interval": [lo, hi]}

    speed = {"m-Q8_0.gguf + d-Q4_0.gguf": {"by_n_max": {"4": cond(0.33, 0.32, 0.36), "8": cond(0.24, 0.23, 0.25)}},
             "m-Q4_K_M.gguf + d-Q4_0.gguf": {"by_n_max": {"4": cond(1.4, 1.2, 1.5), "8": cond(2.1, 1.9, 2.4)}},
             "m-F16.gguf + d-Q4_0.gguf": {"skipped": "vocabularies are incompatible"}}
    manifest = {"name": "m", "build": {"draft_speedup": speed}}
    assert write_speedup_plot(manifest, tmp_path) == PLOT_FILE
    root = ET.parse(tmp_path / PLOT_FILE).getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert len(root.findall(f"{ns}polyline")) == 2 and len(root.findall(f"{ns}circle")) == 4
    texts = [t.text for t in root.iter(f"{ns}text")]
    assert "1x" in texts and "m-Q8_0.gguf" in texts and "+ d-Q4_0.gguf" in texts and "m-F16.gguf" not in texts
    assert write_speedup_plot({"name": "m", "build": {}}, tmp_path) is None and not (tmp_path / PLOT_FILE).exists()


def test_a_variant_is_kept_only_when_its_whole_interval_clears_the_plain_length(monkeypatch):
    """tune(): the rule, on given per-round rates (the rounds themselves run in the speed-up stage): a higher median
    inside the plain length's spread is noise and changes nothing; a variant whose every round beats the plain
    length's best round is kept. Rates per round: the baseline 20 t/s."""
    import pipeline.stages.speedup as sp

    def run(table):
        calls = {}

        def fake_measure(url, prompts, n_predict, what, temperature=0.0, seed=1, concurrent=0):
            i = calls[url] = calls.get(url, -1) + 1
            return {"tokens": 16, "tokens_per_s": table[url][i], "drafted": 8, "accepted": 4}

        monkeypatch.setattr(sp, "measure", fake_measure)
        urls = {None: "base", 4: "plain", ("p_min", 0.8): "p", ("n_min", 2): "n"}
        return sp.tune(urls, 4, [("p_min", 0.8), ("n_min", 2)], ["x"], 16, 3, 1, "t")

    base = [20.0, 20.0, 20.0]
    noise, _ = run({"base": base, "plain": [8.0, 10.0, 12.0], "p": [9.0, 11.0, 11.5], "n": [10.5, 11.0, 9.5]})
    assert noise is None  # medians 0.55 and 0.525 over 0.5, but inside 0.4-0.6
    kept, rec = run({"base": base, "plain": [8.0, 10.0, 12.0], "p": [13.0, 14.0, 15.0], "n": [12.5, 13.0, 20.0]})
    assert kept == ("p_min", 0.8) and rec["chosen"] == "p_min 0.8" and rec["changes_answer"]  # both clear 0.6: p's median
    assert rec["by_config"]["n_max 4"]["interval"] == [0.4, 0.6]
