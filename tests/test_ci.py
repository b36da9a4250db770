"""``ggufpipe ci``: selection of changed recipes on real git repositories, the pin check, and a real
build of only the recipe a branch adds (real Snakemake, real llama.cpp, the demo model)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import FAKE_TOKEN, ROOT

from pipeline.ci import changed_recipes, snakemake_failed_jobs
from pipeline.errors import PipelineError

BOTCHAN = ROOT / "data" / "botchan.txt"
DEMO_SOURCE = {"repo": "HuggingFaceTB/SmolLM2-135M-Instruct", "revision": "6b5982a638c6ed4e3da15711b6a5a1328c34a53e"}
GIT_ENV = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.org", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@example.org", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}


def git(repo: Path, *args: str) -> str:
    res = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, env={**os.environ, **GIT_ENV})
    assert res.returncode == 0, res.stderr
    return res.stdout


def commit_all(repo: Path, msg: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", msg)


def recipe(name: str, text: str = "../data/botchan.txt", **changes) -> dict:
    """A small recipe on the demo model: one Q8_0, one eval set of 9 x 512 (2295 scored tokens)."""
    data = {"name": name, "source": dict(DEMO_SOURCE), "quants": ["Q8_0"],
            "gates": [{"name": "botchan", "text": text, "ctx": 512, "chunks": 9}], "bench": False}
    data.update(changes)
    return data


def write(path: Path, data) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False) if isinstance(data, dict) else data)
    return path


def new_repo(tmp_path: Path, recipes: dict[str, dict], data: dict[str, str] | None = None) -> Path:
    """A git repo (branch main, one commit) with recipes/, data/ (Botchan unless given) and a README."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    if data is None:
        (repo / "data").mkdir()
        shutil.copyfile(BOTCHAN, repo / "data" / "botchan.txt")
    for rel, text in (data or {}).items():
        write(repo / rel, text)
    for name, r in recipes.items():
        write(repo / "recipes" / f"{name}.yaml", r)
    write(repo / "README.md", "recipes\n")
    commit_all(repo, "base")
    return repo


