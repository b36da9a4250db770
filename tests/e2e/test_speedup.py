"""The speed-up stage's speed-up control (issue #30; the no-speed-up control is tests/e2e/test_minicpm_pair.py): an echo
pair built by the real Snakefile with the stage on. The main (hidden 768, 8 layers, its F16 file: 108 MB, more than
this box's caches) and the draft (hidden 128, 1 layer, Q8_0) both repeat their input token
(helpers.hf_factory.make_echo_pair), so every drafted token is accepted. Decoding one token reads every weight of the
main; verifying n_max + 1 drafted tokens reads them once too, so each step yields n_max + 1 tokens for little more
than the cost of one. The answer is far from 1, so the test may assert it whatever else the box runs; it asserts
nothing near 1."""

from __future__ import annotations

import json

import pytest
from helpers import BOTCHAN, snakemake, write_yaml
from helpers.hf_factory import make_echo_pair

N_MAX = 8


@pytest.fixture(scope="module")
def echo_build(tmp_path_factory):
    root = tmp_path_factory.mktemp("echo")
    main, draft = make_echo_pair(root / "hf", main_shape=(768, 8))
    recipe = write_yaml(root / "recipes" / "echo.yaml", {
        "name": "echo", "source": {"path": str(main)}, "quants": ["Q8_0"], "bench": False,
        "conformance": False,  # structured weights: the stage under test is the speed-up
        "draft": {"source": {"path": str(draft)}, "quants": ["Q8_0"], "pairs": [["F16", "Q8_0"]], "n_max": [N_MAX],
                  "prompts": 1, "n_predict": 32, "eval_text": str(BOTCHAN), "min_speedup": 1.2,
                  # 256 tokens a request: the draft decodes them in about 0.8 s, long enough that the other test
                  # worker's bursts average out; one slot (the concurrent condition: tests/e2e/test_minicpm_pair.py)
                  "speedup": {"n_predict": 256, "parallel": 1}}})
    res = snakemake(root, recipe)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return root, json.loads((root / "artifacts" / "echo" / "manifest.json").read_text())


def test_accepted_drafts_decode_faster_and_the_line_is_published(echo_build):
    root, m = echo_build
    label = "echo-F16.gguf + echo-draft-Q8_0.gguf"
    sp = m["build"]["draft_speedup"][label]
    c = sp["by_n_max"][str(N_MAX)]
    assert c["acceptance_rate"] == 1.0 and c["drafted"] > 0, c  # the echo: every drafted token accepted
    # the gate (min_speedup 1.2) passed too: no failure (measured figures: docs/drafts.md)
    assert sp["helps"] and sp["interval"][0] > 1.0 and sp["speedup"] >= 1.2, sp
    line = f"llama-server -m echo-F16.gguf -md echo-draft-Q8_0.gguf --spec-type draft-simple --spec-draft-n-max {N_MAX}"
    assert sp["deploy"] == line and sp["verdict"].startswith("speed-up ") and not m["failures"]
    assert sp["sampled"]["temperature"] == 0.8 and "concurrent" not in sp and sp["n_predict"] == 256
    assert [len(x["speedup_by_round"]) for x in (c, sp["sampled"])] == [3, 3]
    for page in ("README.md", "report.md"):
        assert f"`{line}`" in (root / "artifacts" / "echo" / page).read_text(), page
    assert "deploy" not in m["draft"]["pairs"][0]  # the decision follows a clock: volatile, outside build_id
