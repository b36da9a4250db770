"""``mtp: separate`` end to end: the real Snakefile converts the model without its MTP heads, exports the heads
as the draft ``<name>-mtp-F16.gguf`` and publishes both, on a tiny generated GLM-4.5-style checkpoint."""

from __future__ import annotations

import json
import re

import pytest
from helpers import mtp_recipe, snakemake
from helpers.hf_factory import tiny_glm4_moe


@pytest.fixture(scope="module")
def glm_hf(tmp_path_factory, demo_snapshot):
    return tiny_glm4_moe(tmp_path_factory.mktemp("glm") / "hf", demo_snapshot)


def test_workflow_separate(tmp_path, glm_hf, demo_hub):
    """Real Snakemake, `mtp: separate`: the MTP draft is exported by its own rule, published beside the
    model files and recorded; switching the recipe to another mode re-converts (the mode is a rerun trigger)."""
    from pipeline.distribution.verify import verify

    rfile = mtp_recipe(tmp_path / "recipes", glm_hf, "separate")
    res = snakemake(tmp_path, rfile, hub=demo_hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    folder = tmp_path / "artifacts" / "glm"
    m = json.loads((folder / "manifest.json").read_text())
    assert [(e["file"], e["role"]) for e in m["artifacts"]] == [
        ("glm-F16.gguf", "base"), ("glm-mtp-F16_MTP.gguf", "mtp-draft"), ("glm-Q8_0.gguf", "quant")]
    base, draft, q8 = m["artifacts"]
    assert "mtp" not in base and "mtp" not in q8
    assert draft["mtp"] == {"tensors": 4, "layers": [2], "nextn_predict_layers": 1}
    assert draft["quant_type"] == "F16" and draft["converter_args"] == ["--mtp"] and len(draft["sha256"]) == 64
    assert m["mtp"]["mode"] == "separate" and m["mtp"]["converter_args"] == ["--no-mtp"]
    assert m["mtp"]["draft_file"] == "glm-mtp-F16_MTP.gguf"
    assert m["mtp"]["deploy"] == [f"llama-server -m {f} -md glm-mtp-F16_MTP.gguf --spec-type draft-mtp"
                                  for f in ("glm-F16.gguf", "glm-Q8_0.gguf")]
    assert verify(folder / "glm-mtp-F16_MTP.gguf").startswith("OK")
    assert (tmp_path / "work" / "glm" / "gate.ok").is_file()
    assert "## MTP heads" in (folder / "report.md").read_text()
    card = (folder / "README.md").read_text()
    assert "-md glm-mtp-F16_MTP.gguf --spec-type draft-mtp" in card and "llama-cli -m glm-mtp-F16_MTP.gguf" not in card

    for mode in ("strip", "keep"):
        mtp_recipe(tmp_path / "recipes", glm_hf, mode)
        res = snakemake(tmp_path, rfile, hub=demo_hub, extra=["--dry-run"])
        out = res.stdout + res.stderr
        assert res.returncode == 0, out[-3000:]
        assert re.search(r"^convert\s+1$", out, re.M) and "convert_mtp" not in out, out[-3000:]
