"""Calibration recipe sections `awq:` and `imatrix:`: flavours and defaults, the demo calibration recipe, and
every bad combination in one line (no llama.cpp tools; the stages: tests/integration, tests/e2e)."""

from __future__ import annotations

import shutil
import textwrap
from pathlib import Path

import pytest
from helpers import ROOT, recipe_error

from pipeline.recipe import load_recipe

CALIB = ROOT / "data" / "botchan-calib.txt"
EVAL = ROOT / "data" / "botchan.txt"


def recipe_text(quants: str, awq: str = "", imatrix: str = "", gates: bool = True) -> str:
    text = textwrap.dedent("""\
        name: cal
        source: {path: hf}
        quants: QUANTS
        """).replace("QUANTS", quants)
    if awq:
        text += f"awq: {awq}\n"
    if imatrix:
        text += f"imatrix: {imatrix}\n"
    if gates:
        text += "gates: [{name: botchan, text: eval.txt, ctx: 512, chunks: 16}]\n"
    return text


@pytest.fixture
def folder(tmp_path):
    shutil.copyfile(EVAL, tmp_path / "eval.txt")
    shutil.copyfile(CALIB, tmp_path / "calib.txt")
    (tmp_path / "short.txt").write_text("Only a few words of calibration text.\n")
    return tmp_path


def load(folder: Path, text: str):
    p = folder / "r.yaml"
    p.write_text(text)
    return load_recipe(p)


def test_flavours_and_defaults(folder):
    r = load(folder, recipe_text(
        "[Q8_0, Q4_K_M, {type: Q4_K_M, variant: plain, imatrix: false}, IQ2_XXS,"
        " {type: Q3_K_M, variant: awq, awq: true}]",
        awq="{calibration: calib.txt}", imatrix="{calibration: calib.txt, chunks: 8}"))
    flags = {q.key: (q.awq, q.imatrix, q.base) for q in r.quants}
    # awq: every quant unless it opts out; imatrix: 4 bits and fewer by default
    assert flags == {"Q8_0": (True, False, "awq"), "Q4_K_M": (True, True, "awq"),
                     "Q4_K_M_PLAIN": (True, False, "awq"), "IQ2_XXS": (True, True, "awq"),
                     "Q3_K_M_AWQ": (True, True, "awq")}
    assert r.bases == ["plain", "awq"] and r.imatrix_bases == ["awq"]
    assert r.imatrix.chunks == 8 and r.imatrix.ctx == 512 and r.awq.n_samples == 64
    r2 = load(folder, recipe_text("[Q4_K_M, {type: Q4_K_M, variant: imat, imatrix: true}]",
                                  imatrix="{calibration: calib.txt}"))
    assert [(q.key, q.imatrix, q.base) for q in r2.quants] == [("Q4_K_M", True, "plain"),
                                                                ("Q4_K_M_IMAT", True, "plain")]
    assert r2.bases == ["plain"]


def test_demo_calibration_recipe():
    r = load_recipe(ROOT / "recipes" / "smollm2-135m-calib.yaml")
    assert {(q.type, q.awq, q.imatrix) for q in r.quants} == {
        (t, a, i) for t in ("Q4_K_M", "Q3_K_M") for a in (False, True) for i in (False, True)}
    # calibration and eval texts are different files, and the eval part never overlaps the calibration part
    assert r.awq.calibration.read_bytes() != r.eval_sets[0].text.read_bytes()
    eval_part = r.eval_sets[0].text.read_text()[:60_000]  # > 16 x 512 tokens of this text
    calib = r.imatrix.calibration.read_text()
    assert eval_part[30_000:30_200] not in calib and calib[:200] not in eval_part


