"""``ggufpipe ci``'s results: each selected recipe's verdict from its manifest (or the stage that failed before
publishing) and the markdown summary (pipeline/distribution/ci.py runs the command)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from pipeline.distribution.ci_select import Selection
from pipeline.distribution.manifest_check import read_manifest
from pipeline.errors import PipelineError
from pipeline.fsutil import parse_json
from pipeline.layout import Layout
from pipeline.recipe import Recipe
from pipeline.stages.evaluate import gate_messages

ERRORS_ENV = "GGUFPIPE_CI_ERRORS"  # each failing `ggufpipe stage` appends a line (pipeline/cli/__init__.py)


def read_errors(path: Path) -> list[dict]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        try:
            rec = parse_json(line)
        except ValueError:
            continue
        if isinstance(rec, dict) and isinstance(rec.get("message"), str):  # what the summary reads of a record
            out.append(rec)
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

    for res in results:
        ok, unexplained = True, []
        for name in res.names:
            mine = [e for e in errors if e.get("name") == name]
            gate_errs = [e for e in mine if e.get("stage") == "gate"]
            if layout.gate_ok(name).is_file() or gate_errs:
                # the gate stage ran in this build (the stamps were removed before it): the manifest is fresh
                try:  # checked: the summary indexes what the manifest check vouches for
                    manifest = read_manifest(layout.manifest(name))
                except PipelineError as exc:
                    res.errors.append(f"{name}: {exc}")
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
    elif draft.get("mtp"):
        out.append("Draft: the model's own multi-token-prediction heads (`--spec-type draft-mtp`)")
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


