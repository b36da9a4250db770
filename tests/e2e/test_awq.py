"""AWQ end to end: a real AutoAWQ run with weight clipping inside the real Snakefile, on a tiny Llama generated
here; its quant is published with the AWQ parameters recorded."""

from __future__ import annotations

import json

import pytest
from helpers import CALIB, awq_recipe, snakemake
from helpers.hf_factory import make_tiny_llama


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-awq") / "hf")


def test_awq_build_with_clipping(tmp_path, tiny_hf):
    """The workflow with `awq:` (clipping on): the plain F16 is published and is the reference; AWQ
    quants come from the AWQ base and the manifest records the AWQ parameters and text SHA256."""
    recipe = awq_recipe(tmp_path, tiny_hf, f"{{calibration: {CALIB}, n_samples: 8, seq_len: 64, q_group_size: 64}}",
                        "[Q8_0, {type: Q8_0, variant: plain, awq: false}]")
    res = snakemake(tmp_path, recipe)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    manifest = json.loads((tmp_path / "artifacts" / "tiny-awq" / "manifest.json").read_text())
    by_file = {a["file"]: a for a in manifest["artifacts"]}
    awq = by_file["tiny-awq-Q8_0.gguf"]["calibration"]["awq"]
    assert awq["apply_clip"] is True and awq["q_group_size"] == 64 and awq["calibration"] == CALIB.name
    assert awq["calibration_sha256"] == "20400aa480e8368d54e02e63d441531782ea327651c4f056120ebab70ac41c95"
    assert awq["device"] == "cpu" and awq["threads"] == 2  # calib_threads, whatever --cores
    assert "calibration" not in by_file["tiny-awq-Q8_0_PLAIN.gguf"]
    assert by_file["tiny-awq-Q8_0.gguf"]["sha256"] != by_file["tiny-awq-Q8_0_PLAIN.gguf"]["sha256"]
    assert (tmp_path / "work" / "tiny-awq" / "awq" / "tiny-awq-F16-awq.gguf").is_file()
    assert manifest["build"]["calibration_seconds"]["awq"] > 0
    log = (tmp_path / "work" / "tiny-awq" / "logs" / "awq.log").read_text()
    assert "AWQ: 100%" in log  # AutoAWQ's progress bar, per layer, in the stage log


def test_awq_failure_shows_its_error_line(tmp_path, tiny_hf):
    """The awq rule sends all of the stage's output to its log (AutoAWQ's progress bars): its failure still shows
    its one `error:` line on Snakemake's output (the Snakefile's onerror, pipeline.workflow.logged_rules), as
    every stage's does. Provoked cheaply: a calibration text too short for n_samples x seq_len."""
    short = tmp_path / "short.txt"
    # 568 bytes: enough for the recipe's bound (8 x 64 tokens, a token at least a byte), too few tokens for the stage
    short.write_text("A calibration text far too short for the windows the recipe asks for.\n" * 8)
    recipe = awq_recipe(tmp_path, tiny_hf, f"{{calibration: {short}, n_samples: 8, seq_len: 64}}")
    res = snakemake(tmp_path, recipe)
    out = res.stdout + res.stderr
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert res.returncode != 0, out[-3000:]
    assert len(errors) == 1, out[-3000:]
    assert f"{recipe}: awq: calibration text short.txt has " in errors[0], errors[0]
    assert "fewer than n_samples x seq_len = 8 x 64 = 512" in errors[0], errors[0]
    assert errors[0] in (tmp_path / "work" / "tiny-awq" / "logs" / "awq.log").read_text()