BAD = [
    ("calibration = eval text", "[Q4_K_M]", "", "{calibration: eval.txt}",
     "imatrix.calibration", "eval.txt is the eval text of gates 'botchan'"),
    ("awq calibration = eval text", "[Q4_K_M]", "{calibration: eval.txt}", "",
     "awq.calibration", "eval.txt is the eval text of gates 'botchan'"),
    ("missing calibration file", "[Q4_K_M]", "", "{calibration: nope.txt}",
     "imatrix.calibration", "calibration text"),
    ("calibration key missing", "[Q4_K_M]", "", "{chunks: 4}", "imatrix.calibration", "missing"),
    ("calibration pin differs", "[Q4_K_M]", "", "{calibration: calib.txt, calibration_sha256: " + "f" * 64 + "}",
     "imatrix.calibration_sha256", "calib.txt has SHA256"),
    ("needs imatrix, none configured", "[IQ2_XS]", "", "", "quants[0].type", "IQ2_XS needs an importance matrix"),
    ("needs imatrix, opted out", "[{type: IQ3_XXS, imatrix: false}]", "", "{calibration: calib.txt}",
     "quants[0].type", "IQ3_XXS needs an importance matrix, and this quant sets `imatrix: false`"),
    ("imatrix without section", "[{type: Q4_K_M, imatrix: true}]", "", "",
     "quants[0].imatrix", "the recipe has no `imatrix:` section"),
    ("awq without section", "[{type: Q4_K_M, awq: true}]", "", "", "quants[0].awq", "the recipe has no `awq:` section"),
    ("unknown awq key", "[Q4_K_M]", "{calibration: calib.txt, bits: 4}", "", "awq.bits", "unknown key"),
    ("bad w_bit", "[Q4_K_M]", "{calibration: calib.txt, w_bit: 5}", "", "awq.w_bit", "must be 2, 3, 4 or 8"),
    ("bad group", "[Q4_K_M]", "{calibration: calib.txt, q_group_size: 100}", "", "awq.q_group_size", "must be"),
    ("bad version", "[Q4_K_M]", "{calibration: calib.txt, version: marlin}", "", "awq.version", "must be one of"),
    ("unknown engine", "[Q4_K_M]", "{calibration: calib.txt, engine: autogptq}", "", "awq.engine",
     "must be one of autoawq, llmcompressor, got 'autogptq'"),
    ("clip with llmcompressor", "[Q4_K_M]", "{calibration: calib.txt, engine: llmcompressor, apply_clip: true}", "",
     "awq.apply_clip", "llmcompressor has no clipping search"),
    ("bad chunks", "[Q4_K_M]", "", "{calibration: calib.txt, chunks: 0}", "imatrix.chunks", "must be an integer 1..2147483647"),
]


@pytest.mark.parametrize("label,quants,awq,imatrix,field,what", BAD, ids=[b[0] for b in BAD])
def test_bad_calibration_recipes(folder, label, quants, awq, imatrix, field, what):
    (folder / "r.yaml").write_text(recipe_text(quants, awq, imatrix))
    exc = recipe_error(folder / "r.yaml")
    assert exc.field == field and exc.message.startswith(what), exc




def test_awq_engine_and_clip_defaults(folder):
    """Without `engine`, the described settings (the rerun trigger) are those of recipes older than the key; the
    clipping default follows the engine, since llm-compressor has none."""
    keys = ["calibration", "w_bit", "q_group_size", "zero_point", "version", "n_samples", "seq_len", "apply_clip"]
    for awq, engine, clip in (("{calibration: calib.txt}", None, True),
                              ("{calibration: calib.txt, engine: llmcompressor}", "llmcompressor", False),
                              ("{calibration: calib.txt, engine: autoawq, apply_clip: false}", "autoawq", False)):
        (folder / "r.yaml").write_text(recipe_text("[Q4_K_M]", awq))
        cfg = load_recipe(folder / "r.yaml").awq
        d = cfg.describe()
        assert cfg.engine == engine and d["apply_clip"] is clip
        assert list(d) == (keys if engine is None else keys[:1] + ["engine"] + keys[1:])
    assert cfg.clip("llmcompressor") is False  # explicit false holds for either engine
