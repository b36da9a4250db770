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
(recipe name, stage, quant, message) to it (pipeline/cli/__init__.py ``_note_failure``).

Exit status: 0 when every selected recipe passed its gates and draft checks (or no recipe changed);
1 when a gate, a draft check or a build step failed; 2 when nothing was built because a recipe was
refused or the selection failed (bad base ref, not a git checkout).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

from pipeline.distribution.ci_select import changed_recipes, pin_problems, shown_path
from pipeline.distribution.ci_summary import ERRORS_ENV, RecipeResult, collect_results, read_errors, summary_markdown
from pipeline.errors import PipelineError
from pipeline.layout import Layout
from pipeline.recipe import load_recipe
from pipeline.tools import find_toolchain

SNAKEFILE = Path(__file__).resolve().parents[2] / "Snakefile"


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
        print(f"  {shown_path(p)}: {why}", file=sys.stderr)
    for d in sel.deleted:
        print(f"  {d}: deleted (not built)", file=sys.stderr)
    if not sel.recipes:
        emit(summary_markdown(sel, [], time.monotonic() - t0))
        return 0

    exe = str(find_toolchain().tool("llama-quantize"))
    results, refused = [], []
    for p in sel.recipes:
        shown = shown_path(p)
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
        errors = read_errors(Path(errors_path))
    finally:
        os.unlink(errors_path)
    collect_results(results, layout, errors, output, rc)
    emit(summary_markdown(sel, results, time.monotonic() - t0, snakemake_rc=rc))
    return 0 if rc == 0 and all(r.passed for r in results) else 1
