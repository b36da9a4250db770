"""Recipe ``split:``: model files published as llama-gguf-split shards in a folder per file.

A tiny Llama (hidden 256, FFN 1536: F16 about 5.8 MB, every tensor under 1 MB) is built through the real
Snakefile with ``split: {max_size: 1M}`` and the real llama-gguf-split: the manifest lists the shards,
``verify`` passes on the folder and on any shard and fails in one line on a missing, truncated, altered or
extra shard, llama.cpp loads the split model from its first shard with the same results as the whole
file, a changed ``max_size`` re-splits without re-quantizing, and DVC tracks a split file as one folder
that a device pulls and verifies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import ROOT, SPLIT_NAME, snakemake, write_split_recipe

from pipeline.fsutil import sha256_file
from pipeline.recipe import load_recipe

V1 = """\
    split: {max_size: 1M}
    quants:
      - Q8_0
      - {type: Q4_0, split: false}
    publish: {hf_repo: org/tiny-split-GGUF}
    """
# max_size raised (fewer shards), Q8_0 now whole, Q4_0 now split (the recipe default)
V2 = """\
    split: {max_size: 2M}
    quants:
      - {type: Q8_0, split: false}
      - Q4_0
    publish: {hf_repo: org/tiny-split-GGUF}
    """


@pytest.fixture(scope="module")
def tiny_hf(tmp_path_factory):
    from helpers.hf_factory import make_tiny_llama

    return make_tiny_llama(tmp_path_factory.mktemp("tiny-split") / "hf", intermediate=1536)


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_hf):
    """One real Snakemake build of V1 (F16 and Q8_0 split, Q4_0 whole)."""
    work = tmp_path_factory.mktemp("split-build")
    recipe = write_split_recipe(work / "recipes", tiny_hf, V1)
    res = snakemake(work, recipe)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    return work, recipe


def art(work: Path) -> Path:
    return work / "artifacts" / SPLIT_NAME


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], capture_output=True, text=True, cwd=cwd, env=env)


# ------------------------------------------------------------------ recipe


# ------------------------------------------------------------------ a real build


def test_build_publishes_split_folders_and_the_manifest_lists_the_shards(built):
    from pipeline.gguf import read_facts
    from pipeline.stages.split import SHARD_RE, shard_header

    work, _recipe = built
    folder = art(work)
    m = json.loads((folder / "manifest.json").read_text())
    assert [(e["file"], e["quant_type"], e["role"], bool(e.get("split"))) for e in m["artifacts"]] == [
        (f"{SPLIT_NAME}-F16", "F16", "base", True), (f"{SPLIT_NAME}-Q8_0", "Q8_0", "quant", True),
        (f"{SPLIT_NAME}-Q4_0.gguf", "Q4_0", "quant", False)]
    for e in m["artifacts"][:2]:
        s = e["split"]
        key = e["file"].removeprefix(f"{SPLIT_NAME}-")
        whole = work / "work" / SPLIT_NAME / "quants" / f"{e['file']}.gguf"
        facts = read_facts(whole)
        assert s["count"] == len(s["shards"]) >= 3 and s["max_size"] == "1M" and s["max_size_bytes"] == 10**6
        assert s["unsplit"] == {"file": whole.name, "sha256": facts.sha256, "size_bytes": facts.size_bytes}
        # the whole model's facts, read from the whole file
        assert (e["tensor_count"], e["parameter_count"], e["bits_per_weight"]) == (
            facts.tensor_count, facts.parameter_count, facts.bits_per_weight)
        assert "sha256" not in e and e["size_bytes"] == sum(sh["size_bytes"] for sh in s["shards"])
        assert sorted(p.name for p in (folder / e["file"]).iterdir()) == [sh["file"] for sh in s["shards"]]
        assert sum(sh["tensor_count"] for sh in s["shards"]) == e["tensor_count"]
        for i, sh in enumerate(s["shards"], 1):
            p = folder / e["file"] / sh["file"]
            assert sh["file"] == f"{SPLIT_NAME}-{key}-{i:05d}-of-{s['count']:05d}.gguf" and SHARD_RE.match(sh["file"])
            assert sha256_file(p) == sh["sha256"] and p.stat().st_size == sh["size_bytes"]
            h = shard_header(p)
            assert (h["no"], h["count"], h["tensors_total"]) == (i - 1, s["count"], e["tensor_count"])
            # at most max_size of tensor data per shard (the first shard also carries the metadata)
            assert sum(-(-t.n_bytes // 32) * 32 for t in h["header"].tensors) <= 10**6
            # published by hard link from work/<name>/split/
            assert os.path.samefile(p, work / "work" / SPLIT_NAME / "split" / e["file"] / sh["file"])
    assert not (folder / f"{SPLIT_NAME}-Q8_0.gguf").exists() and not (folder / f"{SPLIT_NAME}-F16.gguf").exists()
    # the whole file stays in work/ (eval and bench read it; it is not published)
    assert (work / "work" / SPLIT_NAME / "quants" / f"{SPLIT_NAME}-Q8_0.gguf").is_file()
    # Ollama imports one GGUF only: Modelfiles for whole files; the card says how to run a split file
    assert [o["file"] for o in m["ollama"]] == ["Modelfile.Q4_0"]
    card = (folder / "README.md").read_text()
    first = m["artifacts"][1]["split"]["shards"][0]["file"]
    assert f"llama-cli -m {SPLIT_NAME}-Q8_0/{first} -cnv" in card and "Split files have no Modelfile" in card
    assert f"`{SPLIT_NAME}-Q8_0/` ({m['artifacts'][1]['split']['count']} shards, max 1M)" in (folder / "report.md").read_text()


def test_verify_split_folder_and_any_shard(built):
    work, _ = built
    folder = art(work)
    m = json.loads((folder / "manifest.json").read_text())
    q8 = m["artifacts"][1]
    for target in (folder / q8["file"], folder / q8["file"] / q8["split"]["shards"][-1]["file"]):
        res = cli("verify", str(target))
        assert res.returncode == 0 and res.stdout.startswith(f"OK  {folder / q8['file']} (Q8_0, "), res.stderr
        assert f"{q8['split']['count']} shard(s)" in res.stdout
    res = cli("verify", str(folder / f"{SPLIT_NAME}-Q4_0.gguf"), str(folder / f"{SPLIT_NAME}-F16"))
    assert res.returncode == 0 and res.stdout.count("OK") == 2, res.stderr


def _damage(folder: Path, how: str) -> Path:
    shards = sorted(folder.iterdir())
    if how == "missing":
        shards[1].unlink()
        return shards[1]
    if how == "truncated":
        data = shards[2].read_bytes()
        shards[2].write_bytes(data[: len(data) - 4096])
        return shards[2]
    if how == "flipped":
        data = bytearray(shards[-1].read_bytes())
        data[len(data) - 100] ^= 0x01
        shards[-1].write_bytes(bytes(data))
        return shards[-1]
    if how == "extra":
        extra = folder / (folder.name + "-00009-of-00009.gguf")
        shutil.copyfile(shards[0], extra)
        return extra
    if how == "header":  # shard 2's bytes as shard 1, and a manifest that vouches for them: split.no is wrong
        shutil.copyfile(shards[1], shards[0])
        mpath = folder.parent / "manifest.json"
        m = json.loads(mpath.read_text())
        entry = next(e for e in m["artifacts"] if e["file"] == folder.name)
        entry["split"]["shards"][0].update(sha256=sha256_file(shards[0]), size_bytes=shards[0].stat().st_size)
        mpath.write_text(json.dumps(m))
        return shards[0]
    raise AssertionError(how)


@pytest.mark.parametrize("how,expected", [
    ("missing", r"shard 2 of \d+ missing \(not pulled\?\)"),
    ("truncated", r"shard 3 of \d+: size \d+ bytes, manifest says \d+: truncated or wrong file"),
    ("flipped", r"shard (\d+) of \1: SHA256 [0-9a-f]{64} does not match the manifest's [0-9a-f]{64}: file altered"),
    ("extra", r"not a shard the manifest lists"),
    ("header", r"split.no/split.count/split.tensors.count say 1/(\d+)/(\d+), expected 0/\1/\2 \(shard 1 of"),
])
def test_verify_fails_in_one_line_naming_the_shard(built, tmp_path, how, expected):
    work, _ = built
    root = tmp_path / "device"
    shutil.copytree(art(work), root, copy_function=shutil.copyfile)  # real copies, not the build's hard links
    folder = root / f"{SPLIT_NAME}-Q8_0"
    bad = _damage(folder, how)
    for target in (folder, folder / sorted(os.listdir(folder))[0]):
        res = cli("verify", str(target))
        err = res.stderr.strip()
        assert res.returncode == 1 and res.stdout == "" and "\n" not in err, (res.stdout, err)
        assert err.startswith(f"error: {bad}: ") and re.search(expected, err), err


def test_verify_missing_folder_and_file_for_folder(built, tmp_path):
    work, _ = built
    root = tmp_path / "device"
    root.mkdir()
    shutil.copyfile(art(work) / "manifest.json", root / "manifest.json")
    res = cli("verify", str(root / f"{SPLIT_NAME}-Q8_0"))
    assert res.returncode == 1 and "missing (not pulled?): the manifest lists a folder of" in res.stderr
    (root / f"{SPLIT_NAME}-Q8_0").write_bytes(b"GGUF")  # a file where the folder should be
    res = cli("verify", str(root / f"{SPLIT_NAME}-Q8_0"))
    assert res.returncode == 1 and "missing (not pulled?)" in res.stderr


def _ppl_chunks(tc, model: Path, text: Path) -> tuple[list[str], str]:
    """Per-chunk perplexities printed by llama-perplexity and the whole log (run as the eval stage runs it:
    passive OpenMP waiting, re-run when b11312's unjoined logger lost the last lines, llama.cpp issue 22142)."""
    from pipeline.stages.evaluate import has_final_estimate, run_perplexity

    res = run_perplexity(tc, ["-m", model, "-f", text, "-c", "128", "--chunks", "3", "-b", "128", "-t", "2", "-lv", "4"],
                         None, has_final_estimate, f"perplexity of {model.name}")
    assert res.returncode == 0 and has_final_estimate(res.output), res.output[-2000:]
    return re.findall(r"\[\d+\]([0-9.]+),", res.output), res.output


def test_llama_cpp_loads_the_split_model_from_its_first_shard(built, toolchain, tmp_path):
    work, _ = built
    m = json.loads((art(work) / "manifest.json").read_text())
    q8 = m["artifacts"][1]
    text = tmp_path / "text.txt"
    text.write_bytes((ROOT / "data" / "botchan.txt").read_bytes()[:20000])
    first = art(work) / q8["file"] / q8["split"]["shards"][0]["file"]
    split_ppl, log = _ppl_chunks(toolchain, first, text)
    whole_ppl, _ = _ppl_chunks(toolchain, work / "work" / SPLIT_NAME / "quants" / f"{SPLIT_NAME}-Q8_0.gguf", text)
    assert f"additional {q8['split']['count'] - 1} GGUFs metadata loaded" in log
    assert len(split_ppl) == 3 and split_ppl == whole_ppl  # the same weights, bit for bit


def test_upload_plan_keeps_the_split_folders(built):
    from pipeline.distribution.hub import load_manifest, upload_plan

    work, recipe = built
    m = load_manifest(art(work))
    plan = upload_plan(load_recipe(recipe), m, art(work))
    ggufs = [f["path_in_repo"] for f in plan if f["kind"] == "gguf"]
    want = [f"{e['file']}/{s['file']}" for e in m["artifacts"][:2] for s in e["split"]["shards"]] + [f"{SPLIT_NAME}-Q4_0.gguf"]
    assert ggufs == want
    shard = next(f for f in plan if f["path_in_repo"] == want[0])
    assert shard["sha256"] == m["artifacts"][0]["split"]["shards"][0]["sha256"]


def test_new_max_size_resplits_without_requantizing_and_drops_stale_shards(built, tiny_hf):
    """Runs last on the shared build: V2 changes max_size and which files are split."""
    work, recipe = built
    quants = work / "work" / SPLIT_NAME / "quants"
    before = {p.name: p.stat().st_mtime_ns for p in quants.glob("*.gguf")}
    write_split_recipe(recipe.parent, tiny_hf, V2)
    res = snakemake(work, recipe, extra=["--dry-run"])
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    jobs = dict(re.findall(r"^(\w+)\s+(\d+)$", out.split("Job stats:")[1].split("Reasons:")[0], re.M))
    assert jobs == {"split": "2", "publish": "1", "gate": "1", "all": "1", "total": "5"}, out[-3000:]
    res = snakemake(work, recipe)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in quants.glob("*.gguf")} == before  # nothing re-quantized
    m = json.loads((art(work) / "manifest.json").read_text())
    assert [(e["file"], e.get("split", {}).get("max_size")) for e in m["artifacts"]] == [
        (f"{SPLIT_NAME}-F16", "2M"), (f"{SPLIT_NAME}-Q8_0.gguf", None), (f"{SPLIT_NAME}-Q4_0", "2M")]
    assert sorted(p.name for p in art(work).iterdir() if p.name.startswith(SPLIT_NAME)) == [
        f"{SPLIT_NAME}-F16", f"{SPLIT_NAME}-Q4_0", f"{SPLIT_NAME}-Q8_0.gguf"]
    f16 = m["artifacts"][0]["split"]
    assert sorted(p.name for p in (art(work) / f"{SPLIT_NAME}-F16").iterdir()) == [s["file"] for s in f16["shards"]]
    assert f16["shards"][0]["file"].endswith(f"-of-{f16['count']:05d}.gguf")
    for e in m["artifacts"]:
        assert cli("verify", str(art(work) / e["file"])).returncode == 0


