"""``ggufpipe ci``: build and judge only the recipes a change touches (pull-request gating).

Selection (:func:`changed_recipes`) compares the merge base of ``base_ref`` and HEAD with the
**working tree**: committed changes on the branch, plus staged, unstaged and untracked files. In CI
the checkout is clean, so only the branch's commits count; locally, ``ggufpipe ci`` also sees edits
that are not committed yet. Then:

* a recipe (``<recipes>/*.yaml``) added or modified is built;
* a recipe deleted is reported, not built (its published artifacts are left alone);
* a file that a recipe references changed (``gates[].text``, ``draft.eval_text``, ``draft.gguf``,
  ``awq.calibration``, ``imatrix.calibration``, a local ``source.path`` folder): that recipe is built;
  a recipe that no longer loads (e.g. a text it names was deleted) is selected too, so that its
  error is reported;
* pipeline code changed (:data:`PIPELINE_PATHS`: ``pipeline/``, ``Snakefile``, ``pyproject.toml``,
  ``requirements/``): every recipe is built.

:func:`run_ci` then refuses, before building anything, any selected recipe that does not validate or
whose ``source.revision`` (or ``draft.source.revision``) is not a full 40-hex commit SHA; builds the
selected recipes with the Snakefile (``--keep-going``: one failing recipe does not hide another's
verdict); and writes a markdown summary (quants with size and quality, draft pairs, every failure,
and for a recipe that failed before publishing, the error of the stage that failed).

Stage errors are collected exactly, not parsed from Snakemake's interleaved output: ``run_ci`` sets
``GGUFPIPE_CI_ERRORS`` to a file, and every failing ``ggufpipe stage`` run appends one JSON line
(recipe name, stage, quant, message) to it (:func:`note_stage_failure`, called by the CLI).

Exit status: 0 when every selected recipe passed its gates and draft checks (or no recipe changed);
1 when a gate, a draft check or a build step failed; 2 when nothing was built because a recipe was
refused or the selection failed (bad base ref, not a git checkout).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from .errors import PipelineError
from .layout import Layout
from .recipe import COMMIT_RE, Recipe, load_recipe

# Repo-relative paths whose change means "pipeline code changed": every recipe is rebuilt.
PIPELINE_PATHS = ("pipeline/", "Snakefile", "pyproject.toml", "requirements/")
ERRORS_ENV = "GGUFPIPE_CI_ERRORS"
SNAKEFILE = Path(__file__).resolve().parent.parent / "Snakefile"


# --------------------------------------------------------------------------- selection


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
    draft GGUF, a local source folder."""
    refs = [es.text for es in recipe.eval_sets]
    if recipe.draft is not None:
        refs.append(recipe.draft.eval_text)
        if recipe.draft.gguf is not None:
            refs.append(recipe.draft.gguf)
    for section in (recipe.awq, recipe.imatrix):
        if section is not None:
            refs.append(section.calibration)
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


