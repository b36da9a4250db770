"""Kill -9 at fixed points of every long stage, then re-run: the build finishes with the clean build's bytes.

A tiny Llama placed in a local hub cache (the session fixtures ``tiny_hub`` and ``tiny_build`` of tests/conftest.py),
so the fetch stage goes through the real ``snapshot_download`` (``HF_HUB_OFFLINE=1``), built once cleanly (the reference).
In a second folder the same build is run again and again, each run killed at one point by the test-only
hook of pipeline/fsutil.py (``PIPELINE_TEST_KILL``): fetch before its rename, convert after its rename,
llama-quantize itself mid-write (a partial temporary file stays), eval after llama-perplexity exited,
publish between linking the GGUFs and renaming the manifest, and Snakemake itself with all its jobs (a
power cut) after publish renamed the manifest. After each kill: Snakemake failed; every file under its
final name is one the reference build has, every GGUF among them is complete (header and data) and
byte-equal to the reference's; a manifest present lists only files that verify; temporary files are the
only leftovers, and the next run removes them. The last run finishes and every GGUF SHA256, the manifest
(less its volatile ``build`` section) and the metrics equal the reference's.

(The bounded re-run of llama-perplexity when b11312 loses its last output lines: tests/unit/test_perplexity_rerun.py.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers import TINY_NAME as NAME
from helpers import snakemake

from pipeline.errors import PipelineError
from pipeline.fsutil import MID_WRITE_BYTES, sha256_file
from pipeline.gguf import read_header
from pipeline.stages.publish import strip_volatile

TMP_RE = re.compile(r"^\..+\.tmp-\d+$")
BYTE_EQUAL = (".gguf", ".safetensors", ".logits", ".model")  # deterministic outputs and fetched files


def outputs(folder: Path) -> tuple[dict[str, Path], dict[str, Path]]:
    """(files and folders under their final names, temporaries) under work/ and artifacts/, by relative path."""
    final, temps = {}, {}
    for top in ("work", "artifacts"):
        for p in sorted((folder / top).rglob("*")):
            rel = str(p.relative_to(folder))
            parts = p.relative_to(folder).parts
            if any(TMP_RE.match(x) for x in parts[:-1]):
                continue  # inside a temporary folder
            (temps if TMP_RE.match(p.name) else final)[rel] = p
    return final, temps


def check_after_kill(folder: Path, ref: Path, res, temps_expected: list[str]) -> dict[str, Path]:
    """What a killed run may leave: complete files the reference has, and temporaries; returns the temporaries."""
    assert res.returncode != 0, res.stdout[-2000:] + res.stderr[-2000:]
    final, temps = outputs(folder)
    for rel, p in final.items():
        assert (ref / rel).exists(), f"{rel}: left by the killed run, not in the reference build"
        if p.is_file() and p.suffix == ".gguf":
            read_header(p)  # a complete header and all tensor data (PipelineError otherwise)
        if p.is_file() and p.suffix in BYTE_EQUAL:
            assert sha256_file(p) == sha256_file(ref / rel), f"{rel}: differs from the reference build"
        if p.suffix == ".json":
            json.loads(p.read_text())
    manifest = folder / "artifacts" / NAME / "manifest.json"
    if manifest.exists():
        from pipeline.distribution.verify import verify

        for e in json.loads(manifest.read_text())["artifacts"]:
            verify(manifest.parent / e["file"])
    assert sorted(re.sub(r"\d+$", "N", t) for t in temps) == sorted(temps_expected), (sorted(temps), res.stderr[-2000:])
    return temps


KILLS = [
    # (PIPELINE_TEST_KILL, temporaries the killed run leaves (pid as N), the rule that failed)
    ("before-rename:/hf", [f"work/{NAME}/.hf.tmp-N"], "fetch"),
    ("after-rename:-F16.gguf", [], "convert"),  # the F16 was in place, its record not: Snakemake removes it
    ("mid-write:-Q8_0.gguf", [f"work/{NAME}/quants/.{NAME}-Q8_0.gguf.tmp-N"], "quantize"),
    ("after-tool:llama-perplexity", [], "eval"),  # the only llama-perplexity run left: eval of Q8_0
    ("before-rename:/manifest.json", [f"artifacts/{NAME}/.manifest.json.tmp-N"], "publish"),
]


def test_killed_builds_resume_to_the_reference_bytes(tiny_hub, tiny_build, tmp_path):
    hub, recipe = tiny_hub
    reference = tiny_build
    folder = tmp_path / "k"
    previous: dict[str, Path] = {}
    for spec, temps_expected, rule in KILLS:
        res = snakemake(folder, recipe, hub=hub, extra=["--keep-going"], env={"PIPELINE_TEST_KILL": spec},
                        new_session=True)
        assert f"Error in rule {rule}:" in res.stdout + res.stderr, (spec, res.stderr[-2000:])
        temps = check_after_kill(folder, reference, res, temps_expected)
        assert not (set(previous) & set(temps)), f"{spec}: the re-run left the killed run's temporaries"
        previous = temps
        if spec.startswith("mid-write"):
            (tmp,) = temps.values()  # llama-quantize was stopped mid-write: a partial file, never renamed
            assert tmp.stat().st_size == MID_WRITE_BYTES
            with pytest.raises(PipelineError, match="not a GGUF file"):  # its header is written last
                read_header(tmp)
        if spec.startswith("before-rename:/manifest"):  # GGUFs published, no manifest (none lists them yet)
            art = folder / "artifacts" / NAME
            assert sorted(p.name for p in art.glob("*.gguf")) == sorted(p.name for p in
                                                                       (reference / "artifacts" / NAME).glob("*.gguf"))
            assert not (art / "manifest.json").exists()

    # a power cut: Snakemake and its jobs killed together, once publish renamed the manifest into place
    res = snakemake(folder, recipe, hub=hub, env={"PIPELINE_TEST_KILL": "after-rename:/manifest.json:group"},
                    new_session=True)
    assert res.returncode == -9
    check_after_kill(folder, reference, res, [])
    assert any((folder / ".snakemake" / "incomplete").iterdir())  # what plain Snakemake refuses to go past
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode != 0 and "--unlock" in res.stdout + res.stderr  # its lock stays: Snakemake's own one-line hint
    res = snakemake(folder, recipe, hub=hub, extra=["--unlock"])
    assert res.returncode == 0, res.stderr[-2000:]

    # a plain run finishes (profiles/default: --rerun-incomplete) with the reference's bytes
    res = snakemake(folder, recipe, hub=hub)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    final, temps = outputs(folder)
    assert not temps
    ggufs = sorted(rel for rel in final if rel.endswith(".gguf"))
    assert ggufs == sorted(rel for rel in outputs(reference)[0] if rel.endswith(".gguf")) and len(ggufs) == 6
    for rel in ggufs:
        assert sha256_file(folder / rel) == sha256_file(reference / rel), rel
    art, ref_art = folder / "artifacts" / NAME, reference / "artifacts" / NAME
    assert strip_volatile(json.loads((art / "manifest.json").read_text())) == strip_volatile(
        json.loads((ref_art / "manifest.json").read_text()))
    assert (art / "metrics.json").read_bytes() == (ref_art / "metrics.json").read_bytes()
    res = snakemake(folder, recipe, hub=hub, extra=["--dry-run"])
    assert res.returncode == 0 and "Nothing to be done" in res.stdout + res.stderr


# ------------------------------------------------------------------ llama-perplexity losing its last lines


