"""Calibration end to end: an imatrix build of the tiny model (tests/conftest.py: tiny_hub) through the real
Snakefile, the manifest's calibration records and their cross-check with the GGUF's own keys."""

from __future__ import annotations

import json
import textwrap

from helpers import CALIB, TINY_COMMIT, TINY_REPO, snakemake


def test_imatrix_build(tmp_path, tiny_hub):
    """imatrix flavours of the tiny model built by the real workflow: the quant records the matrix
    (GGUF keys), the manifest records it with SHA256s, and both agree; the plain flavour has none."""
    from pipeline.gguf import read_header
    from pipeline.stages.publish_files import IMATRIX_KEYS

    recipe = tmp_path / "recipes" / "imx.yaml"
    recipe.parent.mkdir()
    recipe.write_text(textwrap.dedent(f"""\
        name: imx
        source: {{repo: {TINY_REPO}, revision: "{TINY_COMMIT}"}}
        imatrix: {{calibration: {CALIB}, ctx: 256, chunks: 4}}
        quants: [Q4_K_M, {{type: Q4_K_M, variant: plain, imatrix: false}}, IQ3_XXS]
        bench: false
        conformance: false
        """))
    res = snakemake(tmp_path, recipe, hub=tiny_hub[0])
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    folder = tmp_path / "artifacts" / "imx"
    manifest = json.loads((folder / "manifest.json").read_text())
    rec = json.loads((tmp_path / "work" / "imx" / "records" / "imatrix-plain.json").read_text())
    by_file = {a["file"]: a for a in manifest["artifacts"]}
    for f in ("imx-Q4_K_M.gguf", "imx-IQ3_XXS.gguf"):
        cal = by_file[f]["calibration"]["imatrix"]
        assert cal["sha256"] == rec["sha256"] and len(cal["sha256"]) == 64
        assert cal["calibration"] == "botchan-calib.txt" and cal["chunks"] == 4 and cal["ctx"] == 256
        assert cal["calibration_sha256"] == "20400aa480e8368d54e02e63d441531782ea327651c4f056120ebab70ac41c95"
        r = read_header(folder / f)
        assert r.get("quantize.imatrix.dataset") == "botchan-calib.txt"
        assert r.get("quantize.imatrix.chunks_count") == 4
        assert r.get("quantize.imatrix.entries_count") == cal["entries"] > 0
        assert r.get("quantize.imatrix.file") == "imatrix-plain.gguf"  # no build-folder path in the file
    plain = by_file["imx-Q4_K_M_PLAIN.gguf"]
    assert "calibration" not in plain
    assert not any(k in read_header(folder / plain["file"]).metadata for k in IMATRIX_KEYS)
    # the imatrix changed the quant: same type, different bytes
    assert by_file["imx-Q4_K_M.gguf"]["sha256"] != plain["sha256"]