def ci(repo: Path, *args: str, hub: Path | None = None) -> subprocess.CompletedProcess:
    """`ggufpipe ci` as a user runs it: in the checkout's folder (this repo's code and Snakefile)."""
    env = {**os.environ, **GIT_ENV, "HF_HUB_OFFLINE": "1", "HF_TOKEN": FAKE_TOKEN,
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    if hub:
        env["HF_HUB_CACHE"] = str(hub)
    return subprocess.run([sys.executable, "-m", "pipeline.cli", "ci", *args], cwd=repo, capture_output=True,
                          text=True, env=env)


# ------------------------------------------------------------------ selection (no build)


def test_changed_recipes_rules(tmp_path):
    texts = {f"data/{x}.txt": f"text {x}\n" for x in ("a", "b", "d")}
    repo = new_repo(tmp_path, {"a": recipe("a", "../data/a.txt"), "b": recipe("b", "../data/b.txt"),
                               "c": recipe("c", "../data/a.txt"), "d": recipe("d", "../data/d.txt"),
                               "gone": recipe("gone", "../data/a.txt")},
                    data={**texts, "pipeline/stage.py": "x = 1\n"})
    R = repo / "recipes"
    git(repo, "checkout", "-q", "-b", "feature")
    sel = changed_recipes(repo, "main")
    assert sel.recipes == [] and sel.reason.startswith("no recipe changed since main")

    # committed: a recipe edited, another deleted, an unrelated file changed
    write(R / "a.yaml", recipe("a", "../data/a.txt", description="edited"))
    (R / "gone.yaml").unlink()
    write(repo / "README.md", "more\n")
    commit_all(repo, "edit a, delete gone")
    # not committed: a text that b reads (unstaged), a new recipe (untracked), d's text deleted
    write(repo / "data" / "b.txt", "text b, edited\n")
    write(R / "new.yaml", recipe("new", "../data/a.txt"))
    (repo / "data" / "d.txt").unlink()
    sel = changed_recipes(repo, "main")
    assert sel.recipes == [(R / n).resolve() for n in ("a.yaml", "b.yaml", "d.yaml", "new.yaml")], sel.why
    why = {p.name: w for p, w in sel.why.items()}
    assert why["a.yaml"] == "modified" and why["new.yaml"] == "added" and why["b.yaml"] == "data/b.txt changed"
    assert why["d.yaml"].startswith("no longer loads (") and "d.txt does not exist" in why["d.yaml"]
    assert sel.deleted == ["recipes/gone.yaml"] and sel.pipeline_changes == []
    assert sel.reason.startswith("4 recipe(s) changed since main (merge base ")

    # the branch moved on while main got a commit of its own: the merge base is what counts
    git(repo, "stash", "-q", "-u")
    git(repo, "checkout", "-q", "main")
    write(R / "c.yaml", recipe("c", "../data/a.txt", description="changed on main"))
    commit_all(repo, "main moves")
    git(repo, "checkout", "-q", "feature")
    git(repo, "stash", "pop", "-q")
    assert (R / "c.yaml").resolve() not in changed_recipes(repo, "main").recipes

    # pipeline code changed: every recipe (the deleted one is still only reported)
    write(repo / "pipeline" / "stage.py", "x = 2\n")
    sel = changed_recipes(repo, "main")
    assert sel.pipeline_changes == ["pipeline/stage.py"]
    assert [p.name for p in sel.recipes] == ["a.yaml", "b.yaml", "c.yaml", "d.yaml", "new.yaml"]
    assert sel.why[(R / "c.yaml").resolve()] == "pipeline code changed" and sel.deleted == ["recipes/gone.yaml"]
    assert sel.reason.startswith("pipeline code changed since main") and "all 5 recipe(s)" in sel.reason

    with pytest.raises(PipelineError, match=r"base ref 'origin/nope' is not a commit"):
        changed_recipes(repo, "origin/nope")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    with pytest.raises(PipelineError, match="is not inside a git checkout"):
        changed_recipes(outside, "main")


def test_snakemake_failure_blocks():
    """Snakemake 9.27 reports a failed job without its wildcards: they come from the job's announcement."""
    out = """localrule fetch:
    output: work/x/hf, work/x/records/fetch.json
    log: work/x/logs/fetch.log
    jobid: 3
    wildcards: name=x
    resources: tmpdir=/tmp
rule quantize:
    jobid: 7
    wildcards: name=y, quant=Q8_0
Error in rule fetch:
    message: None
    jobid: 3
    log: work/x/logs/fetch.log (check log file(s) for error details)
    shell:
        python -m pipeline.cli stage fetch > work/x/logs/fetch.log 2>&1
        (command exited with non-zero exit code)
Exiting because a job execution failed. Look above for error messages
"""
    assert snakemake_failed_jobs(out) == [{"rule": "fetch", "wildcards": {"name": "x"}, "log": "work/x/logs/fetch.log"}]


# ------------------------------------------------------------------ the command


def test_ci_refuses_unpinned_revision(tmp_path):
    repo = new_repo(tmp_path, {"pinned": recipe("pinned")})
    res = ci(repo, "--base", "main")
    assert res.returncode == 0 and "no recipe changed since main" in res.stdout, res.stderr
    git(repo, "checkout", "-q", "-b", "floating")
    write(repo / "recipes" / "floating.yaml", recipe("floating", source={"repo": DEMO_SOURCE["repo"], "revision": "main"}))
    commit_all(repo, "add a recipe that follows a branch")
    res = ci(repo, "--base", "main", "--summary", str(tmp_path / "summary.md"))
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: recipes/floating.yaml: source.revision: 'main' is not a full commit SHA "
                      "(CI builds need pinned sources)"], res.stderr
    assert not (repo / "work").exists() and not (repo / ".snakemake").exists() and not (repo / "artifacts").exists()
    assert "refused (nothing built)" in res.stdout and (tmp_path / "summary.md").read_text() == res.stdout


