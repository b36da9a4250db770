"""``ggufpipe stage``: one stage of one recipe, and the stage registry (:data:`STAGES`) the rules of rules/*.smk are
built from (pipeline/workflow.py ``stage_shell``, ``stage_log``): one entry per rule, with the entry function it calls."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from pipeline.errors import PipelineError

FLAVOURS = ("plain", "plain-imatrix", "awq", "awq-imatrix")  # what a mix is measured on (Quant.flavour)


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
             threads=a.threads, imatrix=inputs.get("imatrix"), mix=(inputs["map"], inputs["layout"]) if "map" in inputs
             else None)


def _sensitivity(r, L, a, log):
    from pipeline.stages.mix.sensitivity import sensitivity

    inputs = L.sensitivity_inputs(r, a.flavour)
    sensitivity(r, a.flavour, inputs["base"], inputs["ref"], L.sensitivity(r.name, a.flavour),
                L.sensitivity_record(r.name, a.flavour), L.sensitivity_dir(r.name, a.flavour),
                imatrix=inputs.get("imatrix"), threads=a.threads, log=log)


def _solve(r, L, a, log):
    from pipeline.stages.mix.solve import solve

    inputs = L.solve_inputs(r, a.quant)
    solve(r, a.quant, inputs["sensitivity"], inputs["base"], L.mix_map(r.name, a.quant), L.mix_layout(r.name, a.quant),
          imatrix=inputs.get("imatrix"), log=log)


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


def _device_slice(r, L, a, log):
    from pipeline.stages.device_slice import device_slice

    es = r.eval_sets[0]
    device_slice(r.name, es, r.device_slice, L.base_gguf(r), L.base_logits(r.name, es.name),
                 L.base_record(r.name, es.name), L.device_slice(r.name), L.device_slice_record(r.name), threads=a.threads,
                 log=log)


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

    vocab_check(L.main_gguf(r, a.quant), L.draft_gguf(r, a.draft_quant, a.quant),
                L.vocab_record(r.name, a.quant, a.draft_quant))


def _acceptance(r, L, a, log):
    from pipeline.stages.draft import acceptance

    d = r.draft
    # MTP heads inside the main file (mtp: keep): no -md
    draft = None if d.mtp and r.mtp != "separate" else L.draft_gguf(r, a.draft_quant, a.quant)
    acceptance(L.main_gguf(r, a.quant), draft, L.vocab_record(r.name, a.quant, a.draft_quant),
               d.eval_text, d.n_max, d.prompts, d.n_predict, L.spec_record(r.name, a.quant, a.draft_quant),
               threads=a.threads, log=log, spec_type=d.spec_type)


def _agreement(r, L, a, log):
    from pipeline.stages.draft import agreement

    if r.draft.mtp:
        raise PipelineError(f"{r.path}: draft.mtp: the MTP heads have no top-1 agreement stage (no logits of their own "
                            "over a text)")
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
    "sensitivity": Stage("sensitivity", _sensitivity, "sensitivity-{flavour}",
                         "--flavour {wildcards.flavour} --threads {params.threads}"),
    "solve": Stage("solve", _solve, "solve-{quant}", "--quant {wildcards.quant:q}"),
    "quantize": Stage("quantize", _quantize, "quantize-{quant}", "--quant {wildcards.quant:q} --threads {threads}"),
    "eval_base": Stage("eval-base", _eval_base, "eval-{es}-base", "--eval-set {wildcards.es:q} --threads {threads}"),
    "eval": Stage("eval", _eval, "eval-{es}-{quant}",
                  "--eval-set {wildcards.es:q} --quant {wildcards.quant:q} --threads {threads}"),
    "device_slice": Stage("device-slice", _device_slice, "device-slice", "--threads {threads}"),
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
                 "skey": args.quant, "mkey": args.quant, "dkey": args.draft_quant, "es": args.eval_set,
                 "flavour": args.flavour}
    st.run(recipe, L, args, L.log(recipe.name, st.log.format(**wildcards)))


def register(sub) -> None:
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
    p.add_argument("--flavour", choices=FLAVOURS, help="sensitivity: the base and importance matrix measured")
    p.add_argument("--threads", type=int, default=2)
    # nargs="?": the Snakefile passes an empty value when no hub cache is configured
    p.add_argument("--hub-cache", nargs="?", const=None, default=os.environ.get("HF_HUB_CACHE"))
    p.add_argument("--quantized-by", default="ggufpipe")
    p.set_defaults(func=cmd_stage)
