"""``ggufpipe stage``: one stage of one recipe, as the Snakefile's rules run it. The stage names, their flags and, when
a stage is run by hand, its paths all come from the stages' declarations (:func:`pipeline.stages.registry`)."""

from __future__ import annotations

import os
from pathlib import Path

from pipeline.bounds import THREADS
from pipeline.errors import PipelineError
from pipeline.layout import Layout, key_arg, recipe_name_arg
from pipeline.recipe import load_recipe
from pipeline.stagedef import WILDCARD_FLAGS, Job, Stage, parse_io
from pipeline.stages import registry
from pipeline.tools import find_toolchain


def _recipe(path: str, name: str | None = None):
    """The recipe in ``path``; ``name`` may select its derived draft recipe (``<name>-draft``)."""
    recipe = load_recipe(path, str(find_toolchain().tool("llama-quantize")))
    if name and name != recipe.name:
        if name == recipe.draft_name and recipe.draft_recipe() is not None:
            return recipe.draft_recipe()
        raise PipelineError(f"{path}: defines no recipe named {name!r}")
    return recipe


def stage_named(cli: str) -> Stage:
    for st in registry().values():
        if st.cli == cli:
            return st
    raise PipelineError(f"stage {cli}: no such stage")


def job_for(st: Stage, recipe, layout: Layout, args) -> Job:
    """The job of ``args``: the paths Snakemake resolved (``--in``/``--out``/``--log``), or, run by hand, the
    declaration's own for these wildcards."""
    wc = {"name": recipe.name}
    for w in st.wildcards:
        flag = WILDCARD_FLAGS[w]
        value = getattr(args, flag.replace("-", "_"))
        if value is None and w == "outtype":
            value = recipe.base_key
        if value is None:
            raise PipelineError(f"ggufpipe stage {st.cli}: --{flag} is required")
        wc[w] = value
    inputs = parse_io(args.inp) if args.inp else st.input_paths(recipe, wc, layout)
    outputs = parse_io(args.out) if args.out else {k: v.format(**wc) for k, v in st.patterns(layout).items()}
    log = Path(args.log) if args.log else layout.log(recipe.name, st.log.format(**wc))
    options = {o: getattr(args, o) for o in st.options}
    return Job(recipe, layout, wc, inputs, outputs, log, threads=args.threads, options=options)


def cmd_stage(args) -> None:
    """One stage of one recipe (its declaration in pipeline/stages/)."""
    st = stage_named(args.stage)
    recipe = _recipe(args.recipe, args.name)
    layout = Layout(Path(args.artifacts), Path(args.work))
    st.run(job_for(st, recipe, layout, args))


def register(sub) -> None:
    p = sub.add_parser("stage", help="run one stage of one recipe (used by the Snakefile)")
    p.add_argument("stage", choices=[st.cli for st in registry().values()])
    p.add_argument("--recipe", required=True)
    p.add_argument("--name", type=recipe_name_arg,
                   help="recipe name (default: the file's; `<name>-draft` selects its draft)")
    p.add_argument("--artifacts", default="artifacts", help="artifact root (default: artifacts)")
    p.add_argument("--work", default="work", help="work root (default: work)")
    p.add_argument("--quant", type=key_arg, help="quant key (TYPE[_VARIANT]); for bench also the outtype; for split "
                                                 "any model file's key (also the outtype or mtp-<OUTTYPE>_MTP)")
    p.add_argument("--draft-quant", type=key_arg, help="draft quant key (or `gguf` for a given draft file)")
    p.add_argument("--eval-set", type=key_arg)
    p.add_argument("--base", choices=["plain", "awq"], help="imatrix: the base GGUF (plain F16 or AWQ-scaled)")
    p.add_argument("--flavour", type=key_arg,
                   help="sensitivity: the base and importance matrix measured (plain, awq, …-imatrix)")
    p.add_argument("--outtype", type=key_arg, help="convert: the base file's type (default: the recipe's)")
    p.add_argument("--in", dest="inp", action="append", metavar="NAME=PATH",
                   help="a named input (NAME[]=PATH for each path of a list; default: the stage's declared paths)")
    p.add_argument("--out", action="append", metavar="NAME=PATH", help="a named output (default: the declared paths)")
    p.add_argument("--log", help="the job's log (default: work/<name>/logs/<stage>.log)")
    p.add_argument("--threads", type=THREADS.arg("--threads"), default=2)
    # nargs="?": the Snakefile passes an empty value when no hub cache is configured
    p.add_argument("--hub-cache", nargs="?", const=None, default=os.environ.get("HF_HUB_CACHE"))
    p.add_argument("--quantized-by", default="ggufpipe")
    p.set_defaults(func=cmd_stage)
