"""Conformance end to end: the demo build records the verdict and numbers of its base GGUF against the HF model
(manifest, report, card, every file's tokenizer keys), and a build whose HF tokenizer normalizes text the
converter does not carry over fails in one line and publishes nothing."""

from __future__ import annotations

import json
import shutil

import yaml
from helpers import snakemake

from pipeline.gguf import tokenizer_sha256
from pipeline.stages.conformance import THRESHOLDS

NAME = "smollm2-135m"


def test_demo_build_records_conformance(demo_build):
    folder = demo_build / "artifacts" / NAME
    m = json.loads((folder / "manifest.json").read_text())
    c = m["conformance"]
    assert c["passed"] is True and set(c["checks"]) == {"tokenizer", "chat_template", "eog", "hparams", "logits"}, c
    assert all(check["passed"] for check in c["checks"].values()), c
    lg = c["checks"]["logits"]
    assert lg["top1"] >= THRESHOLDS["min_top1"] and lg["kld_mean"] <= THRESHOLDS["max_kld_mean"] / 10, lg
    assert lg["kld_p99"] <= THRESHOLDS["max_kld_p99"] / 10 and abs(lg["ln_ppl_ratio"]) <= THRESHOLDS[
        "max_abs_ln_ppl_ratio"] / 10, lg
    assert set(c["checks"]["tokenizer"]["mismatches"].values()) == {0} and c["checks"]["eog"]["eog"] == [0, 2, 4], c["checks"]
    assert "conformance_seconds" in m["build"] and "details" not in c
    digests = {e["file"]: e["tokenizer_sha256"] for e in m["artifacts"]}
    assert len(set(digests.values())) == 1 and len(digests) == 4, digests
    assert set(digests.values()) == {tokenizer_sha256(folder / f"{NAME}-Q4_K_M.gguf")}
    for page in ("report.md", "README.md"):
        text = (folder / page).read_text()
        assert "## Conformance" in text and "| logits | pass |" in text, page
    draft = json.loads((demo_build / "artifacts" / f"{NAME}-draft" / "manifest.json").read_text())
    assert draft["conformance"]["passed"] is True and draft["conformance"]["checks"]["logits"]["top1"] >= 0.99


def test_normalizer_the_converter_drops_fails_the_build(tmp_path, demo_snapshot):
    """An NFD normalizer in tokenizer.json (the converter keeps none of it; its pre-tokenizer hash text has no
    decomposable accent, so convert accepts the folder): HF splits "café" unlike the GGUF, the tokenizer check
    fails in one line and no file of the recipe is published."""
    hf = tmp_path / "hf"
    shutil.copytree(demo_snapshot, hf, symlinks=False)
    tj = hf / "tokenizer.json"
    data = json.loads(tj.read_text())
    data["normalizer"] = {"type": "NFD"}
    tj.unlink()  # a copy of the hub cache's file: never write through a link
    tj.write_text(json.dumps(data))
    recipe = tmp_path / "recipes" / "nfd.yaml"
    recipe.parent.mkdir()
    recipe.write_text(yaml.safe_dump({"name": "nfd", "source": {"path": str(hf)}, "quants": ["Q8_0"], "bench": False}))
    res = snakemake(tmp_path / "build", recipe)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    errors = [ln for ln in out.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1, errors or out[-3000:]
    assert ("conformance: recipe nfd: tokenizer parity (a: no specials added, special text parsed): probe french: "
            "first difference at token 1") in errors[0] and "37366 ' café'" in errors[0], errors[0]
    art = tmp_path / "build" / "artifacts" / "nfd"
    m = json.loads((art / "manifest.json").read_text())
    assert m["artifacts"] == [] and sorted(e["file"] for e in m["rejected"]) == ["nfd-F16.gguf", "nfd-Q8_0.gguf"]
    assert m["conformance"]["passed"] is False and not m["conformance"]["checks"]["tokenizer"]["passed"]
    assert not list(art.glob("*.gguf")) and not (tmp_path / "build" / "work" / "nfd" / "gate.ok").exists()
