"""``ggufpipe ci`` on a real git repository: a recipe that follows a branch instead of a pinned commit is
refused before anything is built (the command loads recipes against the real llama-quantize)."""

from __future__ import annotations

from helpers import DEMO_SOURCE, ci_recipe, commit_all, git, new_repo, run_ci, write_yaml


def test_ci_refuses_unpinned_revision(tmp_path):
    repo = new_repo(tmp_path, {"pinned": ci_recipe("pinned")})
    res = run_ci(repo, "--base", "main")
    assert res.returncode == 0 and "no recipe changed since main" in res.stdout, res.stderr
    git(repo, "checkout", "-q", "-b", "floating")
    write_yaml(repo / "recipes" / "floating.yaml", ci_recipe("floating", source={"repo": DEMO_SOURCE["repo"], "revision": "main"}))
    commit_all(repo, "add a recipe that follows a branch")
    res = run_ci(repo, "--base", "main", "--summary", str(tmp_path / "summary.md"))
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert errors == ["error: recipes/floating.yaml: source.revision: 'main' is not a full commit SHA "
                      "(CI builds need pinned sources)"], res.stderr
    assert not (repo / "work").exists() and not (repo / ".snakemake").exists() and not (repo / "artifacts").exists()
    assert "refused (nothing built)" in res.stdout and (tmp_path / "summary.md").read_text() == res.stdout
