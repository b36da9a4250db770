"""``ggufpipe``: the command line. Thin wrappers over the stage entry functions.

Errors are printed as one line (``error: ...``) with exit status 1, never as a traceback.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}


def _recipe(path: str, name: str | None = None):
    """The recipe in ``path``; ``name`` may select its derived draft recipe (``<name>-draft``)."""
    from pipeline.recipe import load_recipe
    from pipeline.tools import find_toolchain

    recipe = load_recipe(path, str(find_toolchain().tool("llama-quantize")))
    if name and name != recipe.name:
        if name == recipe.draft_name and recipe.draft_recipe() is not None:
            return recipe.draft_recipe()
        raise PipelineError(f"{path}: defines no recipe named {name!r}")
    return recipe


@dataclass(frozen=True)
class Stage:
    """One stage as the workflow runs it: ``ggufpipe stage <cli>``, the rule of the same key in rules/*.smk.

    ``run(recipe, layout, args, log)`` calls the entry function with every path from the layout;
    ``log`` is the job log's stem (``work/<name>/logs/<stem>.log``) in the rule's wildcards, formatted
    here from the stage's arguments; ``args``: the rule's shell arguments after the common ones;
    ``output``: where the shell sends the stage's own output, its ``error:`` line included:
    ``console`` (Snakemake's output; the tools' output goes to the log), ``log`` (the log only: the
    Snakefile's ``onerror`` prints the error line from it) or ``tee`` (both)."""

    cli: str
    run: Callable
    log: str
    args: str = ""
    output: str = "console"


def _fetch(r, L, a, log):
    from pipeline.stages.fetch import fetch

    fetch(r, L.hf(r.name), L.fetch_record(r.name), hub_cache=a.hub_cache or None)


def _convert(r, L, a, log):
    from pipeline.stages.convert import convert

    convert(r, L.hf(r.name), L.base_gguf(r), L.convert_record(r), log=log, quantized_by=a.quantized_by)


def _convert_awq(r, L, a, log):
    from pipeline.stages.convert import convert

    convert(r, L.hf_awq(r.name), L.awq_gguf(r), L.awq_convert_record(r), log=log, quantized_by=a.quantized_by)


def _convert_mtp(r, L, a, log):
    from pipeline.stages.convert import convert_mtp

    convert_mtp(r, L.hf(r.name), L.mtp_gguf(r), L.mtp_record(r), log=log, quantized_by=a.quantized_by)


def _awq(r, L, a, log):
    from pipeline.stages.awq import run_awq

    run_awq(r, L.hf(r.name), L.hf_awq(r.name), L.awq_record(r.name), threads=a.threads)


def _imatrix(r, L, a, log):
    from pipeline.stages.imatrix import imatrix

    imatrix(r, a.base, L.source_gguf(r, a.base), L.imatrix(r.name, a.base), L.imatrix_record(r.name, a.base),
            log=log, threads=a.threads)


def _quantize(r, L, a, log):
    from pipeline.stages.quantize import quantize

    inputs = L.quant_inputs(r, a.quant)
    quantize(r, a.quant, inputs["base"], L.quant(r, a.quant), L.quant_record(r.name, a.quant), log=log,
             threads=a.threads, imatrix=inputs.get("imatrix"))


def _eval_base(r, L, a, log):
    from pipeline.stages.evaluate import eval_base

    es = r.eval_set(a.eval_set)
    eval_base(r.name, es, L.base_gguf(r), L.base_logits(r.name, es.name), L.base_record(r.name, es.name),
              threads=a.threads, log=log)


def _eval(r, L, a, log):
    from pipeline.stages.evaluate import eval_quant

    es = r.eval_set(a.eval_set)
    eval_quant(r.name, a.quant, es, L.quant(r, a.quant), L.base_logits(r.name, es.name),
               L.base_record(r.name, es.name), L.eval_record(r.name, es.name, a.quant), threads=a.threads, log=log,
               base_gguf=L.base_gguf(r))


def _conformance(r, L, a, log):
    from pipeline.stages.conformance import run_stage

    run_stage(r, L, threads=a.threads, log=log)


def _bench(r, L, a, log):
    from pipeline.stages.bench import bench

    bench(L.main_gguf(r, a.quant), L.bench_record(r.name, a.quant), threads=a.threads, log=log)


def _split(r, L, a, log):
    from pipeline.stages.split import split

    split(r, a.quant, L.quant(r, a.quant), L.split_dir(r.name, a.quant), log=log)


def _vocab(r, L, a, log):
    from pipeline.stages.draft import vocab_check

    vocab_check(L.main_gguf(r, a.quant), L.draft_gguf(r, a.draft_quant),
                L.vocab_record(r.name, a.quant, a.draft_quant))


def _acceptance(r, L, a, log):
    from pipeline.stages.draft import acceptance

    d = r.draft
    acceptance(L.main_gguf(r, a.quant), L.draft_gguf(r, a.draft_quant), L.vocab_record(r.name, a.quant, a.draft_quant),
               d.eval_text, d.n_max, d.prompts, d.n_predict, L.spec_record(r.name, a.quant, a.draft_quant),
               threads=a.threads, log=log)


def _agreement(r, L, a, log):
    from pipeline.stages.draft import agreement

    es = r.eval_sets[0]
    agreement(r.name, L.draft_gguf(r, a.draft_quant), L.base_gguf(r), es, L.base_logits(r.name, es.name),
              L.base_record(r.name, es.name), L.agreement_record(r.name, a.draft_quant), threads=a.threads, log=log)


def _publish(r, L, a, log):
    from pipeline.stages.publish import publish

    publish(r, L)


def _gate(r, L, a, log):
    from pipeline.stages.publish import check_gates

    check_gates(L.manifest(r.name), L.gate_ok(r.name))
    print(f"gates passed: {r.name}")


# Every stage, by the name of its rule (rules/*.smk). Adding a stage: an entry here, its paths in
# pipeline/layout.py, its rule in rules/<domain>.smk (docs/architecture.md, "Adding a stage").
STAGES: dict[str, Stage] = {
    "fetch": Stage("fetch", _fetch, "fetch", "--hub-cache {params.hub_cache:q}", output="log"),
    "awq": Stage("awq", _awq, "awq", "--threads {params.threads}", output="log"),
    "convert": Stage("convert", _convert, "convert-{outtype}", "--quantized-by {params.quantized_by:q}"),
    "convert_awq": Stage("convert --awq", _convert_awq, "convert-{outtype}-awq", "--quantized-by {params.quantized_by:q}"),
    "convert_mtp": Stage("convert-mtp", _convert_mtp, "convert-mtp-{outtype}", "--quantized-by {params.quantized_by:q}"),
    "imatrix": Stage("imatrix", _imatrix, "imatrix-{base}", "--base {wildcards.base} --threads {params.threads}"),
    "quantize": Stage("quantize", _quantize, "quantize-{quant}", "--quant {wildcards.quant:q} --threads {threads}"),
    "eval_base": Stage("eval-base", _eval_base, "eval-{es}-base", "--eval-set {wildcards.es:q} --threads {threads}"),
    "eval": Stage("eval", _eval, "eval-{es}-{quant}",
                  "--eval-set {wildcards.es:q} --quant {wildcards.quant:q} --threads {threads}"),
    "conformance": Stage("conformance", _conformance, "conformance", "--threads {params.threads}"),
    "bench": Stage("bench", _bench, "bench-{bkey}", "--quant {wildcards.bkey:q} --threads {params.threads}"),
    "split": Stage("split", _split, "split-{skey}", "--quant {wildcards.skey:q}"),
    "vocab_check": Stage("vocab", _vocab, "vocab-{mkey}--{dkey}", "--quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q}",
                         output="log"),
    "acceptance": Stage("acceptance", _acceptance, "acceptance-{mkey}--{dkey}",
                        "--quant {wildcards.mkey:q} --draft-quant {wildcards.dkey:q} --threads {params.threads}"),
    "agreement": Stage("agreement", _agreement, "agreement-{dkey}", "--draft-quant {wildcards.dkey:q} --threads {params.threads}"),
    "publish": Stage("publish", _publish, "publish", output="log"),
    "gate": Stage("gate", _gate, "gate", output="tee"),
}


def stage_for(args) -> str:
    """The registry key of a ``ggufpipe stage`` command line (``convert --awq``: ``convert_awq``)."""
    cli = f"{args.stage} --awq" if args.awq else args.stage
    for key, st in STAGES.items():
        if st.cli == cli:
            return key
    raise PipelineError(f"stage {cli}: no such stage")


def cmd_stage(args) -> None:
    """One stage of one recipe (:data:`STAGES`); every path comes from the layout (pipeline/layout.py)."""
    from pipeline.layout import Layout

    recipe = _recipe(args.recipe, args.name)
    L = Layout(Path(args.artifacts), Path(args.work))
    st = STAGES[stage_for(args)]
    wildcards = {"outtype": recipe.outtype.upper(), "base": args.base, "quant": args.quant, "bkey": args.quant,
                 "skey": args.quant, "mkey": args.quant, "dkey": args.draft_quant, "es": args.eval_set}
    st.run(recipe, L, args, L.log(recipe.name, st.log.format(**wildcards)))


def cmd_validate(args) -> None:
    from pipeline.recipe import load_recipe, load_recipes
    from pipeline.tools import find_toolchain

    exe = str(find_toolchain().tool("llama-quantize"))
    paths = [Path(p) for p in args.recipes] or [Path("recipes")]
    recipes = []
    for p in paths:
        recipes += load_recipes(p, exe) if p.is_dir() else [load_recipe(p, exe)]
    names: dict[str, Path] = {}
    for r in recipes:
        if r.name in names and names[r.name] != r.path:
            raise PipelineError(f"{r.path}: name: {r.name!r} is already used by {names[r.name]}")
        names[r.name] = r.path
        print(f"ok  {r.path}: {r.name} ({r.outtype}; {', '.join(q.key for q in r.quants)})")


def cmd_info(args) -> None:
    from pipeline.fsutil import sha256_file
    from pipeline.gguf import read_header

    facts = read_header(args.gguf).facts(sha256_file(args.gguf))  # standard library only (also on devices)
    print(json.dumps(facts.as_dict(), indent=2))


def cmd_verify(args) -> None:
    from pipeline.distribution.verify import verify

    for path in args.files:
        print(verify(path, manifest=args.manifest))


def cmd_clean_logits(args) -> None:
    from pipeline.stages.evaluate import clean_logits

    gone = clean_logits(Path(args.work), args.names, dry_run=args.dry_run)
    for path, size in gone:
        print(f"{'would empty' if args.dry_run else 'emptied'} {path} ({size / 1e6:.1f} MB)")
    print(f"{sum(s for _, s in gone) / 1e6:.1f} MB in {len(gone)} base logits file(s)"
          + (" would be freed" if args.dry_run else " freed"))


def cmd_dvc_matrix(args) -> None:
    from pipeline.distribution.dvc import write_matrix

    m = write_matrix(args.recipes, args.out, check=args.check)
    print(f"{args.out}: {len(m['recipes'])} recipe stage(s), {len(m['ggufs'])} GGUF stage(s)"
          + (" (up to date)" if args.check else ""))


def cmd_dvc_link(args) -> None:
    from pipeline.distribution.dvc import link
    from pipeline.layout import Layout

    print(link(args.name, args.file, args.stage, Layout(Path(args.artifacts), Path(args.work)), args.lock))


def cmd_hub_publish(args) -> None:
    """Upload a built artifact folder to the recipe's Hugging Face repo (pipeline/distribution/hub.py); --dry-run: plan only."""
    from pipeline.distribution.hub import hub_publish, plan_markdown
    from pipeline.layout import Layout
    from pipeline.recipe import load_recipe

    recipe = load_recipe(args.recipe)  # quant types were checked by the build; the manifest pins the recipe
    _desc, rec = hub_publish(recipe, Layout(Path(args.artifacts), Path(args.work)), dry_run=args.dry_run,
                             show=lambda d: print(json.dumps(d, indent=2) if args.json else plan_markdown(d), flush=True))
    if rec is None:
        print("dry run: nothing uploaded", file=sys.stderr)
    else:
        print(f"committed {rec['commit_oid']} to {rec['repo']} (branch {rec['revision']}): {rec['commit_url']}",
              file=sys.stderr)


def cmd_build(args) -> None:
    snakefile = Path(__file__).resolve().parent.parent / "Snakefile"
    cmd = [sys.executable, "-m", "snakemake", "--snakefile", str(snakefile), "--cores", str(args.cores)]
    if args.recipes:
        cmd += ["--config", f"recipes={','.join(args.recipes)}"]
    cmd += args.snakemake_args
    raise SystemExit(subprocess.call(cmd))


def cmd_ci(args) -> None:
    """Build and judge the recipes changed since ``--base`` (pipeline/distribution/ci.py); exit 0, 1 (a gate or
    check failed) or 2 (refused or could not select: nothing built)."""
    from pipeline.distribution.ci import run_ci

    try:
        code = run_ci(args.base, args.recipes, cores=args.cores, summary=args.summary,
                      snakemake_args=args.snakemake_args, artifacts=args.artifacts, work=args.work)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)


def cmd_rebuild_check(args) -> None:
    """Rebuild a recipe from its manifest in a scratch folder and compare SHA256s (pipeline/distribution/rebuild.py)."""
    from pipeline.distribution.rebuild import rebuild_check

    raise SystemExit(rebuild_check(args.manifest, recipe=args.recipe, cores=args.cores, keep=args.keep,
                                   only=args.only, hub_cache=args.hub_cache, out=lambda s: print(s, flush=True)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ggufpipe", description="Model-preparation build pipeline for llama.cpp")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("install-tools", help="build the pinned llama.cpp tools into the cache (no-op when done)")
    p.add_argument("-j", "--jobs", type=int)
    p.set_defaults(func=lambda a: __import__("pipeline.tools_install", fromlist=["install"]).install(a.jobs))

    p = sub.add_parser("setup-demo", help="put the embedded demo model into the local hub cache")
    p.add_argument("--hub-cache", help="hub cache folder (default: the demo cache)")
    p.set_defaults(func=lambda a: print(__import__("pipeline.demo", fromlist=["setup_demo"]).setup_demo(
        Path(a.hub_cache) if a.hub_cache else None)))

    p = sub.add_parser("validate", help="validate recipes (default: recipes/)")
    p.add_argument("recipes", nargs="*")
    p.set_defaults(func=cmd_validate)

    p = sub.add_parser("build", help="run the Snakemake workflow")
    p.add_argument("--cores", default="all")
    p.add_argument("recipes", nargs="*", help="recipe files or folders (default: recipes/)")
    p.add_argument("--snakemake-args", nargs=argparse.REMAINDER, default=[])
    p.set_defaults(func=cmd_build)

    p = sub.add_parser("clean-logits", help="empty the base logits of finished builds (recomputed only when an eval needs them)")
    p.add_argument("names", nargs="*", help="recipe names (default: all under --work)")
    p.add_argument("--work", default="work")
    p.add_argument("--dry-run", action="store_true")
    p.set_defaults(func=cmd_clean_logits)

    p = sub.add_parser("dvc-matrix", help="write dvc-matrix.yaml (the DVC stages) from the recipes")
    p.add_argument("--recipes", default="recipes")
    p.add_argument("--out", default="dvc-matrix.yaml")
    p.add_argument("--check", action="store_true", help="fail when the file is out of date instead of writing it")
    p.set_defaults(func=cmd_dvc_matrix)

    p = sub.add_parser("dvc-link", help="a gguf@ DVC stage: publish one GGUF as its manifest says")
    p.add_argument("--name", required=True)
    p.add_argument("--file", required=True)
    p.add_argument("--stage", required=True, help="the DVC stage name (its dvc.lock entry is dropped on rejection)")
    p.add_argument("--artifacts", default="artifacts")
    p.add_argument("--work", default="work")
    p.add_argument("--lock", default="dvc.lock")
    p.set_defaults(func=cmd_dvc_link)

    p = sub.add_parser("ci", help="build and gate the recipes changed since a base git ref; markdown summary")
    p.add_argument("--base", default="origin/main", help="git ref to compare with (default: origin/main)")
    p.add_argument("--recipes", default="recipes", help="recipe folder (default: recipes)")
    p.add_argument("--cores", default="all")
    p.add_argument("--summary", help="also write the markdown summary to this file (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root (default: work)")
    p.add_argument("--snakemake-args", nargs=argparse.REMAINDER, default=[])
    p.set_defaults(func=cmd_ci)

    p = sub.add_parser("rebuild-check", help="rebuild a recipe from its manifest in a scratch folder (never "
                                             "artifacts/ or work/) and compare every GGUF's SHA256 and the manifest")
    p.add_argument("manifest", help="artifacts/<name>/manifest.json")
    p.add_argument("--recipe", help="the recipe file (default: recipes/<recipe.file> of the manifest's project)")
    p.add_argument("--cores", default="all", help="Snakemake --cores for the rebuild (default: all)")
    p.add_argument("--keep", metavar="DIR", help="rebuild in DIR (new or empty) and keep it (default: a temporary "
                                                 "folder, removed)")
    p.add_argument("--only", nargs="+", metavar="KEY", help="rebuild and compare only these files (quant keys, "
                                                            "or the base type e.g. F16); the manifest is not compared")
    p.add_argument("--hub-cache", help="hub cache holding the source commit (default: $HF_HUB_CACHE, "
                                       "huggingface_hub's cache, the demo cache)")
    p.set_defaults(func=cmd_rebuild_check)

    p = sub.add_parser("info", help="print facts of a GGUF file")
    p.add_argument("gguf")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("verify", help="check GGUF files (or the folder / any shard of a split file) against their "
                                      "manifest")
    p.add_argument("files", nargs="+", metavar="PATH")
    p.add_argument("--manifest", help="manifest.json (default: the one beside each file or split folder)")
    p.set_defaults(func=cmd_verify)

    p = sub.add_parser("hub-publish", help="upload a built recipe's artifact folder to its Hugging Face repo "
                                           "(`publish:` section) in one commit; --dry-run prints the plan")
    p.add_argument("--recipe", required=True)
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root, for the upload record (default: work)")
    p.add_argument("--dry-run", action="store_true", help="check the folder and print the plan; no network")
    p.add_argument("--json", action="store_true", help="print the plan as JSON (default: a markdown table)")
    p.set_defaults(func=cmd_hub_publish)

    p = sub.add_parser("stage", help="run one stage of one recipe (used by the Snakefile)")
    p.add_argument("stage", choices=list(dict.fromkeys(st.cli.split()[0] for st in STAGES.values())))
    p.add_argument("--recipe", required=True)
    p.add_argument("--name", help="recipe name (default: the file's; `<name>-draft` selects its draft)")
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root (default: work)")
    p.add_argument("--quant", help="quant key (TYPE[_VARIANT]); for bench also the outtype; for split any model "
                                   "file's key (also the outtype or mtp-<OUTTYPE>_MTP)")
    p.add_argument("--draft-quant", help="draft quant key (or `gguf` for a given draft file)")
    p.add_argument("--eval-set")
    p.add_argument("--base", choices=["plain", "awq"], help="imatrix: the base GGUF (plain F16 or AWQ-scaled)")
    p.add_argument("--awq", action="store_true", help="convert: the AWQ-scaled weights")
    p.add_argument("--threads", type=int, default=2)
    # nargs="?": the Snakefile passes an empty value when no hub cache is configured
    p.add_argument("--hub-cache", nargs="?", const=None, default=os.environ.get("HF_HUB_CACHE"))
    p.add_argument("--quantized-by", default="ggufpipe")
    p.set_defaults(func=cmd_stage)

    args = ap.parse_args(argv)
    try:
        args.func(args)
    except PipelineError as exc:
        _note_failure(args, str(exc))
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:
        if exc.errno not in ENVIRONMENT_ERRNOS:
            _note_failure(args, f"{type(exc).__name__}: {exc}")
            raise
        # the machine, not the pipeline: a full disk, a read-only or forbidden folder. One line, no traceback.
        msg = f"{exc.filename}: {exc.strerror}" if exc.filename else str(exc.strerror or exc)
        _note_failure(args, msg)
        print(f"error: {msg}", file=sys.stderr)
        return 1
    except Exception as exc:
        _note_failure(args, f"{type(exc).__name__}: {exc}")
        raise
    return 0


def _note_failure(args, message: str) -> None:
    """A failing stage tells `ggufpipe ci` what failed (only when it runs under it)."""
    if args.cmd == "stage" and os.environ.get("GGUFPIPE_CI_ERRORS"):
        from pipeline.distribution.ci_summary import note_stage_failure

        note_stage_failure(args, message)


if __name__ == "__main__":
    sys.exit(main())