# ------------------------------------------------------------------ DVC


def test_dvc_tracks_a_split_file_as_one_folder(tmp_path, tiny_hf):
    """dvc repro publishes the split folder (gguf@ stage whose output is a folder) and a whole file side by
    side; a device clone pulls the one folder and verifies it."""
    from helpers import Repo, project_repo

    env = dict(os.environ)
    env.update({"HF_HUB_OFFLINE": "1", "DVC_NO_ANALYTICS": "1", "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
                "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"})
    repo = project_repo(tmp_path / "build-box", env)
    write_split_recipe(repo.path / "recipes", tiny_hf, "quants: [{type: Q8_0, split: {max_size: 1M}}, Q4_0]\n")
    repo.dvc("remote", "add", "-d", "local", str(tmp_path / "remote"))
    repo.cli("dvc-matrix")
    import yaml

    matrix = yaml.safe_load((repo.path / "dvc-matrix.yaml").read_text())["ggufs"]
    assert matrix[f"{SPLIT_NAME}-Q8_0"] == {"name": SPLIT_NAME, "file": f"{SPLIT_NAME}-Q8_0"}  # the folder
    assert matrix[f"{SPLIT_NAME}-Q4_0"] == {"name": SPLIT_NAME, "file": f"{SPLIT_NAME}-Q4_0.gguf"}
    repo.dvc("repro", "--keep-going")
    lock = yaml.safe_load((repo.path / "dvc.lock").read_text())["stages"]
    out = lock[f"gguf@{SPLIT_NAME}-Q8_0"]["outs"][0]
    assert out["path"] == f"artifacts/{SPLIT_NAME}/{SPLIT_NAME}-Q8_0" and out["md5"].endswith(".dir") and out["nfiles"] >= 3
    assert not lock[f"gguf@{SPLIT_NAME}-Q4_0"]["outs"][0]["md5"].endswith(".dir")
    # git ignores the shards (artifacts/**/*.gguf); DVC lists the folder itself in the recipe's .gitignore
    assert (repo.path / "artifacts" / SPLIT_NAME / ".gitignore").read_text().split() == [f"/{SPLIT_NAME}-Q8_0"]
    repo.commit("v1")
    assert repo.git("status", "--porcelain") == ""
    repo.dvc("push", "-q")
    assert repo.dvc("status").stdout.strip().endswith("Data and pipelines are up to date."), repo.dvc("status").stdout

    device = Repo(tmp_path / "device", env)
    subprocess.run(["git", "clone", "-q", str(repo.path), str(device.path)], check=True, env=env)
    q8 = Path("artifacts") / SPLIT_NAME / f"{SPLIT_NAME}-Q8_0"
    device.dvc("pull", "-q", str(q8))
    m = json.loads((device.path / "artifacts" / SPLIT_NAME / "manifest.json").read_text())
    shards = [s["file"] for s in m["artifacts"][1]["split"]["shards"]]
    assert sorted(os.listdir(device.path / q8)) == shards
    assert not list((device.path / "artifacts" / SPLIT_NAME).glob("*.gguf"))  # the other files were not fetched
    ok = device.cli("verify", str(q8))
    assert ok.stdout.startswith(f"OK  {q8} (Q8_0, {len(shards)} shard(s)"), ok.stdout
