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
from pathlib import Path

from .errors import PipelineError

ENVIRONMENT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES}


def _recipe(path: str, name: str | None = None):
    """The recipe in ``path``; ``name`` may select its derived draft recipe (``<name>-draft``)."""
    from .recipe import load_recipe
    from .tools import find_toolchain

    recipe = load_recipe(path, str(find_toolchain().tool("llama-quantize")))
    if name and name != recipe.name:
        if name == recipe.draft_name and recipe.draft_recipe() is not None:
            return recipe.draft_recipe()
        raise PipelineError(f"{path}: defines no recipe named {name!r}")
    return recipe


def cmd_stage(args) -> None:
    """One stage of one recipe; every path comes from the layout (pipeline/layout.py)."""
    from .layout import Layout

    recipe = _recipe(args.recipe, args.name)
    L = Layout(Path(args.artifacts), Path(args.work))
    name, st = recipe.name, args.stage
    if st == "fetch":
        from .fetch import fetch

        fetch(recipe, L.hf(name), L.fetch_record(name), hub_cache=args.hub_cache or None)
    elif st == "convert" and args.awq:
        from .convert import convert

        convert(recipe, L.hf_awq(name), L.awq_gguf(recipe), L.awq_convert_record(recipe),
                log=L.log(name, f"convert-{recipe.outtype.upper()}-awq"), quantized_by=args.quantized_by)
    elif st == "convert":
        from .convert import convert

        convert(recipe, L.hf(name), L.base_gguf(recipe), L.convert_record(recipe),
                log=L.log(name, f"convert-{recipe.outtype.upper()}"), quantized_by=args.quantized_by)
    elif st == "awq":
        from .awq import run_awq

        run_awq(recipe, L.hf(name), L.hf_awq(name), L.awq_record(name), threads=args.threads)
    elif st == "imatrix":
        from .imatrix import imatrix

        imatrix(recipe, args.base, L.source_gguf(recipe, args.base), L.imatrix(name, args.base),
                L.imatrix_record(name, args.base), log=L.log(name, f"imatrix-{args.base}"), threads=args.threads)
    elif st == "convert-mtp":
        from .convert import convert_mtp

        convert_mtp(recipe, L.hf(name), L.mtp_gguf(recipe), L.mtp_record(recipe),
                    log=L.log(name, f"convert-mtp-{recipe.outtype.upper()}"), quantized_by=args.quantized_by)
    elif st == "quantize":
        from .quantize import quantize

        inputs = L.quant_inputs(recipe, args.quant)
        quantize(recipe, args.quant, inputs["base"], L.quant(recipe, args.quant), L.quant_record(name, args.quant),
                 log=L.log(name, f"quantize-{args.quant}"), threads=args.threads, imatrix=inputs.get("imatrix"))
    elif st == "eval-base":
        from .evaluate import eval_base

        es = recipe.eval_set(args.eval_set)
        eval_base(name, es, L.base_gguf(recipe), L.base_logits(name, es.name), L.base_record(name, es.name),
                  threads=args.threads, log=L.log(name, f"eval-{es.name}-base"))
    elif st == "eval":
        from .evaluate import eval_quant

        es = recipe.eval_set(args.eval_set)
        eval_quant(name, args.quant, es, L.quant(recipe, args.quant), L.base_logits(name, es.name),
                   L.base_record(name, es.name), L.eval_record(name, es.name, args.quant), threads=args.threads,
                   log=L.log(name, f"eval-{es.name}-{args.quant}"), base_gguf=L.base_gguf(recipe))
    elif st == "bench":
        from .bench import bench

        bench(L.main_gguf(recipe, args.quant), L.bench_record(name, args.quant), threads=args.threads, log=L.log(name, f"bench-{args.quant}"))
    elif st == "split":
        from .split import split

        split(recipe, args.quant, L.built(name, recipe.file_for(args.quant)), L.split_dir(name, args.quant),
              log=L.log(name, f"split-{args.quant}"))
    elif st == "vocab":
        from .draft import vocab_check

        vocab_check(L.main_gguf(recipe, args.quant), L.draft_gguf(recipe, args.draft_quant),
                    L.vocab_record(name, args.quant, args.draft_quant))
    elif st == "acceptance":
        from .draft import acceptance

        d = recipe.draft
        acceptance(L.main_gguf(recipe, args.quant), L.draft_gguf(recipe, args.draft_quant),
                   L.vocab_record(name, args.quant, args.draft_quant), d.eval_text, d.n_max, d.prompts, d.n_predict,
                   L.spec_record(name, args.quant, args.draft_quant), threads=args.threads,
                   log=L.log(name, f"acceptance-{args.quant}--{args.draft_quant}"))
    elif st == "agreement":
        from .draft import agreement

        es = recipe.eval_sets[0]
        agreement(name, L.draft_gguf(recipe, args.draft_quant), L.base_gguf(recipe), es, L.base_logits(name, es.name),
                  L.base_record(name, es.name), L.agreement_record(name, args.draft_quant), threads=args.threads,
                  log=L.log(name, f"agreement-{args.draft_quant}"))
    elif st == "conformance":
        from .conformance import run_stage

        run_stage(recipe, L, threads=args.threads)
    elif st == "publish":
        from .manifest import publish

        publish(recipe, L)
    elif st == "gate":
        from .manifest import check_gates

        check_gates(L.manifest(name), L.gate_ok(name))
        print(f"gates passed: {name}")


