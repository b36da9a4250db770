"""Distribution with real git and real DVC (local-folder remote): `dvc repro` runs the Snakemake
workflow incrementally, a device clone pulls one GGUF and verifies it, an older tag gives the older
file, and a quant rejected by its gate is not tracked while the others are."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import DVC_NAME, LOOSE, Repo, dvc_jobs_run, dvc_recipe, project_repo

from pipeline.fsutil import sha256_file

NAME = DVC_NAME
recipe, jobs_run = dvc_recipe, dvc_jobs_run


@pytest.fixture(scope="module")
def dvc_env(tmp_path_factory, tiny_hub):
    base = tmp_path_factory.mktemp("dvc")
    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tiny_hub[0]), "DVC_NO_ANALYTICS": "1",
                "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
                "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"})
    return base, env


def test_dvc_versions_pull_verify_and_incremental_repro(dvc_env):
    base, env = dvc_env
    repo = project_repo(base / "build-box", env)
    (repo.path / "recipes").mkdir()
    (repo.path / "recipes" / f"{NAME}.yaml").write_text(recipe("[Q8_0]"))
    remote = base / "remote"
    repo.dvc("remote", "add", "-d", "local", str(remote))
    repo.cli("dvc-matrix")

    # v1: one quant, built through `dvc repro`, pushed
    res = repo.dvc("repro", "--keep-going")
    assert "build" in res.stdout and {"convert", "quantize", "publish"} <= set(jobs_run(res)), res.stdout[-2000:]
    assert {f"gguf@{NAME}-F16", f"gguf@{NAME}-Q8_0", f"build@{NAME}", f"gate@{NAME}"} <= repo.lock_stages()
    # the small files stay git-tracked, the GGUFs are DVC's (ignored by git)
    assert not (repo.path / "artifacts" / NAME / ".gitignore").exists()
    repo.commit("v1", tag="v1")
    tracked = repo.git("ls-files", "artifacts").split()
    assert f"artifacts/{NAME}/manifest.json" in tracked and f"artifacts/{NAME}/metrics.json" in tracked
    assert not any(t.endswith(".gguf") for t in tracked)
    repo.dvc("push", "-q")
    v1 = {a["file"]: a["sha256"] for a in repo.manifest(NAME)["artifacts"]}
    f16_work = repo.path / "work" / NAME / "quants" / f"{NAME}-F16.gguf"
    q8_work = repo.path / "work" / NAME / "quants" / f"{NAME}-Q8_0.gguf"
    before = (f16_work.stat().st_mtime_ns, q8_work.stat().st_mtime_ns)

    # nothing changed: DVC runs nothing
    res = repo.dvc("repro", "--keep-going")
    assert jobs_run(res) == [] and "didn't change" in res.stdout, res.stdout[-2000:]

    # v2: add a good quant and one whose gate is impossible: Snakemake builds only those two; DVC
    # tracks the good one and the gate fails the repro
    (repo.path / "recipes" / f"{NAME}.yaml").write_text(
        recipe(f"[Q8_0, {{type: Q4_0, gates: {LOOSE}}}, {{type: Q2_K, gates: {{max_kld_mean: 0.000001}}}}]"))
    repo.cli("dvc-matrix")
    res = repo.dvc("repro", "--keep-going", check=False)
    assert res.returncode != 0
    assert set(jobs_run(res)) == {"quantize", "eval", "publish"}, jobs_run(res)  # no fetch, convert, eval_base
    assert jobs_run(res).count("quantize") == 2 and jobs_run(res).count("eval") == 2
    assert (f16_work.stat().st_mtime_ns, q8_work.stat().st_mtime_ns) == before  # nothing rebuilt
    stages = repo.lock_stages()
    assert f"gguf@{NAME}-Q4_0" in stages and f"gguf@{NAME}-Q2_K" not in stages
    assert "gates failed" in (res.stdout + res.stderr) or "max_kld_mean" in (res.stdout + res.stderr)
    assert not (repo.path / "artifacts" / NAME / f"{NAME}-Q2_K.gguf").exists()
    repo.commit("v2: Q4_0 (Q2_K rejected)", tag="v2")
    repo.dvc("push", "-q")
    v2 = {a["file"]: a["sha256"] for a in repo.manifest(NAME)["artifacts"]}
    # quality changes between versions, from the git-tracked metrics files
    diff = repo.dvc("metrics", "diff", "v1", "--md").stdout
    assert "Q4_0.botchan.kld_mean" in diff and "Q2_K.botchan.gate_passed" in diff, diff

    # v3: Q4_0 made `pure` (its tied embedding Q4_0 too instead of the default Q8_0): only that quant is
    # rebuilt, a new version of its file
    (repo.path / "recipes" / f"{NAME}.yaml").write_text(
        recipe(f"[Q8_0, {{type: Q4_0, pure: true, gates: {LOOSE}}}]"))
    repo.cli("dvc-matrix")
    res = repo.dvc("repro", "--keep-going")
    assert sorted(set(jobs_run(res))) == ["eval", "publish", "quantize"], jobs_run(res)
    repo.commit("v3: Q4_0 pure", tag="v3")
    repo.dvc("push", "-q")
    v3 = {a["file"]: a["sha256"] for a in repo.manifest(NAME)["artifacts"]}
    q4 = Path("artifacts") / NAME / f"{NAME}-Q4_0.gguf"
    assert v3[q4.name] != v2[q4.name] and v3[f"{NAME}-Q8_0.gguf"] == v1[f"{NAME}-Q8_0.gguf"]

    # a device: fresh clone, pull ONE file, verify it against the git-tracked manifest
    device = Repo(base / "device", env)
    subprocess.run(["git", "clone", "-q", str(repo.path), str(device.path)], check=True, env=env)
    device.dvc("pull", "-q", str(q4))
    ggufs = sorted(p.name for p in (device.path / "artifacts" / NAME).glob("*.gguf"))
    assert ggufs == [q4.name], ggufs  # the other GGUFs were not fetched
    cache_bytes = sum(p.stat().st_size for p in (device.path / ".dvc" / "cache").rglob("*") if p.is_file())
    remote_bytes = sum(p.stat().st_size for p in remote.rglob("*") if p.is_file())
    print(f"one-file pull: {cache_bytes} bytes fetched; remote holds {remote_bytes} bytes")
    assert cache_bytes == (device.path / q4).stat().st_size < remote_bytes / 3
    ok = device.cli("verify", str(q4))
    assert ok.stdout.startswith("OK") and v3[q4.name][:16] in ok.stdout

    # the older version: checkout the tag, pull, and the file is v2's, verified by v2's manifest
    device.git("checkout", "-q", "v2")
    device.dvc("pull", "-q", str(q4))
    assert sha256_file(device.path / q4) == v2[q4.name]
    assert device.cli("verify", str(q4)).stdout.startswith("OK")
    # ... and without a clone: `dvc get --rev` from the build box's repo (served by the remote)
    got = base / "got-v2.gguf"
    device.dvc("get", "--rev", "v2", str(repo.path), str(q4), "-o", str(got))
    assert sha256_file(got) == v2[q4.name]

    # one flipped byte: verify fails with one clear line and a non-zero exit
    path = device.path / q4
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.unlink()  # a hard link into the DVC cache: write a new file, leave the cache intact
    path.write_bytes(bytes(data))
    bad = device.cli("verify", str(q4), check=False)
    assert bad.returncode != 0 and "does not match the manifest" in bad.stderr and "\n" not in bad.stderr.strip()
