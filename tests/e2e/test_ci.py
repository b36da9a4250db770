"""``ggufpipe ci`` end to end: a fetch failure is reported, and a branch that adds a recipe builds only that
recipe (real Snakemake, real llama.cpp, the tiny model of tests/conftest.py: tiny_hub)."""

from __future__ import annotations

from helpers import DEMO_SOURCE, TINY_COMMIT, TINY_REPO, ci_recipe, commit_all, git, new_repo, run_ci, write_yaml


def test_ci_reports_a_fetch_failure(tmp_path, demo_hub):
    """A recipe that fails before publishing appears with its stage and error line."""
    repo = new_repo(tmp_path, {})
    git(repo, "checkout", "-q", "-b", "feature")
    write_yaml(repo / "recipes" / "nowhere.yaml", ci_recipe("nowhere", source={**DEMO_SOURCE, "revision": "0" * 40}))
    res = run_ci(repo, "--base", "main", "--cores", "2", hub=demo_hub)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "### ❌ nowhere — `recipes/nowhere.yaml` (added)" in res.stdout
    assert ("- fetch: recipes/nowhere.yaml: source: HuggingFaceTB/SmolLM2-135M-Instruct@" + "0" * 40
            + ": cannot fetch: HF_HUB_OFFLINE is set") in res.stdout, res.stdout


def test_ci_builds_only_the_added_recipe(tmp_path, tiny_hub):
    """A branch adds a recipe with an impossible gate: only it is built, the command fails, and the
    summary names the quant and the metric."""
    tiny = {"repo": TINY_REPO, "revision": TINY_COMMIT}
    repo = new_repo(tmp_path, {"existing": ci_recipe("existing", source=tiny)})
    git(repo, "checkout", "-q", "-b", "add-tight")
    write_yaml(repo / "recipes" / "tight.yaml",
               ci_recipe("tight", source=tiny, quants=[{"type": "Q8_0", "gates": {"max_kld_mean": 1e-7}}]))
    commit_all(repo, "add tight")
    summary = tmp_path / "summary.md"
    res = run_ci(repo, "--base", "main", "--cores", "2", "--summary", str(summary), hub=tiny_hub[0])
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
