"""``ggufpipe ci``'s selection of changed recipes on real git repositories, how a Snakemake failure blocks, and
the summary of a passing recipe with a draft (no build)."""

from __future__ import annotations

import pytest
from helpers import ROOT, ci_recipe, commit_all, git, new_repo, write_yaml

from pipeline.distribution.ci_select import changed_recipes
from pipeline.distribution.ci_summary import snakemake_failed_jobs
from pipeline.errors import PipelineError

# ------------------------------------------------------------------ selection (no build)


def test_changed_recipes_rules(tmp_path):
    texts = {f"data/{x}.txt": f"text {x}\n" * 1200 for x in ("a", "b", "d")}  # 9 x 512 tokens fit
    repo = new_repo(tmp_path, {"a": ci_recipe("a", "../data/a.txt"), "b": ci_recipe("b", "../data/b.txt"),
                               "c": ci_recipe("c", "../data/a.txt"), "d": ci_recipe("d", "../data/d.txt"),
                               "gone": ci_recipe("gone", "../data/a.txt")},
                    data={**texts, "pipeline/stage.py": "x = 1\n"})
    R = repo / "recipes"
    git(repo, "checkout", "-q", "-b", "feature")
    sel = changed_recipes(repo, "main")
    assert sel.recipes == [] and sel.reason.startswith("no recipe changed since main")

    # committed: a recipe edited, another deleted, an unrelated file changed
    write_yaml(R / "a.yaml", ci_recipe("a", "../data/a.txt", description="edited"))
    (R / "gone.yaml").unlink()
    write_yaml(repo / "README.md", "more\n")
    commit_all(repo, "edit a, delete gone")
    # not committed: a text that b reads (unstaged), a new recipe (untracked), d's text deleted
    write_yaml(repo / "data" / "b.txt", "text b, edited\n" * 400)
    write_yaml(R / "new.yaml", ci_recipe("new", "../data/a.txt"))
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
    write_yaml(R / "c.yaml", ci_recipe("c", "../data/a.txt", description="changed on main"))
    commit_all(repo, "main moves")
    git(repo, "checkout", "-q", "feature")
    git(repo, "stash", "pop", "-q")
    assert (R / "c.yaml").resolve() not in changed_recipes(repo, "main").recipes

    # pipeline code changed: every recipe (the deleted one is still only reported)
    write_yaml(repo / "pipeline" / "stage.py", "x = 2\n")
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


def test_summary_of_a_passing_recipe_with_draft(tmp_path):
    """The summary of the demo build, from its git-tracked manifest: quants, draft pairs, verdict."""
    import json

    from pipeline.distribution.ci_select import Selection
    from pipeline.distribution.ci_summary import RecipeResult, summary_markdown
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
    assert "| `smollm2-135m-Q8_0.gguf` | Q8_0 | 138.1 | botchan | 1.0084 | 0.00370 | 0.0158 | 96.0% | ✅ pass |" in md
    assert "|  |  |  | chat | 1.0001 | 0.00224 | 0.0202 | 98.6% |  |" in md  # one row per further eval set
    assert ("| `smollm2-135m-Q8_0.gguf` | `smollm2-135m-draft-Q4_0.gguf` | ✅ compatible | 0.543 | 4 | 0.89 |"
            in md)
    assert "Failures:" not in md and "**" not in md and md.rstrip().endswith("<sub>ggufpipe ci, 3 min 12 s</sub>")
