"""Calibration stages against the real tools: the imatrix stage refuses a text too short for ctx x chunks,
counted with the model's own vocabulary. (Recipe sections `awq:` / `imatrix:`: tests/unit/test_calibration.py.)"""

from __future__ import annotations

import re

import pytest

from pipeline.errors import RecipeError
from pipeline.recipe import load_recipe


def test_imatrix_text_too_short(tmp_path, quantize_exe, source_gguf):
    from pipeline.stages.imatrix import imatrix

    (tmp_path / "short.txt").write_text("Only a few words of calibration text.\n")
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
