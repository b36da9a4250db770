"""Adding a stage is one file (issue #28): a copy of the project gets tests/data/stages/tensor_count.py in
pipeline/stages/ and nothing else, and the workflow builds the new stage's output, ``ggufpipe stage`` runs it by hand,
and ``ggufpipe plan``'s resources and the rule order know it, all from its one declaration."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from helpers import LOCK_FILES, ROOT, TINY_NAME


def test_a_stage_added_by_one_file_builds(tmp_path, tiny_hub):
    hub, recipe = tiny_hub
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "pipeline", proj / "pipeline", ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("Snakefile", "envs/ggufpipe.yaml", *LOCK_FILES):
        (proj / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / f, proj / f)
    shutil.copy(ROOT / "tests" / "data" / "stages" / "tensor_count.py", proj / "pipeline" / "stages")
    env = {"PYTHONPATH": str(proj)}  # the stages' own processes import the copy
    work = tmp_path / "build"
    record = f"work/{TINY_NAME}/records/tensor-count.json"
    res = subprocess.run([sys.executable, "-m", "snakemake", "--snakefile", str(proj / "Snakefile"), "--directory",
                          str(work), "--cores", "2", "--config", f"recipes={recipe}", "--", record],
                         cwd=tmp_path, capture_output=True, text=True,  # not the checkout: `-m` puts the cwd first
                         env={**os.environ, **env, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub)})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert "rule tensor_count:" in res.stdout + res.stderr
    built = json.loads((work / record).read_text())
    assert built["tensors"] > 0 and built["n_vocab"] > 0
    # by hand: the declaration's own paths, no --in/--out
    (work / record).unlink()
    res = subprocess.run([sys.executable, "-m", "pipeline.cli", "stage", "tensor-count", "--recipe", str(recipe)],
                         cwd=work, capture_output=True, text=True, env={**os.environ, **env})
    assert res.returncode == 0, res.stderr
    assert json.loads((work / record).read_text()) == built
    # the plan's resources and the pre-flight's order come from the same declaration
    code = ("from pipeline.devices.plan_jobs import resources; from pipeline.stages import registry; "
            "print(list(registry()).index('tensor_count'), resources('tensor_count'))")
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env={**os.environ, **env}, check=True).stdout
    assert out.strip() == "3 {'mem_mb': 512, 'disk_mb': 64, 'runtime': 5}"  # after fetch, convert, convert_mtp