def _shown(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it (how Snakemake gets it)."""
    try:
        return str(path.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


# --------------------------------------------------------------------------- stage error records


def note_stage_failure(args, message: str) -> None:
    """Called by the CLI when a ``stage`` run fails: one JSON line into ``$GGUFPIPE_CI_ERRORS`` (when set)."""
    dest = os.environ.get(ERRORS_ENV)
    if not dest or getattr(args, "cmd", None) != "stage":
        return
    rec = {k: getattr(args, k, None) for k in ("name", "recipe", "stage", "quant", "draft_quant", "eval_set")}
    rec["name"] = rec["name"] or Path(str(rec["recipe"])).stem
    rec["message"] = " ".join(str(message).split())
    try:
        with open(dest, "a", encoding="utf-8") as fh:  # one short append per failing job
            fh.write(json.dumps(rec) + "\n")
    except OSError:
        pass  # the error line still reaches Snakemake's output


def _read_errors(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


# Snakemake 9 announces each job ("localrule fetch:" / "rule fetch:" with jobid and wildcards) and reports
# a failure as "Error in rule fetch:" with the jobid and log (no wildcards): joined on the jobid.
_JOB_HEAD = re.compile(r"^(?:local)?rule (\S+):\s*$")
_ERROR_HEAD = re.compile(r"^Error in rule (\S+):\s*$")
_BLOCK_KEY = re.compile(r"^\s+(\w+):\s*(.*)$")


def snakemake_failed_jobs(output: str) -> list[dict]:
    """Failed jobs as Snakemake reports them ({rule, wildcards, log}): used when a job died without a
    stage error record (killed, out of memory, an output missing after the job)."""
    started: dict[str, dict] = {}
    failed: list[dict] = []
    cur = None
    for line in output.splitlines():
        m_err, m_job = _ERROR_HEAD.match(line), _JOB_HEAD.match(line)
        if m_err or m_job:
            cur = {"rule": (m_err or m_job).group(1), "wildcards": {}, "log": None, "jobid": None,
                   "failed": bool(m_err)}
            if m_err:
                failed.append(cur)
            continue
        k = _BLOCK_KEY.match(line) if cur is not None else None
        if k is None:
            if line.strip() and not line.startswith((" ", "\t")):
                cur = None
            continue
        key, value = k.groups()
        if key == "jobid":
            cur["jobid"] = value.strip()
            if not cur["failed"]:
                started[cur["jobid"]] = cur
        elif key == "wildcards":
            cur["wildcards"] = dict(kv.split("=", 1) for kv in value.split(", ") if "=" in kv)
        elif key == "log":
            cur["log"] = value.split(" (check log")[0].strip() or None
    for job in failed:
        head = started.get(job["jobid"] or "")
        if head is not None:
            job["wildcards"] = job["wildcards"] or head["wildcards"]
            job["log"] = job["log"] or head["log"]
    return [{k: j[k] for k in ("rule", "wildcards", "log")} for j in failed]


def _last_line(path: Path) -> str | None:
    try:
        lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    return lines[-1] if lines else None


# --------------------------------------------------------------------------- results and summary


@dataclass
class RecipeResult:
    recipe: Recipe
    shown: str  # the recipe file as given to Snakemake
    why: str
    passed: bool = False
    manifests: dict[str, dict] = field(default_factory=dict)  # recipe name -> manifest (this build's)
    failures: list[str] = field(default_factory=list)  # failed gates and checks (from the manifests)
    errors: list[str] = field(default_factory=list)  # stage errors (the build did not get to the verdict)

    @property
    def names(self) -> list[str]:
        r = self.recipe
        return [r.name] + ([r.draft_name] if r.draft_recipe() is not None else [])


def _stage_label(rec: dict, main_name: str) -> str:
    """``fetch``, ``eval (botchan, Q4_K_M)``; prefixed with the recipe name for a draft recipe."""
    details = [str(rec[k]) for k in ("eval_set", "quant", "draft_quant") if rec.get(k)]
    label = (rec.get("stage") or "stage") + (f" ({', '.join(details)})" if details else "")
    return label if rec.get("name") == main_name else f"{rec.get('name')} {label}"


def collect_results(results: list[RecipeResult], layout: Layout, errors: list[dict], snakemake_output: str,
                    snakemake_rc: int) -> None:
    """Fill in each result from this build: gate stamps, fresh manifests, stage errors."""
    failed_jobs = snakemake_failed_jobs(snakemake_output)
    from .evaluate import gate_messages

    for res in results:
        ok, unexplained = True, []
        for name in res.names:
            mine = [e for e in errors if e.get("name") == name]
            gate_errs = [e for e in mine if e.get("stage") == "gate"]
            if layout.gate_ok(name).is_file() or gate_errs:
                # the gate stage ran in this build (the stamps were removed before it): the manifest is fresh
                try:
                    manifest = json.loads(layout.manifest(name).read_text())
                except (OSError, ValueError) as exc:
                    res.errors.append(f"{name}: cannot read {layout.manifest(name)}: {exc}")
                    ok = False
                    continue
                res.manifests[name] = manifest
                msgs = gate_messages(manifest)
                res.failures += msgs
                if not layout.gate_ok(name).is_file():
                    ok = False
                    if not msgs:  # the gate failed for another reason (a published file missing...)
                        res.errors += [f"{_stage_label(e, res.recipe.name)}: {e['message']}" for e in gate_errs]
                continue
            ok = False
            if mine:
                res.errors += [f"{_stage_label(e, res.recipe.name)}: {e['message']}" for e in mine]
                continue
            jobs = [j for j in failed_jobs if j["wildcards"].get("name") == name]
            for j in jobs:
                line = _last_line(Path(j["log"])) if j["log"] else None
                res.errors.append(f"{name}: rule {j['rule']} failed" + (f" (log {j['log']}: {line})" if line else ""))
            if not jobs:
                unexplained.append(name)
        for name in unexplained:
            if res.errors:
                res.errors.append(f"{name}: not judged: a stage it needs failed (above)")
            else:
                res.errors.append(f"{name}: the build did not reach the gates (no stage error recorded; Snakemake "
                                  f"exited with status {snakemake_rc}: see its output in the CI log)")
        res.passed = ok and not res.failures and not res.errors


def _mib(n: int | None) -> str:
    return f"{n / 2**20:.1f}" if isinstance(n, int) else "—"


def _num(v, fmt: str, bad: bool) -> str:
    if v is None:
        return "—"
    s = format(v, fmt)
    return f"**{s}**" if bad else s


def _quant_rows(manifest: dict, recipe: Recipe) -> list[str]:
    sets = [es["name"] for es in manifest.get("eval_sets", [])]
    multi = len(sets) > 1
    head = ["file", "type", "size MiB"] + (["eval set"] if multi else []) + [
        "PPL ratio", "mean KLD", "99% KLD", "same top p", "gate"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    arts = manifest.get("artifacts", [])
    base = next((a for a in arts if a.get("role") == "base"), None)
    if base is not None:
        ppl = manifest.get("eval_base", {})
        cell = ", ".join(f"PPL {v['ppl']:.3f}" + (f" ({s})" if multi else "") for s, v in ppl.items()) or "—"
        rows.append("| " + " | ".join([f"`{base['file']}`", base["quant_type"], _mib(base.get("size_bytes"))]
                                      + ([""] if multi else []) + [cell, "", "", "", "reference"]) + " |")
    order = {recipe.artifact_for(q.key): i for i, q in enumerate(recipe.quants)}  # a file, or a split folder
    entries = [a for a in arts if a.get("role") == "quant"] + list(manifest.get("rejected", []))
    entries.sort(key=lambda e: order.get(e["file"], len(order)))
    for e in entries:
        failures = e.get("failures", [])
        verdict = "❌ fail" if failures else "✅ pass"
        metrics = e.get("metrics") or {}
        for i, s in enumerate(sets or [None]):
            m = metrics.get(s, {}) if s else {}
            bad = {f.get("metric") for f in failures if f.get("check") == "gate" and f.get("eval_set") == s}
            cells = [f"`{e['file']}`", e.get("quant_type", "?"), _mib(e.get("size_bytes"))] if i == 0 else ["", "", ""]
            if multi:
                cells.append(s)
            cells += [_num(m.get("ppl_ratio"), ".4f", "ppl_ratio" in bad), _num(m.get("kld_mean"), ".5f", "kld_mean" in bad),
                      _num(m.get("kld_p99"), ".4f", "kld_p99" in bad),
                      _num(m.get("same_top_p") * 100 if m.get("same_top_p") is not None else None, ".1f",
                           "same_top_p" in bad) + ("%" if m.get("same_top_p") is not None else ""),
                      verdict if i == 0 else ""]
            rows.append("| " + " | ".join(cells) + " |")
    for e in arts:  # other published files, e.g. an exported MTP draft (role mtp-draft)
        if e.get("role") not in ("base", "quant"):
            rows.append("| " + " | ".join([f"`{e['file']}`", e.get("quant_type", "?"), _mib(e.get("size_bytes"))]
                                          + [""] * (5 if multi else 4) + [str(e.get("role"))]) + " |")
    return rows


def _draft_rows(draft: dict) -> list[str]:
    out = []
    if draft.get("recipe"):
        files = ", ".join(f"`{f['file']}` ({f['quant_type']}, {_mib(f['size_bytes'])} MiB)"
                          for f in draft.get("files", []))
        out.append(f"Draft model `{draft['recipe']}`: {files}")
    elif draft.get("gguf"):
        out.append(f"Draft model: given file `{draft['gguf']['file']}`")
    out += ["", "| main | draft | vocab | acceptance | best n_max | est. speed-up |", "|---|---|---|---|---|---|"]
    for p in draft.get("pairs", []):
        vocab = "✅ compatible" if p.get("compatible") else f"❌ incompatible ({p.get('reason') or p.get('rule')})"
        a = p.get("acceptance") or {}
        best = a.get("best_n_max")
        speed = (a.get("by_n_max", {}).get(str(best), {}) or {}).get("est_speedup") if best is not None else None
        low = draft.get("min_acceptance") is not None and a.get("acceptance_rate") is not None and \
            a["acceptance_rate"] < draft["min_acceptance"]
        acc = _num(a.get("acceptance_rate"), ".3f", low)
        out.append(f"| `{p['main']}` | `{p['draft']}` | {vocab} | {acc} | {best if best is not None else '—'} | "
                   f"{_num(speed, '.2f', False)} |")
    agree = draft.get("top1_agreement") or {}
    if agree:
        out += ["", "Top-1 agreement with the base model: " + ", ".join(
            f"`{f}` {v['top1_agreement']:.3f}" for f, v in agree.items() if "top1_agreement" in v)]
    return out


def summary_markdown(sel: Selection, results: list[RecipeResult], seconds: float, refused: list[str] | None = None,
                     snakemake_rc: int | None = None) -> str:
    """The PR-comment summary."""
    lines: list[str] = []
    if refused:
        lines += ["## ggufpipe CI: ❌ refused (nothing built)", "", sel.reason + ".", ""]
        lines += [f"- `{r}`" for r in refused]
    elif not sel.recipes:
        lines += ["## ggufpipe CI: ✅ no recipe changed", "", sel.reason + "."]
    else:
        failed = [r for r in results if not r.passed]
        head = (f"❌ {len(failed)} of {len(results)} recipe(s) failed" if failed
                else f"✅ {len(results)} recipe(s) passed")
        lines += [f"## ggufpipe CI: {head}", "", sel.reason + "."]
    if sel.deleted:
        lines += ["", "Deleted (not built): " + ", ".join(f"`{d}`" for d in sel.deleted)]
    for res in results:
        r = res.recipe
        mark = "✅" if res.passed else "❌"
        lines += ["", f"### {mark} {r.name} — `{res.shown}` ({res.why})", ""]
        main = res.manifests.get(r.name)
        if main is not None:
            lines += _quant_rows(main, r)
            if main.get("draft"):
                lines += [""] + _draft_rows(main["draft"])
        if res.failures or res.errors:
            lines += ["", "Failures:" if res.failures else "Errors:"]
            lines += [f"- {m}" for m in res.failures]
            if res.failures and res.errors:
                lines += ["", "Errors:"]
            lines += [f"- {m}" for m in res.errors]
        if main is not None:
            tools = main.get("tools", {})
            lines += ["", f"build_id `{main.get('build_id')}`, llama.cpp b{tools.get('llama_cpp_build')}"
                          f" ({tools.get('llama_cpp_commit')})"]
    foot = f"ggufpipe ci, {_duration(seconds)}"
    if snakemake_rc not in (None, 0):
        foot += f"; Snakemake exit status {snakemake_rc}"
    lines += ["", f"<sub>{foot}</sub>", ""]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines))


def _duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s} s" if m else f"{seconds:.1f} s"


# --------------------------------------------------------------------------- the command


def _run_snakemake(cmd: list[str], env: dict) -> tuple[int, str]:
    """Run Snakemake, streaming its output to stderr (stdout is the summary's); return (rc, output tail)."""
    tail: deque[str] = deque(maxlen=5000)
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          errors="replace") as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.write(line)
            tail.append(line)
        rc = proc.wait()
    sys.stderr.flush()
    return rc, "".join(tail)


def run_ci(base: str, recipes_dir: str | Path = "recipes", cores: str = "all", summary: str | Path | None = None,
           snakemake_args: list[str] | None = None, artifacts: str = "artifacts", work: str = "work",
           out=None) -> int:
    """Entry function of ``ggufpipe ci`` (run in the checkout's folder): select, check, build, judge,
    summarize. Returns the exit status (module docstring)."""
    from .tools import find_toolchain

    out = out or sys.stdout
    t0 = time.monotonic()

    def emit(text: str) -> None:
        out.write(text)
        out.flush()
        if summary:
            Path(summary).write_text(text, encoding="utf-8")

    try:
        sel = changed_recipes(Path.cwd(), base, Path(recipes_dir).resolve())
    except PipelineError as exc:
        emit(f"## ggufpipe CI: ❌ error (nothing built)\n\n`error: {exc}`\n")
        raise

    print(f"ggufpipe ci: {sel.reason}", file=sys.stderr)
    for p, why in sel.why.items():
        print(f"  {_shown(p)}: {why}", file=sys.stderr)
    for d in sel.deleted:
        print(f"  {d}: deleted (not built)", file=sys.stderr)
    if not sel.recipes:
        emit(summary_markdown(sel, [], time.monotonic() - t0))
        return 0

    exe = str(find_toolchain().tool("llama-quantize"))
    results, refused = [], []
    for p in sel.recipes:
        shown = _shown(p)
        try:
            recipe = load_recipe(shown, exe)
        except PipelineError as exc:
            refused.append(str(exc))
            continue
        problems = pin_problems(recipe, shown)
        refused += problems
        results.append(RecipeResult(recipe=recipe, shown=shown, why=sel.why[p]))
    names: dict[str, str] = {}
    for res in results:
        for n in res.names:
            if n in names:
                refused.append(f"{res.shown}: name: {n!r} is already used by {names[n]}")
            names[n] = res.shown
    if refused:
        for line in refused:
            print(f"error: {line}", file=sys.stderr)
        emit(summary_markdown(sel, [], time.monotonic() - t0, refused=refused))
        return 2

    layout = Layout(Path(artifacts), Path(work))
    for res in results:  # the stamps say "judged in this build": only this build's gate jobs write them
        for n in res.names:
            layout.gate_ok(n).unlink(missing_ok=True)
    fd, errors_path = tempfile.mkstemp(prefix="ggufpipe-ci-errors-", suffix=".jsonl")
    os.close(fd)
    try:
        cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(SNAKEFILE), "--cores", str(cores),
               "--keep-going", "--rerun-incomplete", "--config",
               "recipes=" + ",".join(r.shown for r in results), f"artifacts={artifacts}", f"work={work}",
               *(snakemake_args or [])]
        print("ggufpipe ci: " + " ".join(cmd[1:]), file=sys.stderr)
        env = {**os.environ, ERRORS_ENV: errors_path}
        rc, output = _run_snakemake(cmd, env)
        errors = _read_errors(Path(errors_path))
    finally:
        os.unlink(errors_path)
    collect_results(results, layout, errors, output, rc)
    emit(summary_markdown(sel, results, time.monotonic() - t0, snakemake_rc=rc))
    return 0 if rc == 0 and all(r.passed for r in results) else 1