def test_ci_reports_a_fetch_failure(tmp_path, demo_hub):
    """A recipe that fails before publishing appears with its stage and error line."""
    repo = new_repo(tmp_path, {})
    git(repo, "checkout", "-q", "-b", "feature")
    write(repo / "recipes" / "nowhere.yaml", recipe("nowhere", source={**DEMO_SOURCE, "revision": "0" * 40}))
    res = ci(repo, "--base", "main", "--cores", "2", hub=demo_hub)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "### ❌ nowhere — `recipes/nowhere.yaml` (added)" in res.stdout
    assert ("- fetch: recipes/nowhere.yaml: source: HuggingFaceTB/SmolLM2-135M-Instruct@" + "0" * 40
            + ": cannot fetch: HF_HUB_OFFLINE is set") in res.stdout, res.stdout


@pytest.mark.e2e
def test_ci_builds_only_the_added_recipe(tmp_path, demo_hub):
    """A branch adds a recipe with an impossible gate: only it is built, the command fails, and the
    summary names the quant and the metric."""
    repo = new_repo(tmp_path, {"existing": recipe("existing")})
    git(repo, "checkout", "-q", "-b", "add-tight")
    write(repo / "recipes" / "tight.yaml", recipe("tight", quants=[{"type": "Q8_0", "gates": {"max_kld_mean": 1e-7}}]))
    commit_all(repo, "add tight")
    summary = tmp_path / "summary.md"
    res = ci(repo, "--base", "main", "--cores", "2", "--summary", str(summary), hub=demo_hub)
    assert res.returncode == 1, res.stdout[-3000:] + res.stderr[-3000:]
    assert (repo / "work" / "tight").is_dir() and not (repo / "work" / "existing").exists()
    assert not (repo / "artifacts" / "existing").exists()
    assert not (repo / "work" / "tight" / "gate.ok").exists()
    md = res.stdout
    assert summary.read_text() == md
    assert md.startswith("## ggufpipe CI: ❌ 1 of 1 recipe(s) failed") and "1 recipe(s) changed since main" in md
    assert "### ❌ tight — `recipes/tight.yaml` (added)" in md
    row = next(ln for ln in md.splitlines() if ln.startswith("| `tight-Q8_0.gguf` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1] == "Q8_0" and cells[4].startswith("**0.") and cells[-1] == "❌ fail", row  # mean KLD in bold
    assert "- gate failed: recipe tight, quant Q8_0, eval set botchan: kld_mean = " in md
    assert "> max_kld_mean 1e-07" in md
    assert "| `tight-F16.gguf` | F16 |" in md and "build_id `tight-" in md


def test_summary_of_a_passing_recipe_with_draft(tmp_path):
    """The summary of the demo build, from its git-tracked manifest: quants, draft pairs, verdict."""
    import json

    from pipeline.ci import RecipeResult, Selection, summary_markdown
    from pipeline.recipe import load_recipe

    demo = load_recipe(ROOT / "recipes" / "smollm2-135m.yaml")
    manifest = json.loads((ROOT / "artifacts" / "smollm2-135m" / "manifest.json").read_text())
    res = RecipeResult(recipe=demo, shown="recipes/smollm2-135m.yaml", why="modified", passed=True,
                       manifests={"smollm2-135m": manifest})
    sel = Selection(base_ref="origin/main", merge_base="0" * 40, repo_root=ROOT, recipes=[demo.path],
                    deleted=["recipes/old.yaml"])
    md = summary_markdown(sel, [res], 192.0)
    assert md.startswith("## ggufpipe CI: ✅ 1 recipe(s) passed\n\n1 recipe(s) changed since origin/main")
    assert "Deleted (not built): `recipes/old.yaml`" in md and "### ✅ smollm2-135m" in md
    assert "| `smollm2-135m-Q8_0.gguf` | Q8_0 | 138.1 | 1.0084 | 0.00370 | 0.0158 | 96.0% | ✅ pass |" in md
    assert ("| `smollm2-135m-Q8_0.gguf` | `smollm2-135m-draft-Q4_0.gguf` | ✅ compatible | 0.543 | 4 | 0.89 |"
            in md)
    assert "Failures:" not in md and "**" not in md and md.rstrip().endswith("<sub>ggufpipe ci, 3 min 12 s</sub>")
