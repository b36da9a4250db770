"""``ggufpipe ci``'s selection: which recipes a change touches (see pipeline/distribution/ci.py for the rules), and the checks
made before anything is built."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.errors import PipelineError
from pipeline.recipe import COMMIT_RE, Recipe, load_recipe

# Repo-relative paths whose change means "pipeline code changed": every recipe is rebuilt.
PIPELINE_PATHS = ("pipeline/", "Snakefile", "pyproject.toml", "requirements/")

def _git(repo: Path, *args: str) -> str:
    try:
        res = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    except FileNotFoundError:
        raise PipelineError("git is not installed (ggufpipe ci compares git revisions)") from None
    if res.returncode != 0:
        last = (res.stderr.strip().splitlines() or ["failed"])[-1]
        raise PipelineError(f"git {' '.join(args)}: {last}")
    return res.stdout


def changed_files(repo_root: str | Path, base_ref: str) -> tuple[Path, str, dict[str, str]]:
    """(git top-level folder, merge-base commit, {repo-relative path: status}) of every file that
    differs between the merge base of ``base_ref`` and HEAD, and the working tree. Status is git's
    letter (A, M, D, T...); untracked files count as added. Renames appear as delete + add."""
    root = Path(repo_root)
    try:
        top = Path(_git(root, "rev-parse", "--show-toplevel").strip()).resolve()
    except PipelineError:
        raise PipelineError(f"{root.resolve()} is not inside a git checkout (ggufpipe ci compares git revisions)") from None
    try:
        _git(top, "rev-parse", "--verify", "--quiet", f"{base_ref}^{{commit}}")
    except PipelineError:
        raise PipelineError(f"base ref {base_ref!r} is not a commit in {top} (fetch it, e.g. `git fetch origin "
                            "main`; on GitHub Actions check out with fetch-depth: 0)") from None
    try:
        merge_base = _git(top, "merge-base", base_ref, "HEAD").strip()
    except PipelineError:
        raise PipelineError(f"base ref {base_ref!r} and HEAD have no common history (a shallow clone? "
                            "fetch the full history: fetch-depth: 0)") from None
    changes: dict[str, str] = {}
    tokens = _git(top, "diff", "--name-status", "--no-renames", "--no-ext-diff", "-z", merge_base).split("\0")
    for status, path in zip(tokens[0::2], tokens[1::2], strict=False):
        if status and path:
            changes[path] = status[0]
    for path in _git(top, "ls-files", "--others", "--exclude-standard", "-z").split("\0"):
        if path:
            changes[path] = "A"
    return top, merge_base, changes


def is_pipeline_path(rel: str) -> bool:
    return any(rel.startswith(p) if p.endswith("/") else rel == p for p in PIPELINE_PATHS)


def referenced_paths(recipe: Recipe) -> list[Path]:
    """Files and folders a recipe reads besides itself (absolute): eval and calibration texts, a given
    draft GGUF, a local source folder, tensor-type maps, the mixes' sensitivity text."""
    refs = [es.text for es in recipe.eval_sets]
    if recipe.draft is not None:
        refs.append(recipe.draft.eval_text)
        if recipe.draft.gguf is not None:
            refs.append(recipe.draft.gguf)
    for section in (recipe.awq, recipe.imatrix):
        if section is not None:
            refs.append(section.calibration)
    refs += [q.tensor_types_file for q in recipe.quants if q.tensor_types_file]
    if recipe.sensitivity is not None:
        refs.append(recipe.sensitivity.text)
    for src in (recipe.source, recipe.draft.source if recipe.draft else None):
        if src is not None and src.path:
            refs.append(Path(src.path).expanduser())  # as the fetch stage reads it (relative to the cwd)
    return [Path(p).resolve() for p in refs]


@dataclass
class Selection:
    """What :func:`changed_recipes` found."""

    base_ref: str
    merge_base: str
    repo_root: Path
    recipes: list[Path] = field(default_factory=list)  # to build: absolute paths, sorted
    why: dict[Path, str] = field(default_factory=dict)  # recipe -> why it was selected
    deleted: list[str] = field(default_factory=list)  # recipe files deleted since the base (repo-relative)
    pipeline_changes: list[str] = field(default_factory=list)  # non-empty: every recipe was selected
    changed: dict[str, str] = field(default_factory=dict)  # every changed file (repo-relative) -> status

    @property
    def reason(self) -> str:
        since = f"since {self.base_ref} (merge base {self.merge_base[:12]})"
        if self.pipeline_changes:
            shown = ", ".join(self.pipeline_changes[:3]) + (", ..." if len(self.pipeline_changes) > 3 else "")
            return f"pipeline code changed {since} ({shown}): all {len(self.recipes)} recipe(s) selected"
        if not self.recipes:
            return f"no recipe changed {since}"
        return f"{len(self.recipes)} recipe(s) changed {since}"


def changed_recipes(repo_root: str | Path, base_ref: str, recipes_dir: str | Path = "recipes") -> Selection:
    """Entry function: the recipes of ``recipes_dir`` (relative to ``repo_root`` unless absolute) that a
    change since ``base_ref`` touches, and why (see the module docstring for the rules)."""
    top, merge_base, changes = changed_files(repo_root, base_ref)
    rdir = (Path(repo_root) / recipes_dir).resolve()
    if not rdir.is_dir():
        raise PipelineError(f"recipes folder {rdir} does not exist")
    sel = Selection(base_ref=base_ref, merge_base=merge_base, repo_root=top, changed=changes)
    current = sorted(p.resolve() for p in rdir.glob("*.yaml") if p.is_file())
    by_path = {(top / rel).resolve(): (rel, st) for rel, st in changes.items()}

    for path, (rel, st) in sorted(by_path.items()):
        if path.parent == rdir and path.suffix == ".yaml":
            if st == "D" and not path.exists():
                sel.deleted.append(rel)
            elif path.is_file():
                sel.why[path] = "added" if st == "A" else "modified"
    sel.pipeline_changes = sorted(rel for rel in changes if is_pipeline_path(rel))
    if sel.pipeline_changes:
        for p in current:
            sel.why.setdefault(p, "pipeline code changed")
    elif changes:
        changed_paths = list(by_path)
        for p in current:
            if p in sel.why:
                continue
            try:
                refs = referenced_paths(load_recipe(p))
            except PipelineError as exc:
                sel.why[p] = f"no longer loads ({exc})"
                continue
            hits = sorted({by_path[c][0] for c in changed_paths for r in refs if c == r or r in c.parents})
            if hits:
                sel.why[p] = f"{', '.join(hits)} changed"
    sel.recipes = sorted(sel.why)
    sel.why = {p: sel.why[p] for p in sel.recipes}
    return sel


# --------------------------------------------------------------------------- checks before building


def pin_problems(recipe: Recipe, shown: str) -> list[str]:
    """One line per source of ``recipe`` that is a hub repo not pinned to a full commit SHA."""
    out = []
    for where, src in (("source", recipe.source), ("draft.source", recipe.draft.source if recipe.draft else None)):
        if src is not None and src.repo and not COMMIT_RE.match(src.revision or ""):
            out.append(f"{shown}: {where}.revision: {src.revision!r} is not a full commit SHA "
                       "(CI builds need pinned sources)")
    return out


def shown_path(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (how Snakemake gets it)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