def cmd_validate(args) -> None:
    from .recipe import load_recipe, load_recipes
    from .tools import find_toolchain

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
    from .fsutil import sha256_file
    from .gguf import read_header

    facts = read_header(args.gguf).facts(sha256_file(args.gguf))  # standard library only (also on devices)
    print(json.dumps(facts.as_dict(), indent=2))


def cmd_verify(args) -> None:
    from .verify import verify

    for path in args.files:
        print(verify(path, manifest=args.manifest))


def cmd_clean_logits(args) -> None:
    from .evaluate import clean_logits

    gone = clean_logits(Path(args.work), args.names, dry_run=args.dry_run)
    for path, size in gone:
        print(f"{'would empty' if args.dry_run else 'emptied'} {path} ({size / 1e6:.1f} MB)")
    print(f"{sum(s for _, s in gone) / 1e6:.1f} MB in {len(gone)} base logits file(s)"
          + (" would be freed" if args.dry_run else " freed"))


def cmd_dvc_matrix(args) -> None:
    from .dvcstages import write_matrix

    m = write_matrix(args.recipes, args.out, check=args.check)
    print(f"{args.out}: {len(m['recipes'])} recipe stage(s), {len(m['ggufs'])} GGUF stage(s)"
          + (" (up to date)" if args.check else ""))


def cmd_dvc_link(args) -> None:
    from .dvcstages import link
    from .layout import Layout

    print(link(args.name, args.file, args.stage, Layout(Path(args.artifacts), Path(args.work)), args.lock))


def cmd_hub_publish(args) -> None:
    """Upload a built artifact folder to the recipe's Hugging Face repo (pipeline/hub.py); --dry-run: plan only."""
    from .hub import hub_publish, plan_markdown
    from .layout import Layout
    from .recipe import load_recipe

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
    """Build and judge the recipes changed since ``--base`` (pipeline/ci.py); exit 0, 1 (a gate or
    check failed) or 2 (refused or could not select: nothing built)."""
    from .ci import run_ci

    try:
        code = run_ci(args.base, args.recipes, cores=args.cores, summary=args.summary,
                      snakemake_args=args.snakemake_args, artifacts=args.artifacts, work=args.work)
    except PipelineError as exc:
        print(f"error: {exc}", file=sys.stderr)
        code = 2
    raise SystemExit(code)


def cmd_rebuild_check(args) -> None:
    """Rebuild a recipe from its manifest in a scratch folder and compare SHA256s (pipeline/rebuild.py)."""
    from .rebuild import rebuild_check

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
    p.add_argument("stage", choices=["fetch", "awq", "convert", "convert-mtp", "imatrix", "quantize", "eval-base",
                                     "eval", "conformance",
                                     "bench", "split", "vocab", "acceptance",
                                     "agreement", "publish", "gate"])
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
        from .ci_summary import note_stage_failure

        note_stage_failure(args, message)


if __name__ == "__main__":
    sys.exit(main())
